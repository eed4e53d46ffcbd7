package postgres_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// A snapshot's read rows carry each value as the change log does (the
// type's output, as pgoutput sends it: a boolean true is true, a
// char(n) keeps its padding, a host address has no /32), and the same
// column types: a row copied and the same row changed later differ only
// in what the change changed.
func TestASnapshotWritesValuesAndTypesAsTheChangeLogDoes(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	copied, changed := copiedThenChanged(t, b, "values", `ALTER TABLE public.items ADD COLUMN flag boolean, ADD COLUMN code char(5), ADD COLUMN addr inet,
		ADD COLUMN at timestamptz, ADD COLUMN amount numeric(8,2);
		INSERT INTO public.items (id, order_id, sku, qty, body, flag, code, addr, at, amount)
		SELECT g, g, 'sku' || g, g, 'b', g % 2 = 1, 'c' || g, ('10.0.0.' || g)::inet, timestamptz '2026-12-01 10:00:00.5+02' + g * interval '1 s', g / 3.0
		FROM generate_series(1, 4) g`, `UPDATE public.items SET qty = qty + 100`, 4)
	after := func(r source.Record) map[string]json.RawMessage {
		var cols map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(r.After, &cols))
		delete(cols, "qty") // what the change changed
		return cols
	}
	byKey := map[string]source.Record{}
	for _, r := range copied {
		if r.Op == source.Read && r.Table == "public.items" {
			byKey[string(r.Key)] = r
		}
	}
	require.Len(t, byKey, 4)
	require.Len(t, changed, 4)
	for _, c := range changed {
		r, ok := byKey[string(c.Key)]
		require.True(t, ok, "row %s copied", c.Key)
		require.Equal(t, after(c), after(r), "row %s: copied %s, changed %s", c.Key, r.After, c.After)
		require.Equal(t, c.Types, r.Types)
	}
	require.Equal(t, map[string]string{"id": "bigint", "order_id": "bigint", "sku": "text", "qty": "integer", "body": "text",
		"flag": "boolean", "code": "character(5)", "addr": "inet", "at": "timestamp with time zone", "amount": "numeric(8,2)"}, changed[0].Types)
	require.JSONEq(t, `true`, string(after(byKey[`{"id":1}`])["flag"]), "a boolean true copied is true")
}

// copiedThenChanged runs setup on the bed's primary, starts a stream with
// a snapshot, and reads from a standby what it copied; then runs change
// and reads the want records it gives.
func copiedThenChanged(t *testing.T, b *bed, stream, setup, change string, want int) (copied, changed []source.Record) {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, setup))
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartSnapshot})
	require.NoError(t, err)
	require.NoError(t, b.c.WaitReplayed(ctx))
	rd := b.reader(t, b.cfg.Shards[0].Replicas[1].Alias)
	copied, cp := read(t, rd, stream, st.Start["s1"], -1)
	require.NoError(t, p.Exec(ctx, change))
	changed, _ = read(t, rd, stream, cp, want)
	return copied, changed
}
