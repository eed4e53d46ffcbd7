package jsonl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/source"
)

// Line is one stored record as it appears in a data file. Key, Before and
// After hold the line's JSON verbatim ("null" when absent), so
// digest.Hash over them reproduces the source's hash.
type Line struct {
	Stream     string          `json:"stream"`
	Tablet     string          `json:"tablet"`
	Position   string          `json:"position"`
	Table      string          `json:"table"`
	Op         source.Op       `json:"op"`
	Key        json.RawMessage `json:"key"`
	Before     json.RawMessage `json:"before"`
	After      json.RawMessage `json:"after"`
	CommitTime time.Time       `json:"commitTime"`
}

// Record returns the line as a source.Record. A "null" Before or After
// becomes nil, as the source hands them out.
func (l Line) Record() (source.Record, error) {
	pos, err := source.ParseCheckpoint(l.Position)
	if err != nil {
		return source.Record{}, err
	}
	return source.Record{
		Tablet:     l.Tablet,
		Position:   pos,
		CommitTime: l.CommitTime,
		Table:      l.Table,
		Op:         l.Op,
		Key:        nullToNil(l.Key),
		Before:     nullToNil(l.Before),
		After:      nullToNil(l.After),
	}, nil
}

// Hash is the line's record's digest.Hash, as the source computes it.
func (l Line) Hash() uint64 {
	return digest.Hash(digest.Fields{Tablet: l.Tablet, Position: l.Position, Table: l.Table, Op: string(l.Op),
		Key: l.Key, Before: l.Before, After: l.After, CommitTime: l.CommitTime})
}

func nullToNil(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// linePrefix returns the constant start of every line of one tablet, up to
// the position's opening quote, so appendLine does not re-encode it.
func linePrefix(stream, tablet string) []byte {
	b := append([]byte(nil), `{"stream":`...)
	b = appendString(b, stream)
	b = append(b, `,"tablet":`...)
	b = appendString(b, tablet)
	return append(b, `,"position":"`...)
}

// appendLine appends rec as one JSON line, fields in the documented order,
// ending in '\n'. Key, Before and After are copied verbatim after a validity
// check (empty becomes null); only JSON containing a line break is compacted,
// so a line never spans two. A resync's markers are lines like any other
// (table "", key, before and after null, as their records have none). It
// returns ErrBadRecord for an unknown op or invalid JSON, and leaves buf's
// contents up to len(buf) untouched.
func appendLine(buf, prefix []byte, rec *source.Record) ([]byte, error) {
	switch rec.Op {
	case source.Insert, source.Update, source.Delete, source.Read, source.Truncate, source.ResyncBegin, source.ResyncEnd:
	default:
		return buf, fmt.Errorf("%w: position %s: op %q", ErrBadRecord, rec.Position, rec.Op)
	}
	start := len(buf)
	buf = append(buf, prefix...)
	buf = strconv.AppendUint(buf, rec.Position.Term, 10)
	buf = append(buf, '.')
	buf = strconv.AppendUint(buf, rec.Position.Index, 10)
	buf = append(buf, `","table":`...)
	buf = appendString(buf, rec.Table)
	buf = append(buf, `,"op":"`...)
	buf = append(buf, rec.Op...)
	var err error
	for _, f := range [...]struct {
		name, sep string
		raw       json.RawMessage
	}{{"key", `","key":`, rec.Key}, {"before", `,"before":`, rec.Before}, {"after", `,"after":`, rec.After}} {
		buf = append(buf, f.sep...)
		if buf, err = appendRaw(buf, f.raw); err != nil {
			return buf[:start], fmt.Errorf("%w: position %s: %s: %v", ErrBadRecord, rec.Position, f.name, err)
		}
	}
	buf = append(buf, `,"commitTime":"`...)
	buf = rec.CommitTime.UTC().AppendFormat(buf, time.RFC3339Nano)
	return append(buf, "\"}\n"...), nil
}

// appendRaw appends a JSON value verbatim, "null" for empty input, and
// compacted only if it holds a line break.
func appendRaw(buf []byte, raw json.RawMessage) ([]byte, error) {
	if len(raw) == 0 {
		return append(buf, "null"...), nil
	}
	if !json.Valid(raw) {
		return buf, errors.New("invalid JSON")
	}
	if bytes.IndexByte(raw, '\n') < 0 && bytes.IndexByte(raw, '\r') < 0 {
		return append(buf, raw...), nil
	}
	b := bytes.NewBuffer(buf)
	if err := json.Compact(b, raw); err != nil {
		return buf, err
	}
	return b.Bytes(), nil
}

// appendString appends s as a JSON string. Plain printable ASCII, the
// common case for table and tablet names, is copied as is.
func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
			b, _ := json.Marshal(s) // a string always marshals
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}
