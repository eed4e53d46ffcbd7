package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

// checkFields reports the first JSON object key that t has no field for,
// with its full path ("batch.maxRecordz"); encoding/json's own error names
// only the key.
func checkFields(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil // the real decode reports syntax errors
	}
	return walkFields(v, t, "")
}

func walkFields(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == sourceType || t == sinkType {
		// A source or sink section belongs to its kind's adapter, whose
		// Parse decodes it strictly (Validate); here only the fields
		// common to every kind (kind, tables) are checked.
		val, ok := v.(map[string]any)
		if !ok {
			if v == nil {
				return nil
			}
			return &FieldError{Field: path, Msg: "wrong type: want a JSON object"}
		}
		fields := jsonFields(t)
		for _, key := range slices.Sorted(maps.Keys(val)) {
			if ft, common := fields[key]; common {
				if err := walkFields(val[key], ft, join(path, key)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	switch val := v.(type) {
	case map[string]any:
		if t.Kind() == reflect.Map {
			if t.Elem().Kind() != reflect.String {
				return nil
			}
			// A map of strings (sink.tables): each value's path names its
			// key, in sorted order so the first error is always the same.
			for _, key := range slices.Sorted(maps.Keys(val)) {
				if err := walkFields(val[key], t.Elem(), fmt.Sprintf("%s[%q]", path, key)); err != nil {
					return err
				}
			}
			return nil
		}
		if t.Kind() != reflect.Struct {
			return wrongType(path, "{…}", "object", t)
		}
		fields := jsonFields(t)
		for key, sub := range val {
			ft, ok := fields[key]
			if !ok {
				return &FieldError{Field: join(path, key), Msg: "unknown field"}
			}
			if err := walkFields(sub, ft, join(path, key)); err != nil {
				return err
			}
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return wrongType(path, "[…]", "array", t)
		}
		for i, sub := range val {
			if err := walkFields(sub, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case string:
		if t != durationType && t != timeType && t.Kind() != reflect.String && t.Kind() != reflect.Interface {
			return wrongType(path, fmt.Sprintf("%q", val), "string", t)
		}
	case json.Number:
		if !numeric(t.Kind()) || t == durationType {
			return wrongType(path, val.String(), "number", t)
		}
	case bool:
		if t.Kind() != reflect.Bool && t.Kind() != reflect.Interface {
			return wrongType(path, fmt.Sprint(val), "bool", t)
		}
	}
	return nil
}

var (
	timeType   = reflect.TypeFor[time.Time]()
	sourceType = reflect.TypeFor[Source]()
	sinkType   = reflect.TypeFor[Sink]()
)

func numeric(k reflect.Kind) bool {
	return k >= reflect.Int && k <= reflect.Float64 || k == reflect.Interface
}

// wrongType is the error for a JSON value (shown) of the wrong kind at
// path, in the words encoding/json's own errors get (describeJSONError).
func wrongType(path, shown, kind string, want reflect.Type) error {
	if want == durationType {
		return &FieldError{Field: path, Msg: fmt.Sprintf("%s: want a duration string such as \"500ms\" or \"2h\"", shown)}
	}
	return &FieldError{Field: path, Msg: fmt.Sprintf("wrong type: got JSON %s, want %s", kind, want)}
}

// jsonFields maps a struct's JSON names to field types (exact names:
// strict input also means exact case).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
