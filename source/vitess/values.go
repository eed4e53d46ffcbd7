package vitess

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"
)

// table is a table as its last FIELD event described it: its columns,
// their names encoded as JSON keys once, and which make the primary key.
type table struct {
	name   string
	fields []*querypb.Field
	keys   [][]byte // `"name":` per column
	pk     []bool
	// enumText: ENUM and SET values come as their text (Vitess sends
	// them so since v20), not as numbers.
	enumText bool
	// types: each column's PostgreSQL type (pgType), for typed sinks
	// (source.Record.Types).
	types map[string]string
}

// tableOf reads a FIELD event.
func tableOf(ev *binlogdatapb.FieldEvent) (*table, error) {
	if ev == nil || ev.TableName == "" {
		return nil, fmt.Errorf("FIELD event without a table")
	}
	t := &table{name: ev.TableName, fields: ev.Fields, enumText: ev.EnumSetStringValues,
		keys: make([][]byte, len(ev.Fields)), pk: make([]bool, len(ev.Fields)), types: make(map[string]string, len(ev.Fields))}
	for i, f := range ev.Fields {
		if f == nil || f.Name == "" {
			return nil, fmt.Errorf("FIELD event of %s: column %d has no name", ev.TableName, i)
		}
		name, _ := json.Marshal(f.Name)
		t.keys[i] = append(name, ':')
		t.pk[i] = f.Flags&uint32(querypb.MySqlFlag_PRI_KEY_FLAG) != 0
		t.types[f.Name] = pgType(f, t.enumText)
	}
	return t, nil
}

// rowJSON writes a row image as a JSON object in the table's column
// order; only the columns marked in keep (nil: every column) and, when
// present is set, only those it holds (a partial row image).
func (t *table) rowJSON(row *querypb.Row, present *binlogdatapb.RowChange_Bitmap, keep []bool) (json.RawMessage, error) {
	if len(row.Lengths) != len(t.fields) {
		return nil, fmt.Errorf("row of %s has %d values for %d columns", t.name, len(row.Lengths), len(t.fields))
	}
	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	off := 0
	for i, n := range row.Lengths {
		var v []byte
		null := n < 0
		if !null {
			if int64(off)+n > int64(len(row.Values)) {
				return nil, fmt.Errorf("row of %s: value %d runs past the row's %d bytes", t.name, i, len(row.Values))
			}
			v = row.Values[off : off+int(n)]
			off += int(n)
		}
		if keep != nil && !keep[i] || present != nil && !bit(present, i) {
			continue
		}
		if !first {
			buf.WriteByte(',')
		}
		first = false
		buf.Write(t.keys[i])
		if null {
			buf.WriteString("null")
			continue
		}
		if err := t.value(&buf, t.fields[i], v); err != nil {
			return nil, fmt.Errorf("%s.%s: %w", t.name, t.fields[i].Name, err)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// bit reports whether column i is set in a row change's bitmap.
func bit(b *binlogdatapb.RowChange_Bitmap, i int) bool {
	if int64(i) >= b.Count || i/8 >= len(b.Cols) {
		return false
	}
	return b.Cols[i/8]&(1<<(uint(i)%8)) != 0
}

// value writes one non-NULL value as JSON: numbers as numbers (BIT as the
// unsigned number its bits make), DECIMAL, dates and times and text as
// strings, JSON as itself, ENUM and SET as their text, and binary values
// (BINARY, VARBINARY, BLOB, GEOMETRY, VECTOR) as base64 strings.
func (t *table) value(buf *bytes.Buffer, f *querypb.Field, v []byte) error {
	switch f.Type {
	case querypb.Type_INT8, querypb.Type_UINT8, querypb.Type_INT16, querypb.Type_UINT16,
		querypb.Type_INT24, querypb.Type_UINT24, querypb.Type_INT32, querypb.Type_UINT32,
		querypb.Type_INT64, querypb.Type_UINT64, querypb.Type_YEAR,
		querypb.Type_FLOAT32, querypb.Type_FLOAT64:
		if !isNumber(v) {
			return fmt.Errorf("%q is not a number", v)
		}
		buf.Write(v)
	case querypb.Type_BIT:
		if len(v) > 8 {
			return fmt.Errorf("BIT value of %d bytes", len(v))
		}
		var n uint64
		for _, b := range v {
			n = n<<8 | uint64(b)
		}
		buf.WriteString(strconv.FormatUint(n, 10))
	case querypb.Type_ENUM, querypb.Type_SET:
		if !t.enumText && isNumber(v) {
			buf.Write(v)
			return nil
		}
		writeString(buf, v)
	case querypb.Type_JSON:
		if !json.Valid(v) {
			return fmt.Errorf("JSON value that does not parse")
		}
		return json.Compact(buf, v)
	case querypb.Type_BINARY, querypb.Type_VARBINARY, querypb.Type_BLOB,
		querypb.Type_GEOMETRY, querypb.Type_VECTOR, querypb.Type_RAW:
		buf.WriteByte('"')
		enc := base64.NewEncoder(base64.StdEncoding, buf)
		_, _ = enc.Write(v)
		_ = enc.Close()
		buf.WriteByte('"')
	default: // DECIMAL, dates and times, CHAR, VARCHAR, TEXT, and what else comes as text
		writeString(buf, v)
	}
	return nil
}

// decimalType is a DECIMAL column's type as MySQL names it.
var decimalType = regexp.MustCompile(`^decimal\((\d+),(\d+)\)`)

// pgType is the PostgreSQL type that holds a column's values as value
// writes them (docs/sources/vitess.md#column-types): integers by their
// range (an unsigned one in the next wider type, BIGINT UNSIGNED and BIT
// in numeric(20,0)), FLOAT real, DOUBLE double precision, DECIMAL(p,s)
// numeric(p,s), DATE date, DATETIME and TIMESTAMP timestamp (MySQL's
// have no zone), TIME interval (its range passes a day), YEAR smallint,
// JSON jsonb, ENUM and SET text (numeric before Vitess sent their text),
// binary values text (they are written as base64), every other type text.
func pgType(f *querypb.Field, enumText bool) string {
	switch f.Type {
	case querypb.Type_INT8, querypb.Type_UINT8, querypb.Type_INT16, querypb.Type_YEAR:
		return "smallint"
	case querypb.Type_UINT16, querypb.Type_INT24, querypb.Type_UINT24, querypb.Type_INT32:
		return "integer"
	case querypb.Type_UINT32, querypb.Type_INT64:
		return "bigint"
	case querypb.Type_UINT64, querypb.Type_BIT:
		return "numeric(20,0)"
	case querypb.Type_FLOAT32:
		return "real"
	case querypb.Type_FLOAT64:
		return "double precision"
	case querypb.Type_DECIMAL:
		if m := decimalType.FindStringSubmatch(strings.ToLower(f.ColumnType)); m != nil {
			return "numeric(" + m[1] + "," + m[2] + ")"
		}
		return "numeric"
	case querypb.Type_DATE:
		return "date"
	case querypb.Type_DATETIME, querypb.Type_TIMESTAMP:
		return "timestamp without time zone"
	case querypb.Type_TIME:
		return "interval"
	case querypb.Type_JSON:
		return "jsonb"
	case querypb.Type_ENUM, querypb.Type_SET:
		if !enumText {
			return "bigint"
		}
	}
	return "text"
}

// writeString writes text as a JSON string (bytes that are not UTF-8 become
// U+FFFD, as encoding/json does).
func writeString(buf *bytes.Buffer, v []byte) {
	b, _ := json.Marshal(string(v))
	buf.Write(b)
}

// isNumber reports whether v is a JSON number (what MySQL prints for an
// integer or a float is one; "NaN" or "inf" would not be).
func isNumber(v []byte) bool {
	if len(v) == 0 || !(v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
		return false
	}
	var n json.Number
	return json.Unmarshal(v, &n) == nil
}
