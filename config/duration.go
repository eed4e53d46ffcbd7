package config

import (
	"encoding/json"
	"reflect"
	"time"
)

// Duration is a time.Duration written in JSON as a Go duration string
// ("1s", "500ms", "2h"). Numbers are rejected: "30" is ambiguous.
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

var durationType = reflect.TypeFor[Duration]()

// UnmarshalJSON accepts only a duration string. Its error is a
// json.UnmarshalTypeError so that encoding/json adds the field's path.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return &json.UnmarshalTypeError{Value: string(b), Type: durationType}
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return &json.UnmarshalTypeError{Value: string(b), Type: durationType}
	}
	*d = Duration(v)
	return nil
}
