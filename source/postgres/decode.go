package postgres

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
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
// taken from the old tuple when there is one, and otherwise left out of
// after (never written as null).
func record(rel *relation, op source.Op, oldType uint8, old, new *pglogrepl.TupleData) (source.Record, error) {
	rec := source.Record{Table: rel.Namespace + "." + rel.RelationName, Op: op}
	var err error
	keyOnly := oldType == pglogrepl.UpdateMessageTupleTypeKey // same byte as DeleteMessageTupleTypeKey
	if old != nil {
		if rec.Before, err = tupleJSON(rel, old, nil, identity(rel, keyOnly)); err != nil {
			return rec, err
		}
	}
	if new != nil {
		if rec.After, err = tupleJSON(rel, new, old, nil); err != nil {
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
	case oidInt2, oidInt4, oidInt8, oidOID:
		b.Write(text)
		return
	case oidFloat4, oidFloat8, oidNumeric:
		if s := strings.ToLower(string(text)); s != "nan" && !strings.HasSuffix(s, "infinity") {
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
