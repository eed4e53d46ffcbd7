package postgres_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// Generated columns are not in the change log (pgoutput leaves them out),
// and not in a snapshot's read rows either: a row copied and the same row
// changed later carry the same columns.
func TestASnapshotLeavesOutGeneratedColumnsAsTheChangeLogDoes(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	var version int
	require.NoError(t, b.c.Shards[0].Primary.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))
	ddl := `ALTER TABLE public.items ADD COLUMN stored_qty int GENERATED ALWAYS AS (qty * 2) STORED`
	generated := []string{"stored_qty"}
	if version >= 180000 { // virtual generated columns are new in 18
		ddl += `; ALTER TABLE public.items ADD COLUMN virtual_qty int GENERATED ALWAYS AS (qty * 3) VIRTUAL`
		generated = append(generated, "virtual_qty")
	}
	copied, changed := copiedThenChanged(t, b, "gen", ddl+`; INSERT INTO public.items (id, order_id, sku, qty, body) SELECT g, g, 'sku' || g, g, 'b' FROM generate_series(1, 3) g`,
		`UPDATE public.items SET qty = 7 WHERE id = 1`, 1)
	columns := func(r source.Record) map[string]json.RawMessage {
		var cols map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(r.After, &cols))
		return cols
	}
	for _, g := range generated {
		require.NotContains(t, columns(changed[0]), g, "the change log leaves %s out", g)
	}
	n := 0
	for _, r := range copied {
		if r.Op != source.Read || r.Table != "public.items" {
			continue
		}
		n++
		cols := columns(r)
		for _, g := range generated {
			require.NotContains(t, cols, g, "a read row leaves %s out, as the change log does: %s", g, r.After)
		}
		require.Len(t, cols, len(columns(changed[0])), "a read row has the change log's columns: %s", r.After)
	}
	require.Equal(t, 3, n)
}
