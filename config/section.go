package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Source is a stream's source section. Kind and Tables are common to every
// source; the rest of the section belongs to Kind's adapter, which decodes
// Spec (the whole section) strictly into its own config type. Secrets never
// go here: a credential is named by the environment variable the worker
// reads.
type Source struct {
	Kind string `json:"kind"`
	// Tables the stream reads (empty: what the adapter reads by default).
	Tables []string `json:"tables,omitempty"`
	// Spec is the whole section as given, compact JSON; Kind and Tables
	// are read from it. It is what the section encodes to.
	Spec json.RawMessage `json:"-"`
}

// Sink is a stream's sink section: Kind, and the rest for Kind's adapter.
type Sink struct {
	Kind string `json:"kind"`
	// Spec is the whole section as given, compact JSON.
	Spec json.RawMessage `json:"-"`
}

// MarshalJSON writes the section as given (or, for one built in code with
// no Spec, its kind and tables).
func (s Source) MarshalJSON() ([]byte, error) {
	if len(s.Spec) > 0 {
		return s.Spec, nil
	}
	type common Source
	return json.Marshal(common(s))
}

// UnmarshalJSON keeps the whole section for the adapter and reads the
// common fields; the adapter's Check decodes the rest strictly.
func (s *Source) UnmarshalJSON(b []byte) error {
	spec, err := section(b)
	if err != nil {
		return err
	}
	var common struct {
		Kind   string   `json:"kind"`
		Tables []string `json:"tables,omitempty"`
	}
	if err := json.Unmarshal(spec, &common); err != nil {
		return describeJSONError(err)
	}
	*s = Source{Kind: common.Kind, Tables: common.Tables, Spec: spec}
	return nil
}

// MarshalJSON writes the section as given (or, with no Spec, its kind).
func (s Sink) MarshalJSON() ([]byte, error) {
	if len(s.Spec) > 0 {
		return s.Spec, nil
	}
	type common Sink
	return json.Marshal(common(s))
}

// UnmarshalJSON keeps the whole section for the adapter and reads its kind.
func (s *Sink) UnmarshalJSON(b []byte) error {
	spec, err := section(b)
	if err != nil {
		return err
	}
	var common struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(spec, &common); err != nil {
		return describeJSONError(err)
	}
	*s = Sink{Kind: common.Kind, Spec: spec}
	return nil
}

// section returns a section's JSON compacted, or an error when it is not
// an object (null is the zero section).
func section(b []byte) (json.RawMessage, error) {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil, nil
	}
	if len(b) == 0 || b[0] != '{' {
		return nil, errors.New("wrong type: want a JSON object")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// SourceSection returns the source section that v (an adapter's config
// struct) encodes to, as a stream config would carry it.
func SourceSection(v any) (Source, error) {
	var s Source
	err := encodeSection(v, &s)
	return s, err
}

// SinkSection returns the sink section that v encodes to.
func SinkSection(v any) (Sink, error) {
	var s Sink
	err := encodeSection(v, &s)
	return s, err
}

func encodeSection(v any, into json.Unmarshaler) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return into.UnmarshalJSON(b)
}

// Kind is one adapter's part in a stream config: the type its section
// decodes into and the checks of it. Adapters register a Kind of source or
// of sink (RegisterSource, RegisterSink) from one place, the wiring of the
// programs that decode configs (package adapters); this package names no
// adapter.
type Kind struct {
	// Name is the section's "kind".
	Name string
	// Config is a zero value of the adapter's section type (a struct whose
	// JSON fields are the section's, "kind" included), for references
	// that list every field.
	Config any
	// Check decodes a section strictly into the adapter's type and
	// validates it. A *FieldError names the field within the section
	// ("address"); the stream's check puts "source." or "sink." before it.
	Check func(section []byte) error
	// Snapshot: the source can start a stream with a copy of its tables
	// (startFrom "snapshot").
	Snapshot bool
}

// Checker is a Kind's Check made from an adapter's parser of its section.
func Checker[T any](parse func(section []byte) (T, error)) func(section []byte) error {
	return func(section []byte) error {
		_, err := parse(section)
		return err
	}
}

var kinds struct {
	sync.RWMutex
	source, sink map[string]Kind
}

// RegisterSource makes a source kind known to Decode. A name registered
// twice is a programming error of the wiring, reported by panicking at
// start, as database/sql does for drivers.
func RegisterSource(k Kind) { register(&kinds.source, k) }

// RegisterSink makes a sink kind known to Decode.
func RegisterSink(k Kind) { register(&kinds.sink, k) }

func register(m *map[string]Kind, k Kind) {
	kinds.Lock()
	defer kinds.Unlock()
	if *m == nil {
		*m = map[string]Kind{}
	}
	if _, dup := (*m)[k.Name]; dup || k.Name == "" || k.Check == nil {
		panic(fmt.Sprintf("config: kind %q registered twice, or without a name or a check", k.Name))
	}
	(*m)[k.Name] = k
}

// SourceKinds returns the registered source kinds, by name.
func SourceKinds() map[string]Kind { return registered(kinds.source) }

// SinkKinds returns the registered sink kinds, by name.
func SinkKinds() map[string]Kind { return registered(kinds.sink) }

func registered(m map[string]Kind) map[string]Kind {
	kinds.RLock()
	defer kinds.RUnlock()
	return maps.Clone(m)
}

// checkSection checks a section with its kind's adapter; field is the
// section's name in the stream config.
func checkSection(field, kind string, spec []byte, known map[string]Kind) error {
	k, ok := known[kind]
	if !ok {
		names := slices.Sorted(maps.Keys(known))
		if len(names) == 0 {
			return fieldErr(field+".kind", "%q: this program has no %s adapters", kind, field)
		}
		for i, n := range names {
			names[i] = strconv.Quote(n)
		}
		return fieldErr(field+".kind", "%q: want %s", kind, strings.Join(names, " or "))
	}
	err := k.Check(spec)
	var fe *FieldError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe):
		return &FieldError{Field: join(field, fe.Field), Msg: fe.Msg}
	}
	return fmt.Errorf("%s: %w", field, err)
}

// ErrUnknownKind: a config names a source or sink kind that the program
// reading it has no adapter for.
var ErrUnknownKind = errors.New("unknown kind")

// FieldErr is the error for a bad value of the field at path: what an
// adapter's Check returns, with the path within its section.
func FieldErr(path, format string, args ...any) error { return fieldErr(path, format, args...) }
