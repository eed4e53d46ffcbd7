package postgres

import (
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
)

// rel is public.t (id bigint, n numeric, ok bool, doc jsonb, body text,
// at timestamptz), id the replica identity.
var rel = newRelationKeyed(&pglogrepl.RelationMessage{Namespace: "public", RelationName: "t", Columns: []*pglogrepl.RelationMessageColumn{
	{Flags: 1, Name: "id", DataType: oidInt8}, {Name: "n", DataType: oidNumeric}, {Name: "ok", DataType: oidBool},
	{Name: "doc", DataType: oidJSONB}, {Name: "body", DataType: 25}, {Name: "at", DataType: 1184},
}}, []bool{true, false, false, false, false, false})

func newRelationKeyed(m *pglogrepl.RelationMessage, key []bool) *relation {
	r := newRelation(m)
	r.key = key
	return r
}

func tuple(vals ...any) *pglogrepl.TupleData {
	t := &pglogrepl.TupleData{ColumnNum: uint16(len(vals))}
	for _, v := range vals {
		switch v := v.(type) {
		case nil:
			t.Columns = append(t.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull})
		case byte: // 'u': an unchanged TOAST value
			t.Columns = append(t.Columns, &pglogrepl.TupleDataColumn{DataType: v})
		case string:
			t.Columns = append(t.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: []byte(v)})
		}
	}
	return t
}

func TestRecordsFromPgoutputTuples(t *testing.T) {
	u := pglogrepl.TupleDataTypeToast
	tests := []struct {
		name               string
		op                 source.Op
		oldType            uint8
		old, new           *pglogrepl.TupleData
		key, before, after string
	}{
		{name: "insert: literals for numbers, booleans and json, strings for the rest",
			op: source.Insert, new: tuple("7", "12.50", "t", `{"a": [1, 2]}`, `say "hi"`, "2026-12-01 07:00:00.5+00"),
			key: `{"id":7}`, after: `{"id":7,"n":12.50,"ok":true,"doc":{"a": [1, 2]},"body":"say \"hi\"","at":"2026-12-01 07:00:00.5+00"}`},
		{name: "strings escaped as JSON needs, UTF-8 kept",
			op: source.Insert, new: tuple("9", "1", "t", nil, "tab\there \\ \"q\" \x01 naïve ✓", nil),
			key: `{"id":9}`, after: `{"id":9,"n":1,"ok":true,"doc":null,"body":"tab\there \\ \"q\" \u0001 naïve ✓","at":null}`},
		{name: "NaN and nulls",
			op: source.Insert, new: tuple("8", "NaN", "f", nil, nil, nil),
			key: `{"id":8}`, after: `{"id":8,"n":"NaN","ok":false,"doc":null,"body":null,"at":null}`},
		{name: "update without the old row: an unchanged TOAST value is left out, never null",
			op: source.Update, new: tuple("7", "13", "t", nil, u, nil),
			key: `{"id":7}`, after: `{"id":7,"n":13,"ok":true,"doc":null,"at":null}`},
		{name: "update with the old row (REPLICA IDENTITY FULL): the TOAST value comes from it",
			op: source.Update, oldType: pglogrepl.UpdateMessageTupleTypeOld,
			old: tuple("7", "12", "t", nil, "long", nil), new: tuple("7", "13", "t", nil, u, nil),
			key: `{"id":7}`, before: `{"id":7,"n":12,"ok":true,"doc":null,"body":"long","at":null}`,
			after: `{"id":7,"n":13,"ok":true,"doc":null,"body":"long","at":null}`},
		{name: "update changing the key, the old tuple the key only: an unchanged TOAST value is left out, never null",
			op: source.Update, oldType: pglogrepl.UpdateMessageTupleTypeKey,
			old: tuple("7", nil, nil, nil, nil, nil), new: tuple("8", "13", "t", nil, u, nil),
			key: `{"id":8}`, before: `{"id":7}`, after: `{"id":8,"n":13,"ok":true,"doc":null,"at":null}`},
		{name: "delete with the key only",
			op: source.Delete, oldType: pglogrepl.DeleteMessageTupleTypeKey, old: tuple("7", nil, nil, nil, nil, nil),
			key: `{"id":7}`, before: `{"id":7}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := record(rel, tt.op, tt.oldType, tt.old, tt.new)
			require.NoError(t, err)
			require.Equal(t, "public.t", rec.Table)
			require.Equal(t, tt.op, rec.Op)
			require.Equal(t, tt.key, string(rec.Key))
			require.Equal(t, tt.before, string(rec.Before))
			require.Equal(t, tt.after, string(rec.After))
		})
	}
}

func TestRecordRejectsATupleThatDoesNotFitItsRelation(t *testing.T) {
	_, err := record(rel, source.Insert, 0, nil, tuple("1", "2"))
	require.ErrorContains(t, err, "2 values for 6 columns")
}
