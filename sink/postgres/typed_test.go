package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// typed gives a record the source's column types.
func typed(r source.Record, types map[string]string) source.Record {
	r.Types = types
	return r
}

// With sink.mirrorTypes "source", a mirror table the sink makes takes the
// source's column types (text for a type the sink's database lacks), its
// values written as those types take them; it follows the source's
// table: a column added gets its type, a column dropped holds NULL from
// then on, a type widened is altered, a record of a narrower type (a shard
// not yet altered) is written as it is, and any other change fails the
// batch naming the column, writing nothing.
func TestApplyModeMakesMirrorTablesTypedLikeTheSourceAndFollowsItsColumns(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "mirror", MirrorTypes: pgsink.MirrorSource}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	types := map[string]string{"id": "bigint", "amount": "numeric(10,2)", "at": "timestamp with time zone", "tags": "text[]",
		"meta": "jsonb", "mood": "mood", "raw": "bytea", "qty": "integer"}
	batch := []source.Record{
		typed(rec(1, source.Insert, `{"id":1}`, `{"id":1,"amount":12.5,"at":"2026-12-01 10:00:00.123456+01","tags":"{a,\"b c\"}",
			"meta":{"k":[1,2]},"mood":"happy","raw":"\\x0102ff","qty":3}`), types),
		typed(rec(2, source.Insert, `{"id":2}`, `{"id":2,"amount":"1","qty":null}`), types),
		typed(rec(3, source.Update, `{"id":1}`, `{"id":1,"amount":13.456}`), types), // the rest kept (TOAST)
		typed(rec(4, source.Delete, `{"id":2}`, ""), types),
	}
	require.NoError(t, w.Write(ctx, batch))
	require.NoError(t, w.Commit(ctx, batch[3].Position))
	columnTypes := func() map[string]any {
		r, err := db.Query(ctx, `SELECT jsonb_object_agg(attname, format_type(atttypid, atttypmod))::text AS types FROM pg_attribute
			WHERE attrelid = 'mirror.public__orders'::regclass AND attnum > 0 AND NOT attisdropped`)
		require.NoError(t, err)
		return r[0]
	}
	require.JSONEq(t, `{"id":"bigint","amount":"numeric(10,2)","at":"timestamp with time zone","tags":"text[]","meta":"jsonb",
		"mood":"text","raw":"bytea","qty":"integer","tabletflow_tablet":"text"}`, columnTypes()["types"].(string))
	var exact bool
	require.NoError(t, db.QueryRow(ctx, `SELECT id = 1 AND amount = 13.46 AND at = '2026-12-01 09:00:00.123456Z' AND tags = '{a,"b c"}'
		AND meta = '{"k":[1,2]}' AND mood = 'happy' AND raw = '\x0102ff'::bytea AND qty = 3 FROM mirror.public__orders`).Scan(&exact))
	require.True(t, exact, "the row holds the source's values in their types")

	// A column added (varchar), qty widened to bigint, amount to
	// numeric(12,2), meta dropped at the source.
	types2 := map[string]string{"id": "bigint", "amount": "numeric(12,2)", "at": "timestamp with time zone", "tags": "text[]",
		"mood": "mood", "raw": "bytea", "qty": "bigint", "note": "character varying(5)"}
	next := []source.Record{
		typed(rec(5, source.Update, `{"id":1}`, `{"id":1,"amount":1234567890.12,"qty":9000000000,"note":"ab"}`), types2),
		// another shard's record, not yet altered: written as it is
		typed(rec(6, source.Insert, `{"id":3}`, `{"id":3,"amount":1.5,"qty":1,"meta":{"x":1}}`), types),
	}
	require.NoError(t, w.Write(ctx, next))
	require.NoError(t, w.Commit(ctx, next[1].Position))
	require.JSONEq(t, `{"id":"bigint","amount":"numeric(12,2)","at":"timestamp with time zone","tags":"text[]","meta":"jsonb",
		"mood":"text","raw":"bytea","qty":"bigint","note":"character varying(5)","tabletflow_tablet":"text"}`, columnTypes()["types"].(string))
	rows, err := db.Query(ctx, `SELECT id::text AS id, amount::text AS amount, qty::text AS qty, note, meta::text AS meta FROM mirror.public__orders ORDER BY id`)
	require.NoError(t, err)
	require.Equal(t, []map[string]any{
		{"id": "1", "amount": "1234567890.12", "qty": "9000000000", "note": "ab", "meta": nil}, // meta dropped: NULL
		{"id": "3", "amount": "1.50", "qty": "1", "note": nil, "meta": `{"x": 1}`},
	}, rows)

	// A key change after the column was added: the row moves with the
	// new column's value (the update leaves it out, as an unchanged
	// TOAST value).
	moved := typed(rec(7, source.Update, `{"id":5}`, `{"id":5,"amount":2}`), types2)
	moved.Before = []byte(`{"id":1}`)
	require.NoError(t, w.Write(ctx, []source.Record{moved}))
	require.NoError(t, w.Commit(ctx, moved.Position))
	var note *string
	require.NoError(t, db.QueryRow(ctx, `SELECT note FROM mirror.public__orders WHERE id = 5`).Scan(&note))
	require.NotNil(t, note, "the moved row keeps the added column's value")
	require.Equal(t, "ab", *note)

	// A change no cast makes safely: the batch fails naming the column.
	types3 := map[string]string{"id": "bigint", "amount": "numeric(12,2)", "tags": "integer"}
	bad := []source.Record{
		typed(rec(8, source.Insert, `{"id":4}`, `{"id":4,"amount":1}`), types3),
		typed(rec(9, source.Update, `{"id":5}`, `{"id":5,"tags":5}`), types3),
	}
	err = w.Write(ctx, bad)
	if err == nil {
		err = w.Commit(ctx, bad[1].Position)
	}
	require.ErrorIs(t, err, sink.ErrBadRecord)
	require.ErrorContains(t, err, "column tags is integer at the source and text[] in the mirror table")
}

// A mirror table already there keeps its types: one an earlier version
// (or sink.mirrorTypes "jsonb") made stays jsonb, a column added too.
func TestApplyModeKeepsAJSONBMirrorTableJSONBWhenTypesAreAskedFor(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "mirror"}
	types := map[string]string{"id": "bigint", "amount": "numeric"}
	for i, mt := range []string{pgsink.MirrorJSONB, pgsink.MirrorSource} {
		cfg.MirrorTypes = mt
		s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
		require.NoError(t, err)
		w, err := s.Open(ctx, "t-0001")
		require.NoError(t, err)
		r := typed(rec(uint64(i+1), source.Insert, `{"id":1}`, `{"id":1,"amount":2}`), types)
		if i == 1 {
			r.After = []byte(`{"id":1,"amount":3,"note":"x"}`)
			r.Types = map[string]string{"id": "bigint", "amount": "numeric", "note": "text"}
		}
		require.NoError(t, w.Write(ctx, []source.Record{r}))
		require.NoError(t, w.Commit(ctx, r.Position))
		s.Close()
	}
	var typesNow, row string
	require.NoError(t, db.QueryRow(ctx, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = 'mirror.public__orders'::regclass AND attnum > 0 AND NOT attisdropped`).Scan(&typesNow))
	require.Equal(t, "id jsonb, amount jsonb, tabletflow_tablet text, note jsonb", typesNow)
	require.NoError(t, db.QueryRow(ctx, `SELECT (to_jsonb(m) - 'tabletflow_tablet')::text FROM mirror.public__orders m`).Scan(&row))
	require.JSONEq(t, `{"id":1,"amount":3,"note":"x"}`, row)
}
