package postgres

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"

	"github.com/tabletflow/tabletflow/source"
)

// Type OIDs whose text form is written as a JSON literal; every other type
// is written as a JSON string of PostgreSQL's text form, unchanged.
const (
	oidBool    = 16
	oidInt8    = 20
	oidInt2    = 21
	oidInt4    = 23
	oidOID     = 26
	oidJSON    = 114
	oidFloat4  = 700
	oidFloat8  = 701
	oidNumeric = 1700
	oidJSONB   = 3802
)

// relation is a table's description from the stream, with its column
// names encoded as JSON keys once, and its key columns (read when first
// needed).
type relation struct {
	*pglogrepl.RelationMessage
	names [][]byte // `"name":`
	key   []bool
	// types: each column's type, as format_type names it (read with the
	// key); given to every record of the relation (source.Record.Types).
	types map[string]string
}

func newRelation(m *pglogrepl.RelationMessage) *relation {
	r := &relation{RelationMessage: m, names: make([][]byte, len(m.Columns))}
	for i, c := range m.Columns {
		var b bytes.Buffer
		appendString(&b, []byte(c.Name))
		b.WriteByte(':')
		r.names[i] = b.Bytes()
	}
	return r
}

// record builds a change from pgoutput tuples (text format). The key is
// the columns marked in key (the table's primary key; without one, the
// replica identity's columns); before is the old tuple when the server
// sent one (REPLICA IDENTITY FULL: the whole row; otherwise the identity's
// columns when the key changed, and on a delete); after the new tuple.
// A TOASTed column that did not change arrives without its value: it is
// taken from the old tuple when that is the whole row (REPLICA IDENTITY
// FULL), and otherwise left out of after (never written as null: a
// key-only old tuple, sent when an update changes the key, holds nulls in
// the other columns).
func record(rel *relation, op source.Op, oldType uint8, old, new *pglogrepl.TupleData) (source.Record, error) {
	rec := source.Record{Table: rel.Namespace + "." + rel.RelationName, Op: op, Types: rel.types}
	if op == source.Truncate { // the table only: no key, no rows
		return rec, nil
	}
	var err error
	keyOnly := oldType == pglogrepl.UpdateMessageTupleTypeKey // same byte as DeleteMessageTupleTypeKey
	if old != nil {
		if rec.Before, err = tupleJSON(rel, old, nil, identity(rel, keyOnly)); err != nil {
			return rec, err
		}
	}
	if new != nil {
		fill := old
		if keyOnly {
			fill = nil
		}
		if rec.After, err = tupleJSON(rel, new, fill, nil); err != nil {
			return rec, err
		}
	}
	keyFrom, keyFill := new, old
	if new == nil {
		keyFrom, keyFill = old, nil
	}
	if keyFrom == nil {
		return rec, fmt.Errorf("pgoutput: %s on %s without a tuple", op, rec.Table)
	}
	if rec.Key, err = tupleJSON(rel, keyFrom, keyFill, rel.key); err != nil {
		return rec, err
	}
	return rec, nil
}

// identity marks the replica identity's columns when only they are sent
// (a key-only old tuple), else nil (every column).
func identity(rel *relation, keyOnly bool) []bool {
	if !keyOnly {
		return nil
	}
	out := make([]bool, len(rel.Columns))
	for i, c := range rel.Columns {
		out[i] = c.Flags&1 == 1
	}
	return out
}

// tupleJSON writes a tuple as a JSON object in column order, only the
// columns marked in only (nil: all); unchanged TOAST values are filled
// from fill when it has them, else left out.
func tupleJSON(rel *relation, t, fill *pglogrepl.TupleData, only []bool) (json.RawMessage, error) {
	if len(t.Columns) != len(rel.Columns) {
		return nil, fmt.Errorf("pgoutput: %s.%s: %d values for %d columns", rel.Namespace, rel.RelationName, len(t.Columns), len(rel.Columns))
	}
	var b bytes.Buffer
	b.WriteByte('{')
	n := 0
	for i, col := range rel.Columns {
		if only != nil && (i >= len(only) || !only[i]) {
			continue
		}
		v := t.Columns[i]
		if v.DataType == pglogrepl.TupleDataTypeToast {
			if fill == nil || fill.Columns[i].DataType == pglogrepl.TupleDataTypeToast {
				continue
			}
			v = fill.Columns[i]
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.Write(rel.names[i])
		switch v.DataType {
		case pglogrepl.TupleDataTypeNull:
			b.WriteString("null")
		case pglogrepl.TupleDataTypeText:
			writeValue(&b, col.DataType, v.Data)
		default:
			return nil, fmt.Errorf("pgoutput: column %s: unexpected value kind %q (binary output is not asked for)", col.Name, v.DataType)
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// writeValue writes a column's text form as JSON: booleans and numbers as
// literals (NaN and infinities as strings), json and jsonb as they are,
// everything else as a string of PostgreSQL's text output.
func writeValue(b *bytes.Buffer, oid uint32, text []byte) {
	switch oid {
	case oidBool:
		if string(text) == "t" {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
		return
	case oidInt2, oidInt4, oidInt8, oidOID, oidFloat4, oidFloat8, oidNumeric:
		// Their text form is a JSON number but for NaN and the infinities;
		// anything else (a broken server's) is a string too, never
		// invalid JSON.
		if jsonNumber(text) {
			b.Write(text)
			return
		}
	case oidJSON, oidJSONB:
		if json.Valid(text) {
			b.Write(text)
			return
		}
	}
	appendString(b, text)
}

// jsonNumber reports whether b is a number in JSON's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func jsonNumber(b []byte) bool {
	i := 0
	digits := func() bool {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if !digits() {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	return i == len(b)
}

// appendString writes s as a JSON string: valid UTF-8 as it is but for
// the characters JSON must escape; anything else through encoding/json
// (which replaces invalid bytes).
func appendString(b *bytes.Buffer, s []byte) {
	if !utf8.Valid(s) {
		q, _ := json.Marshal(string(s))
		b.Write(q)
		return
	}
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	start := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b.Write(s[start:i])
		switch c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
		start = i + 1
	}
	b.Write(s[start:])
	b.WriteByte('"')
}

// checkMessage checks that what a pgoutput message's counts and lengths
// claim fits in the message, for the kinds whose pglogrepl decoders trust
// them: those index past the end (a panic) and allocate what a length says
// before reading it (a 10-byte truncate message asks for 16 GiB). The
// other kinds pglogrepl checks itself, as it does each kind byte. The
// layouts are protocol version 1's (the reader asks for it: no streamed
// transactions, so no xid before a change's relation id).
func checkMessage(data []byte) error {
	if len(data) == 0 {
		return errors.New("empty message")
	}
	m := msgReader{b: data[1:], ok: true}
	switch data[0] {
	case 'R': // relation: id, namespace, name, replica identity, columns
		m.take(4)
		m.str()
		m.str()
		m.take(1)
		for n := m.u16(); n > 0 && m.ok; n-- {
			m.take(1) // flags
			m.str()
			m.take(8) // type OID, type modifier
		}
	case 'I': // insert: relation id, 'N', new tuple
		m.take(4)
		m.take(1)
		m.tuple()
	case 'U': // update: relation id, ['K' or 'O', old tuple], 'N', new tuple
		m.take(4)
		if k := m.u8(); k == 'K' || k == 'O' {
			m.tuple()
			m.take(1)
		}
		m.tuple()
	case 'D': // delete: relation id, 'K' or 'O', old tuple
		m.take(4)
		m.take(1)
		m.tuple()
	case 'T': // truncate: relation count, options, relation ids
		n := m.u32()
		m.take(1)
		m.take(4 * n)
	case 'M': // message: flags, LSN, prefix, content length, content
		m.take(9)
		m.str()
		m.take(m.u32())
	}
	if !m.ok {
		return fmt.Errorf("%q message: truncated or with a length past its end (%d bytes)", data[0], len(data))
	}
	return nil
}

// msgReader walks a message's fields; ok turns false, for good, at the
// first one that does not fit.
type msgReader struct {
	b  []byte
	ok bool
}

func (m *msgReader) take(n int) []byte {
	if !m.ok || n < 0 || n > len(m.b) {
		m.ok = false
		return nil
	}
	v := m.b[:n]
	m.b = m.b[n:]
	return v
}

func (m *msgReader) u8() byte {
	if b := m.take(1); m.ok {
		return b[0]
	}
	return 0
}

func (m *msgReader) u16() int {
	if b := m.take(2); m.ok {
		return int(binary.BigEndian.Uint16(b))
	}
	return 0
}

func (m *msgReader) u32() int {
	if b := m.take(4); m.ok {
		return int(binary.BigEndian.Uint32(b))
	}
	return 0
}

// str takes a NUL-terminated string.
func (m *msgReader) str() {
	i := bytes.IndexByte(m.b, 0)
	if i < 0 {
		m.ok = false
		return
	}
	m.take(i + 1)
}

// tuple takes a TupleData: a column count, then per column a kind byte and,
// for a text or binary value, its length and bytes.
func (m *msgReader) tuple() {
	for n := m.u16(); n > 0 && m.ok; n-- {
		if k := m.u8(); k == pglogrepl.TupleDataTypeText || k == pglogrepl.TupleDataTypeBinary {
			m.take(m.u32())
		}
	}
}
