package vitess

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"

	"github.com/tabletflow/tabletflow/source"
)

// The events below are built from Vitess's own protobuf types, in the
// order and shape a v24 vttablet's vstreamer sends them.

const pkFlag = uint32(querypb.MySqlFlag_PRI_KEY_FLAG | querypb.MySqlFlag_NOT_NULL_FLAG)

// customerFields: customer(customer_id bigint primary key, email
// varchar, credit decimal(10,2), since date, tags json).
func customerFields() *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_FIELD, FieldEvent: &binlogdatapb.FieldEvent{
		TableName: "customer", Keyspace: "commerce", Shard: "-80", EnumSetStringValues: true,
		Fields: []*querypb.Field{
			{Name: "customer_id", Type: querypb.Type_INT64, Flags: pkFlag},
			{Name: "email", Type: querypb.Type_VARCHAR},
			{Name: "credit", Type: querypb.Type_DECIMAL},
			{Name: "since", Type: querypb.Type_DATE},
			{Name: "tags", Type: querypb.Type_JSON},
		},
	}}
}

// row makes a row image; a nil value is NULL.
func row(values ...any) *querypb.Row {
	r := &querypb.Row{}
	for _, v := range values {
		switch v := v.(type) {
		case nil:
			r.Lengths = append(r.Lengths, -1)
		case string:
			r.Lengths = append(r.Lengths, int64(len(v)))
			r.Values = append(r.Values, v...)
		case []byte:
			r.Lengths = append(r.Lengths, int64(len(v)))
			r.Values = append(r.Values, v...)
		}
	}
	return r
}

func rowEvent(table string, changes ...*binlogdatapb.RowChange) *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_ROW, RowEvent: &binlogdatapb.RowEvent{
		TableName: table, Keyspace: "commerce", Shard: "-80", RowChanges: changes}}
}

func begin() *binlogdatapb.VEvent { return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_BEGIN} }
func gtid(pos string) *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_GTID, Gtid: pos}
}
func commit(ts int64) *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_COMMIT, Timestamp: ts}
}
func heartbeat() *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_HEARTBEAT, Timestamp: 1_800_000_000}
}
func other() *binlogdatapb.VEvent { return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_OTHER} }

// requireJSON compares JSON texts by value.
func requireJSON(t *testing.T, want string, got json.RawMessage) {
	t.Helper()
	if want == "" {
		require.Nil(t, got)
		return
	}
	require.JSONEq(t, want, string(got))
}

func TestAMultiRowTransactionBecomesItsRecordsInOrderWithOneCheckpoint(t *testing.T) {
	from := source.Checkpoint{Term: 56, Index: 1, Opaque: "MariaDB/0-100-56"}
	d := newDecoder("-80", from)
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), customerFields(),
		rowEvent("customer",
			&binlogdatapb.RowChange{After: row("1", "a@x.com", "10.50", "2026-12-01", `{"vip": true}`)},
			&binlogdatapb.RowChange{After: row("2", "b@x.com", nil, nil, nil)}),
		rowEvent("customer", &binlogdatapb.RowChange{Before: row("1", "a@x.com", "10.50", "2026-12-01", `{"vip": true}`),
			After: row("1", "a@y.com", "10.50", "2026-12-01", `{"vip": true}`)}),
		rowEvent("customer", &binlogdatapb.RowChange{Before: row("2", "b@x.com", nil, nil, nil)}),
		gtid("MariaDB/0-100-57"), commit(1_800_000_000),
	}))
	recs, cp := d.take(1000, from)
	require.Equal(t, source.Checkpoint{Term: 57, Index: 4, Opaque: "MariaDB/0-100-57"}, cp)
	require.Len(t, recs, 4)
	want := []struct {
		op                 source.Op
		key, before, after string
	}{
		{source.Insert, `{"customer_id": 1}`, "", `{"customer_id": 1, "email": "a@x.com", "credit": "10.50", "since": "2026-12-01", "tags": {"vip": true}}`},
		{source.Insert, `{"customer_id": 2}`, "", `{"customer_id": 2, "email": "b@x.com", "credit": null, "since": null, "tags": null}`},
		{source.Update, `{"customer_id": 1}`, `{"customer_id": 1, "email": "a@x.com", "credit": "10.50", "since": "2026-12-01", "tags": {"vip": true}}`,
			`{"customer_id": 1, "email": "a@y.com", "credit": "10.50", "since": "2026-12-01", "tags": {"vip": true}}`},
		{source.Delete, `{"customer_id": 2}`, `{"customer_id": 2, "email": "b@x.com", "credit": null, "since": null, "tags": null}`, ""},
	}
	for i, w := range want {
		r := recs[i]
		require.Equal(t, source.Checkpoint{Term: 57, Index: uint64(i + 1)}, r.Position, "record %d: positions are (transactions, ordinal), without the GTID", i)
		require.Zero(t, r.Position.Compare(source.Checkpoint{Term: 57, Index: uint64(i + 1), Opaque: "x"}))
		require.Equal(t, "-80", r.Tablet)
		require.Equal(t, "customer", r.Table)
		require.Equal(t, w.op, r.Op, "record %d", i)
		require.Equal(t, time.Unix(1_800_000_000, 0).UTC(), r.CommitTime)
		requireJSON(t, w.key, r.Key)
		requireJSON(t, w.before, r.Before)
		requireJSON(t, w.after, r.After)
	}
	require.Equal(t, 1, recs[0].Position.Compare(from), "after the checkpoint read from")
	require.Equal(t, 1, cp.Compare(from))
}

func TestAnUpdateOfTheKeyHasTheNewKeyAndTheOldRowInBefore(t *testing.T) {
	d := newDecoder("-80", source.Checkpoint{})
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), customerFields(),
		rowEvent("customer", &binlogdatapb.RowChange{
			Before: row("7", "c@x.com", "1.00", "2026-01-02", nil),
			After:  row("8", "c@x.com", "1.00", "2026-01-02", nil)}),
		gtid("MariaDB/0-100-12"), commit(1_800_000_001),
	}))
	recs, cp := d.take(10, source.Checkpoint{})
	require.Equal(t, "12.1@MariaDB/0-100-12", cp.String())
	require.Len(t, recs, 1)
	require.Equal(t, source.Update, recs[0].Op)
	requireJSON(t, `{"customer_id": 8}`, recs[0].Key)
	requireJSON(t, `{"customer_id": 7, "email": "c@x.com", "credit": "1.00", "since": "2026-01-02", "tags": null}`, recs[0].Before)
	requireJSON(t, `{"customer_id": 8, "email": "c@x.com", "credit": "1.00", "since": "2026-01-02", "tags": null}`, recs[0].After)
}

func TestAHeartbeatOnlyReadHasNoRecordsAndKeepsItsCheckpoint(t *testing.T) {
	from := source.Checkpoint{Term: 57, Index: 4, Opaque: "MariaDB/0-100-57"}
	d := newDecoder("-80", from)
	require.NoError(t, d.add([]*binlogdatapb.VEvent{heartbeat()}))
	require.NoError(t, d.add([]*binlogdatapb.VEvent{heartbeat()}))
	require.True(t, d.beat, "the vttablet is idle")
	recs, cp := d.take(1000, from)
	require.Empty(t, recs)
	require.Equal(t, from, cp, "nothing happened: the checkpoint stays")
}

func TestATransactionOfOtherTablesOrADDLAdvancesAnIdleCheckpoint(t *testing.T) {
	from := source.Checkpoint{Term: 57, Index: 4, Opaque: "MariaDB/0-100-57"}
	d := newDecoder("-80", from)
	// The rows of another table are filtered out; BEGIN, GTID, COMMIT come.
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), gtid("MariaDB/0-100-58"), commit(1)}))
	recs, cp := d.take(1000, from)
	require.Empty(t, recs)
	require.Equal(t, source.Checkpoint{Term: 58, Opaque: "MariaDB/0-100-58"}, cp)
	// A DDL: GTID then DDL.
	require.NoError(t, d.add([]*binlogdatapb.VEvent{gtid("MariaDB/0-100-59"),
		{Type: binlogdatapb.VEventType_DDL, Statement: "alter table customer add column x int"}}))
	recs, cp = d.take(1000, cp)
	require.Empty(t, recs)
	require.Equal(t, "59.0@MariaDB/0-100-59", cp.String())
	// A transaction of ours after them is after them.
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), customerFields(),
		rowEvent("customer", &binlogdatapb.RowChange{After: row("3", "d@x.com", "0.00", "2026-01-01", "[]")}),
		gtid("MariaDB/0-100-60"), commit(2)}))
	recs, next := d.take(1000, cp)
	require.Len(t, recs, 1)
	require.Equal(t, 1, recs[0].Position.Compare(cp))
	require.Equal(t, "60.1@MariaDB/0-100-60", next.String())
}

func TestAStreamAtTheCurrentPositionSaysWhereItStarts(t *testing.T) {
	d := newDecoder("-80", source.Checkpoint{})
	// What a vttablet sends first for the position "current".
	require.NoError(t, d.add([]*binlogdatapb.VEvent{gtid("MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-41"), other()}))
	recs, cp := d.take(1000, source.Checkpoint{})
	require.Empty(t, recs)
	require.Equal(t, source.Checkpoint{Term: 41, Opaque: "MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-41"}, cp)
}

func TestATransactionOverSeveralResponsesComesWholeAndBatchesStopBeforeMax(t *testing.T) {
	from := source.Checkpoint{Term: 10, Opaque: "MariaDB/0-1-10"}
	d := newDecoder("0", from)
	// A large transaction split over three responses, then a small one.
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), customerFields(),
		rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a", "1", "2026-01-01", "1")})}))
	require.Equal(t, 0, d.records(), "nothing before the commit")
	require.NoError(t, d.add([]*binlogdatapb.VEvent{
		rowEvent("customer", &binlogdatapb.RowChange{After: row("2", "b", "1", "2026-01-01", "1")}, &binlogdatapb.RowChange{After: row("3", "c", "1", "2026-01-01", "1")})}))
	require.NoError(t, d.add([]*binlogdatapb.VEvent{gtid("MariaDB/0-1-11"), commit(5),
		begin(), rowEvent("customer", &binlogdatapb.RowChange{After: row("4", "d", "1", "2026-01-01", "1")}), gtid("MariaDB/0-1-12"), commit(6)}))
	require.Equal(t, 4, d.records())
	// max 2: the first transaction (3 records) comes whole, alone.
	recs, cp := d.take(2, from)
	require.Len(t, recs, 3)
	require.Equal(t, "11.3@MariaDB/0-1-11", cp.String())
	recs, cp = d.take(2, cp)
	require.Len(t, recs, 1)
	require.Equal(t, "12.1@MariaDB/0-1-12", cp.String())
}

func TestAPositionThatGoesBackIsRefused(t *testing.T) {
	from := source.Checkpoint{Term: 57, Index: 4, Opaque: "MariaDB/0-100-57"}
	d := newDecoder("-80", from)
	err := d.add([]*binlogdatapb.VEvent{begin(), customerFields(),
		rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a", "1", "2026-01-01", "1")}),
		gtid("MariaDB/0-100-57"), commit(1)})
	require.Error(t, err)
	require.Equal(t, source.Classification{Action: source.Fatal, Reason: "POSITION_ORDER"}, Classify(err))
}

func TestEventsTheStreamCannotTakeAreErrors(t *testing.T) {
	from := source.Checkpoint{Term: 1, Opaque: "MariaDB/0-1-1"}
	tests := []struct {
		name   string
		events []*binlogdatapb.VEvent
		reason string // "" : an error the caller reports as it is
	}{
		// Statement-based binary logs carry no row images.
		{"statement", []*binlogdatapb.VEvent{begin(), {Type: binlogdatapb.VEventType_INSERT, Dml: "insert into t values (1)"}}, "STATEMENT_BINLOG"},
		// A partial JSON update is not the column's value.
		{"partial json", []*binlogdatapb.VEvent{begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{
			Before: row("1", "a", "1", "2026-01-01", "{}"), After: row("1", "a", "1", "2026-01-01", `JSON_SET(@5, '$.a', 1)`),
			JsonPartialValues: &binlogdatapb.RowChange_Bitmap{Count: 1, Cols: []byte{1}}})}, "PARTIAL_JSON"},
		// Rows of a table whose columns never came.
		{"no field event", []*binlogdatapb.VEvent{begin(), rowEvent("customer", &binlogdatapb.RowChange{After: row("1")})}, ""},
		// A row with another number of values than the table has columns.
		{"short row", []*binlogdatapb.VEvent{begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a")})}, ""},
		// Lengths past the row's bytes.
		{"bad lengths", []*binlogdatapb.VEvent{begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{
			After: &querypb.Row{Lengths: []int64{1, 1, 1, 1, 100}, Values: []byte("1abc")}})}, ""},
		// A commit of records without a position.
		{"no gtid", []*binlogdatapb.VEvent{begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a", "1", "2026-01-01", "1")}), commit(1)}, ""},
		// A position of a server without GTIDs.
		{"file position", []*binlogdatapb.VEvent{begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a", "1", "2026-01-01", "1")}),
			gtid("FilePos/binlog.000001:4"), commit(1)}, "BAD_POSITION"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := newDecoder("-80", from).add(tt.events)
			require.Error(t, err)
			if tt.reason != "" {
				require.Equal(t, tt.reason, Classify(err).Reason)
			}
		})
	}
}

func TestValuesAreTypedJSON(t *testing.T) {
	f := func(name string, typ querypb.Type) *querypb.Field { return &querypb.Field{Name: name, Type: typ} }
	ev := &binlogdatapb.FieldEvent{TableName: "t", EnumSetStringValues: true, Fields: []*querypb.Field{
		{Name: "id", Type: querypb.Type_UINT64, Flags: pkFlag},
		f("i8", querypb.Type_INT8), f("f", querypb.Type_FLOAT64), f("y", querypb.Type_YEAR),
		f("d", querypb.Type_DECIMAL), f("ts", querypb.Type_TIMESTAMP), f("dt", querypb.Type_DATETIME), f("tm", querypb.Type_TIME),
		f("txt", querypb.Type_TEXT), f("ch", querypb.Type_CHAR),
		f("bin", querypb.Type_VARBINARY), f("blob", querypb.Type_BLOB),
		f("bit", querypb.Type_BIT), f("e", querypb.Type_ENUM), f("s", querypb.Type_SET), f("j", querypb.Type_JSON),
	}}
	tab, err := tableOf(ev)
	require.NoError(t, err)
	got, err := tab.rowJSON(row("18446744073709551615", "-8", "1.5e+20", "2026",
		"12345678901234567890.0001", "2026-12-01 10:00:00.123456", "2026-12-01 10:00:00", "-838:59:59",
		"line\n\"quoted\" é", "x",
		[]byte{0, 1, 2, 255}, []byte("hello"),
		[]byte{1, 2}, "small", "a,b", `{"a": [1, 2.5, null]}`), nil, nil)
	require.NoError(t, err)
	require.Equal(t, `{"id":18446744073709551615,"i8":-8,"f":1.5e+20,"y":2026,`+
		`"d":"12345678901234567890.0001","ts":"2026-12-01 10:00:00.123456","dt":"2026-12-01 10:00:00","tm":"-838:59:59",`+
		`"txt":"line\n\"quoted\" é","ch":"x",`+
		`"bin":"AAEC/w==","blob":"aGVsbG8=",`+
		`"bit":258,"e":"small","s":"a,b","j":{"a":[1,2.5,null]}}`, string(got))
	key, err := tab.rowJSON(row("1", "0", "0", "2026", "0", "", "", "", "", "", "", "", []byte{0}, "", "", "1"), nil, tab.pk)
	require.NoError(t, err)
	require.Equal(t, `{"id":1}`, string(key))

	// Without string values, ENUM and SET come as their numbers.
	ev.EnumSetStringValues = false
	tab, err = tableOf(ev)
	require.NoError(t, err)
	got, err = tab.rowJSON(row("1", nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, "2", "5", nil), nil, nil)
	require.NoError(t, err)
	require.Contains(t, string(got), `"e":2,"s":5`)

	// A number that is not one is an error, not a broken record.
	_, err = tab.rowJSON(row("NaN", nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil), nil, nil)
	require.ErrorContains(t, err, "t.id")
}

func TestAPartialRowImageLeavesOutTheColumnsItLacks(t *testing.T) {
	d := newDecoder("-80", source.Checkpoint{})
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), customerFields(),
		rowEvent("customer", &binlogdatapb.RowChange{
			Before: row("1", "a", "1.00", "2026-01-01", `{"big": 1}`),
			After:  row("1", "b", "1.00", "2026-01-01", nil),
			// Columns 0 to 3 in the after image; tags (4) unchanged and left out.
			DataColumns: &binlogdatapb.RowChange_Bitmap{Count: 5, Cols: []byte{0b01111}}}),
		gtid("MariaDB/0-1-2"), commit(1)}))
	recs, _ := d.take(10, source.Checkpoint{})
	require.Len(t, recs, 1)
	requireJSON(t, `{"customer_id": 1, "email": "b", "credit": "1.00", "since": "2026-01-01"}`, recs[0].After)
}

func TestATableWithoutAPrimaryKeyHasAnEmptyKey(t *testing.T) {
	d := newDecoder("-80", source.Checkpoint{})
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(),
		{Type: binlogdatapb.VEventType_FIELD, FieldEvent: &binlogdatapb.FieldEvent{TableName: "log", Fields: []*querypb.Field{{Name: "msg", Type: querypb.Type_VARCHAR}}}},
		rowEvent("log", &binlogdatapb.RowChange{After: row("hi")}), gtid("MariaDB/0-1-2"), commit(1)}))
	recs, _ := d.take(10, source.Checkpoint{})
	require.Len(t, recs, 1)
	requireJSON(t, `{}`, recs[0].Key)
}

func TestATruncateOfAStreamedTableIsARecordOfItsOwn(t *testing.T) {
	from := source.Checkpoint{Term: 20, Index: 2, Opaque: "MariaDB/0-1-20"}
	d := newDecoder("-80", from)
	require.NoError(t, d.add([]*binlogdatapb.VEvent{gtid("MariaDB/0-1-21"),
		{Type: binlogdatapb.VEventType_DDL, Statement: "truncate table `customer`", Timestamp: 1_800_000_005}}))
	recs, cp := d.take(100, from)
	require.Equal(t, "21.1@MariaDB/0-1-21", cp.String())
	require.Equal(t, []source.Record{{Tablet: "-80", Position: source.Checkpoint{Term: 21, Index: 1},
		CommitTime: time.Unix(1_800_000_005, 0).UTC(), Table: "customer", Op: source.Truncate}}, recs)

	for stmt, want := range map[string]string{
		"TRUNCATE commerce.corder": "corder", "truncate TABLE `vt_commerce`.`corder`;": "corder", "Truncate t1": "t1",
	} {
		got, ok := truncated(stmt)
		require.True(t, ok, stmt)
		require.Equal(t, want, got, stmt)
	}
	for _, stmt := range []string{"alter table customer add column x int", "truncate", "truncate table", "create table truncate (x int)"} {
		_, ok := truncated(stmt)
		require.False(t, ok, stmt)
	}
}

// Each column's PostgreSQL type (source.Record.Types, for typed mirror
// tables) holds the values as they are written: the table of
// docs/sources/vitess.md#column-types.
func TestColumnsHaveThePostgreSQLTypesThatHoldTheirValues(t *testing.T) {
	f := func(name string, typ querypb.Type, columnType string) *querypb.Field {
		return &querypb.Field{Name: name, Type: typ, ColumnType: columnType}
	}
	ev := &binlogdatapb.FieldEvent{TableName: "t", EnumSetStringValues: true, Fields: []*querypb.Field{
		f("id", querypb.Type_UINT64, "bigint unsigned"), f("i8", querypb.Type_INT8, "tinyint"), f("u16", querypb.Type_UINT16, "smallint unsigned"),
		f("i24", querypb.Type_INT24, "mediumint"), f("u32", querypb.Type_UINT32, "int unsigned"), f("i64", querypb.Type_INT64, "bigint"),
		f("f4", querypb.Type_FLOAT32, "float"), f("f8", querypb.Type_FLOAT64, "double"), f("y", querypb.Type_YEAR, "year"),
		f("d", querypb.Type_DECIMAL, "decimal(12,4)"), f("d0", querypb.Type_DECIMAL, ""), f("dt", querypb.Type_DATE, "date"),
		f("ts", querypb.Type_TIMESTAMP, "timestamp(6)"), f("tm", querypb.Type_TIME, "time"), f("txt", querypb.Type_VARCHAR, "varchar(32)"),
		f("bin", querypb.Type_VARBINARY, "varbinary(8)"), f("bit", querypb.Type_BIT, "bit(12)"), f("e", querypb.Type_ENUM, "enum('a','b')"),
		f("j", querypb.Type_JSON, "json"),
	}}
	tab, err := tableOf(ev)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"id": "numeric(20,0)", "i8": "smallint", "u16": "integer", "i24": "integer", "u32": "bigint",
		"i64": "bigint", "f4": "real", "f8": "double precision", "y": "smallint", "d": "numeric(12,4)", "d0": "numeric", "dt": "date",
		"ts": "timestamp without time zone", "tm": "interval", "txt": "text", "bin": "text", "bit": "numeric(20,0)", "e": "text",
		"j": "jsonb"}, tab.types)
	ev.EnumSetStringValues = false
	tab, err = tableOf(ev)
	require.NoError(t, err)
	require.Equal(t, "bigint", tab.types["e"], "an ENUM's number")

	d := newDecoder("-80", source.Checkpoint{})
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), customerFields(),
		rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a", "1.00", "2026-01-01", nil)}), gtid("MariaDB/0-1-2"), commit(1)}))
	recs, _ := d.take(10, source.Checkpoint{})
	require.Len(t, recs, 1)
	require.Equal(t, d.tables["customer"].types, recs[0].Types, "records carry their table's types")
}
