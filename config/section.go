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

// Kind is one adapter's part in a stream config: the type its section
// decodes into and the parser that checks it. Adapters register a Kind of
// source or of sink (RegisterSource, RegisterSink) from one place, the
// wiring of the programs that decode configs (package adapters); this
// package names no adapter.
type Kind struct {
	// Name is the section's "kind".
	Name string
	// Config is a zero value of the adapter's section type (a struct whose
	// JSON fields are the section's, "kind" included), for references
	// that list every field.
	Config any
	// Parse decodes a section strictly into the adapter's type, fills its
	// defaults and validates it. A *FieldError names the field within the
	// section ("address"); InSection puts the section's name before it.
	Parse func(section []byte) (any, error)
	// Snapshot: the source can start a stream with a copy of its tables
	// (startFrom "snapshot").
	Snapshot bool
	// Resync: the source can give one tablet of a running stream a fresh
	// start with a copy of its rows (source.Resyncer).
	Resync bool
	// AdhocSnapshot: the source can copy named tables of a running stream
	// again (source.Snapshotter).
	AdhocSnapshot bool
	// TableChange: the tables a running stream reads can change (the
	// configure command's source.tables; source.TableChanger).
	TableChange bool
	// TablesInClient: the source's client reads a stream's tables from its
	// own section (vitess: it keeps nothing of a stream on its servers),
	// so streams that differ in their tables need a client each; other
	// sources keep a stream's tables on their servers, and one client
	// serves streams with any tables.
	TablesInClient bool
}

// NewKind is the Kind of an adapter whose sections parse into a T.
func NewKind[T any](name string, parse func(section []byte) (T, error)) Kind {
	var zero T
	return Kind{Name: name, Config: zero, Parse: func(section []byte) (any, error) { return parse(section) }}
}

// WithSnapshot is k for a source that can start a stream with a copy of
// its tables (startFrom "snapshot").
func (k Kind) WithSnapshot() Kind {
	k.Snapshot = true
	return k
}

// WithResync is k for a source that can resync one tablet of a running
// stream (source.Resyncer).
func (k Kind) WithResync() Kind {
	k.Resync = true
	return k
}

// WithAdhocSnapshot is k for a source that can copy named tables of a
// running stream again (source.Snapshotter).
func (k Kind) WithAdhocSnapshot() Kind {
	k.AdhocSnapshot = true
	return k
}

// WithTablesInClient is k for a source whose client reads a stream's
// tables from its own section.
func (k Kind) WithTablesInClient() Kind {
	k.TablesInClient = true
	return k
}

// WithTableChange is k for a source whose running streams can change the
// tables they read (source.TableChanger).
func (k Kind) WithTableChange() Kind {
	k.TableChange = true
	return k
}

// WithTables returns the section reading tables instead: Tables and the
// "tables" key of Spec both changed (the rest of Spec as given).
func (s Source) WithTables(tables []string) (Source, error) {
	out := s
	out.Tables = slices.Clone(tables)
	if len(s.Spec) == 0 {
		return out, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(s.Spec, &fields); err != nil {
		return s, fmt.Errorf("source: %w", err)
	}
	b, err := json.Marshal(tables)
	if err != nil {
		return s, err
	}
	fields["tables"] = b
	if out.Spec, err = json.Marshal(fields); err != nil {
		return s, err
	}
	return out, nil
}

// SectionOf returns the section that v (an adapter's config) encodes to:
// a Source or a Sink, as a stream config carries it.
func SectionOf[S Source | Sink](v any) (S, error) {
	var s S
	b, err := json.Marshal(v)
	if err != nil {
		return s, err
	}
	err = any(&s).(json.Unmarshaler).UnmarshalJSON(b)
	return s, err
}

// DropLegacy returns a section without the named keys where they hold a
// zero value ("", 0, false, null, [] or {}): fields that a stream encoded
// by an older tabletflow carries although they were never set (one config
// struct once held every kind's fields), and which the section's adapter
// does not have. A key with a value is kept, so the strict decode names
// it.
func DropLegacy(section []byte, keys ...string) []byte {
	var fields map[string]json.RawMessage
	if json.Unmarshal(section, &fields) != nil {
		return section
	}
	dropped := false
	for _, k := range keys {
		if v, ok := fields[k]; ok && zeroJSON(v) {
			delete(fields, k)
			dropped = true
		}
	}
	if !dropped {
		return section
	}
	b, err := json.Marshal(fields)
	if err != nil {
		return section
	}
	return b
}

func zeroJSON(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case `""`, "0", "false", "null", "[]", "{}":
		return true
	}
	return false
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
	if _, dup := (*m)[k.Name]; dup || k.Name == "" || k.Parse == nil {
		panic(fmt.Sprintf("config: kind %q registered twice, or without a name or a parser", k.Name))
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
	_, err := k.Parse(spec)
	return InSection(field, err)
}

// InSection puts a section's name before the field an error of its
// adapter names ("address" becomes "source.address"), or before an error
// that names none; nil stays nil.
func InSection(section string, err error) error {
	var fe *FieldError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe):
		return &FieldError{Field: join(section, fe.Field), Msg: fe.Msg}
	}
	return fmt.Errorf("%s: %w", section, err)
}

// ErrUnknownKind: a config names a source or sink kind that the program
// reading it has no adapter for.
var ErrUnknownKind = errors.New("unknown kind")

// FieldErr is the error for a bad value of the field at path: what an
// adapter's Check returns, with the path within its section.
func FieldErr(path, format string, args ...any) error { return fieldErr(path, format, args...) }
