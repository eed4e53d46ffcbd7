package postgres_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// givenOrders is a table made by hand, typed, with a two-column key in
// another order than the records' and constraints of its own; the sink's
// role may read and write it but not alter it.
const givenOrders = `CREATE SCHEMA app;
	GRANT USAGE ON SCHEMA app TO ` + pgbed.User + `;
	CREATE TABLE app.orders (
		region text,
		id bigint,
		amount numeric(10,2) NOT NULL,
		placed date,
		at timestamptz,
		paid boolean,
		code varchar(5),
		tags text[],
		meta jsonb,
		raw json,
		qty integer CHECK (qty >= 0),
		PRIMARY KEY (region, id));
	GRANT SELECT, INSERT, UPDATE, DELETE ON app.orders TO ` + pgbed.User + `;
	CREATE TABLE app.nokey (id bigint, v text);
	GRANT SELECT, INSERT, UPDATE, DELETE ON app.nokey TO ` + pgbed.User

// orderRow reads app.orders as text, one map per row in key order.
const orderRows = `SELECT region, id::text AS id, amount::text AS amount, placed::text AS placed,
	(at AT TIME ZONE 'UTC')::text AS at, paid::text AS paid, code, tags::text AS tags,
	meta::text AS meta, (raw::jsonb)::text AS raw, qty::text AS qty
	FROM app.orders ORDER BY region, id`

// A source table given in sink.tables goes into that table: each value
// converted to its column's type (JSON strings into dates, times, text;
// numbers into numeric and integer; an array into text[]; json and jsonb
// take the JSON itself; null is NULL), upserted by the table's own primary
// key; tables not given still get mirror tables.
func TestApplyModeWritesAGivenTableInItsColumnTypes(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	require.NoError(t, db.Exec(ctx, givenOrders))
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf",
		Tables: map[string]string{"public.orders": "app.orders"}}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	batch := []source.Record{
		rec(1, source.Insert, `{"id":1,"region":"eu"}`, `{"id":1,"region":"eu","amount":12.5,"placed":"2026-12-01",
			"at":"2026-12-01T10:00:00.123456Z","paid":false,"code":"ab","tags":["a","b c"],"meta":{"k":[1,2]},"raw":{"n":"x"},"qty":3}`),
		rec(2, source.Insert, `{"id":2,"region":"eu"}`, `{"id":2,"region":"eu","amount":"1"}`),
		rec(3, source.Update, `{"id":1,"region":"eu"}`, `{"id":1,"region":"eu","amount":"13.456","paid":true}`), // the rest kept
		rec(4, source.Delete, `{"id":2,"region":"eu"}`, ""),
		rec(5, source.Read, `{"region":"us","id":3}`, `{"region":"us","id":3,"amount":7,"meta":null,"raw":null,"code":null,"tags":[]}`),
		{Tablet: "t-0001", Position: source.Checkpoint{Term: 1, Index: 6}, Table: "public.items", Op: source.Insert,
			Key: json.RawMessage(`{"id":9}`), After: json.RawMessage(`{"id":9,"qty":1}`), CommitTime: time.Unix(1, 0)},
	}
	require.NoError(t, w.Write(ctx, batch))
	require.NoError(t, w.Commit(ctx, batch[5].Position))
	rows := func() []map[string]any {
		r, err := db.Query(ctx, orderRows)
		require.NoError(t, err)
		return r
	}
	want := []map[string]any{
		{"region": "eu", "id": "1", "amount": "13.46", "placed": "2026-12-01", "at": "2026-12-01 10:00:00.123456", "paid": "true",
			"code": "ab", "tags": `{a,"b c"}`, "meta": `{"k": [1, 2]}`, "raw": `{"n": "x"}`, "qty": "3"},
		{"region": "us", "id": "3", "amount": "7.00", "placed": nil, "at": nil, "paid": nil,
			"code": nil, "tags": "{}", "meta": nil, "raw": nil, "qty": nil},
	}
	require.Equal(t, want, rows())
	var mirrored, items int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'tf' AND tablename = 'public__orders'`).Scan(&mirrored))
	require.Zero(t, mirrored, "a given table gets no mirror table")
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM tf.public__items`).Scan(&items))
	require.Equal(t, 1, items, "a table not given gets its mirror table")

	// A second instance (a restarted worker) reads the table afresh.
	s2, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s2.Close()
	w2, err := s2.Open(ctx, "t-0001")
	require.NoError(t, err)
	next := rec(7, source.Update, `{"id":3,"region":"us"}`, `{"id":3,"region":"us","amount":8,"qty":0}`)
	require.NoError(t, w2.Write(ctx, []source.Record{next}))
	require.NoError(t, w2.Commit(ctx, next.Position))
	want[1]["amount"], want[1]["qty"] = "8.00", "0"
	require.Equal(t, want, rows())
}

// Records that do not fit a given table fail their batch whole with
// ErrBadRecord, naming the table, the record and the reason: another key,
// a column the table lacks (the table is never altered), or a value its
// column's type or constraints refuse. No row is written, the checkpoint
// stays, and the next batch that fits commits.
func TestApplyModeRefusesRecordsThatDoNotFitAGivenTableWritingNothing(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	require.NoError(t, db.Exec(ctx, givenOrders))
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf", Tables: map[string]string{
		"public.orders": "app.orders", "public.gone": "app.gone", "public.nokey": "app.nokey"}}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	first := rec(1, source.Insert, `{"id":1,"region":"eu"}`, `{"id":1,"region":"eu","amount":1,"qty":1}`)
	require.NoError(t, w.Write(ctx, []source.Record{first}))
	require.NoError(t, w.Commit(ctx, first.Position))
	before, err := db.Query(ctx, orderRows)
	require.NoError(t, err)
	columns := func() int {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'app.orders'::regclass AND attnum > 0 AND NOT attisdropped`).Scan(&n))
		return n
	}
	cols := columns()

	pos := uint64(1)
	for _, tt := range []struct {
		name, key, after string
		table            string // default public.orders
		want             []string
	}{
		{name: "key without a column of the primary key", key: `{"id":2}`, after: `{"id":2,"amount":1}`,
			want: []string{`table "app"."orders" of sink.tables["public.orders"] has the primary key (region, id), records of public.orders are keyed by (id)`}},
		{name: "a column the table lacks", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":1,"colour":"red","size":2}`,
			want: []string{`has no column colour, size for records of public.orders (the sink never alters a given table)`}},
		{name: "text into integer", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":1,"qty":"x"}`, want: []string{"22P02", "integer"}},
		{name: "integer out of range", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":1,"qty":99999999999}`, want: []string{"22003"}},
		{name: "not a date", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":1,"placed":"soon"}`, want: []string{"22007"}},
		{name: "a date out of range", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":1,"placed":"2026-13-45"}`, want: []string{"22008"}},
		{name: "numeric overflowing its precision", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":123456789012}`, want: []string{"22003"}},
		// An explicit cast to varchar(5) would cut it silently.
		{name: "too long for varchar(5)", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":1,"code":"abcdef"}`, want: []string{"22001"}},
		{name: "NUL in jsonb", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":1,"meta":{"s":"\u0000"}}`, want: []string{"22P05"}},
		{name: "null into NOT NULL", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":null}`, want: []string{"23502", `"amount"`}},
		{name: "CHECK", key: `{"id":2,"region":"eu"}`, after: `{"id":2,"region":"eu","amount":1,"qty":-1}`, want: []string{"23514", "orders_qty_check"}},
		{name: "a given table that is not there", table: "public.gone", key: `{"id":2}`, after: `{"id":2}`,
			want: []string{`table "app"."gone" of sink.tables["public.gone"] does not exist`}},
		{name: "a given table without a primary key", table: "public.nokey", key: `{"id":2}`, after: `{"id":2,"v":"x"}`,
			want: []string{`table "app"."nokey" of sink.tables["public.nokey"] has no primary key`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w, err := s.Open(ctx, "t-0001") // a failed commit keeps its records staged: each case a writer of its own
			require.NoError(t, err)
			defer w.Close()
			require.Equal(t, first.Position, w.Checkpoint())
			pos += 2
			fits := rec(pos, source.Insert, `{"id":5,"region":"eu"}`, `{"id":5,"region":"eu","amount":5}`) // written, then rolled back
			bad := rec(pos+1, source.Insert, tt.key, tt.after)
			if tt.table != "" {
				bad.Table = tt.table
			}
			require.NoError(t, w.Write(ctx, []source.Record{fits, bad}))
			err = w.Commit(ctx, bad.Position)
			require.ErrorIs(t, err, sink.ErrBadRecord, "%v", err)
			require.NotErrorIs(t, err, sink.ErrDenied)
			for _, s := range tt.want {
				require.ErrorContains(t, err, s)
			}
			got, qerr := db.Query(ctx, orderRows)
			require.NoError(t, qerr)
			require.Equal(t, before, got, "no row written")
			require.Equal(t, cols, columns(), "the table is not altered")
			w2, err := s.Open(ctx, "t-0001")
			require.NoError(t, err)
			require.Equal(t, first.Position, w2.Checkpoint(), "the checkpoint stays")
			require.NoError(t, w2.Close())
		})
	}
	// The next batch that fits commits.
	ok := rec(pos+2, source.Insert, `{"id":2,"region":"eu"}`, `{"id":2,"region":"eu","amount":2}`)
	w, err = s.Open(ctx, "t-0001")
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, []source.Record{ok}))
	require.NoError(t, w.Commit(ctx, ok.Position))
	got, err := db.Query(ctx, `SELECT id::text AS id FROM app.orders ORDER BY id`)
	require.NoError(t, err)
	require.Equal(t, []map[string]any{{"id": "1"}, {"id": "2"}}, got)
}
