package e2e

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// A table added to a running stream by configure, under a write workload,
// then removed under load. The stream reads public.orders only; the
// shards' items hold rows from before, and the workload writes both
// tables. A list naming a table that is not there fails at the source and
// changes nothing. Adding public.items publishes it on every shard and
// backfills it with a snapshot: replaying each shard's JSONL then gives
// both tables exactly, with no position twice and positions increasing.
// Removing it again (orders still written) stops its changes: items
// written after the removal never reach the sink, whose replay of items
// stays what the source held at the removal, while orders stay exact.
func TestPostgresTableAddedByConfigureUnderLoadThenRemoved(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 2, Standbys: 1})
	// Items' changes flow from the change on, before their rows are
	// copied: an update may come before its row's Read.
	p.replay = pgbed.ReplaySnapshot
	p.src["tables"] = []string{"public.orders"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const before = 3000 // items per shard from before the stream (ids the workload does not use)
	for _, sh := range p.bed.Shards {
		require.NoError(t, sh.Primary.Exec(ctx, fmt.Sprintf(`INSERT INTO public.items SELECT g, g, 'sku' || g, g %% 7, NULL FROM generate_series(1000001, %d) g`, 1000000+before)))
	}
	p.startWorker()
	out := t.TempDir()
	const stream = "pgtables"
	load := p.streamUnderLoad(stream, out, 34)
	requireNoItems := func(why string) {
		t.Helper()
		for _, id := range []string{"s1", "s2"} {
			for _, l := range tabletLines(t, out, id) {
				require.NotEqual(t, "public.items", l.Table, "%s: %s", id, why)
			}
		}
	}
	requireNoItems("the stream does not read public.items yet")

	// A table that is not there: the source refuses, nothing changes.
	require.NoError(t, p.update(stream, workflows.CmdConfigure, `{"source": {"tables": ["public.orders", "public.nope"]}}`))
	st := p.waitStatus(stream, "the change refused by the source", time.Minute, tablesChange("tables-1", workflows.TablesFailed))
	require.Contains(t, st.TablesChange.Error, "public.nope not there")

	require.NoError(t, p.update(stream, workflows.CmdConfigure, `{"source": {"tables": ["public.orders", "public.items"]}, "reason": "e2e: add items"}`))
	st = p.waitStatus(stream, "items added and backfilled", 3*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		ok, why := tablesChange("tables-2", workflows.TablesDone)(st)
		if !ok || st.Snapshot == nil {
			return false, why
		}
		return st.Snapshot.State == workflows.SnapshotDone, fmt.Sprintf("%s: %v done; %s", st.Snapshot.State, st.Snapshot.Done, summary(st))
	})
	tc := st.TablesChange
	require.Equal(t, []string{"public.items"}, tc.Added)
	require.Equal(t, "e2e: add items", tc.Reason)
	require.Equal(t, st.Snapshot.ID, tc.Backfill)
	require.Equal(t, []string{"public.items"}, st.Snapshot.Tables, "the backfill copies the table added")
	require.Empty(t, st.Snapshot.Failed)
	for _, id := range []string{"s1", "s2"} {
		c := tabletStatus(st, id).Copy
		require.NotNil(t, c, id)
		require.True(t, c.Done, id)
		require.GreaterOrEqual(t, c.Rows, int64(before), "%s: the rows from before are copied", id)
	}
	require.NoError(t, load.Stop())
	p.requireShardsExact(out, 3*time.Minute)

	// Removed while orders are written: afterwards items change at the
	// source and none of it reaches the sink.
	itemsAt := make([]map[string]map[string]any, len(p.bed.Shards))
	for i, sh := range p.bed.Shards {
		tt, err := sh.Primary.TextTables(ctx)
		require.NoError(t, err)
		itemsAt[i] = tt["public.items"]
	}
	stop := writeOrders(ctx, t, p.bed)
	require.NoError(t, p.update(stream, workflows.CmdConfigure, `{"source": {"tables": ["public.orders"]}, "reason": "e2e: remove items"}`))
	st = p.waitStatus(stream, "items removed", time.Minute, tablesChange("tables-3", workflows.TablesDone))
	require.Equal(t, []string{"public.items"}, st.TablesChange.Removed)
	require.Empty(t, st.TablesChange.Backfill)
	for _, sh := range p.bed.Shards {
		require.NoError(t, sh.Primary.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'late', 1, NULL FROM generate_series(5000001, 5000020) g;
			UPDATE public.items SET qty = qty + 100 WHERE id % 50 = 0; DELETE FROM public.items WHERE id % 61 = 0`))
	}
	stop() // its last orders commit after the items writes
	p.tables = []string{"public.orders"}
	p.requireShardsExact(out, 3*time.Minute)
	for i := range p.bed.Shards {
		id := fmt.Sprintf("s%d", i+1)
		var recs []source.Record
		for _, l := range tabletLines(t, out, id) {
			r, err := l.Record()
			require.NoError(t, err)
			recs = append(recs, r)
		}
		got, err := p.replay(recs)
		require.NoError(t, err)
		require.True(t, reflect.DeepEqual(itemsAt[i], got["public.items"]),
			"%s: the sink's items are the source's at the removal (%d rows replayed, %d then): %s", id, len(got["public.items"]), len(itemsAt[i]),
			testbed.FirstRowDifference(itemsAt[i], got["public.items"]))
	}
}

// tablesChange is a waitStatus condition: the stream's last change of
// tables is id, in state.
func tablesChange(id, state string) func(workflows.StreamStatus) (bool, string) {
	return func(st workflows.StreamStatus) (bool, string) {
		tc := st.TablesChange
		if tc == nil {
			return false, "no change of tables in the status"
		}
		return tc.ID == id && tc.State == state, fmt.Sprintf("%s %s %s", tc.ID, tc.State, tc.Error)
	}
}

// writeOrders inserts and updates orders on every shard (ids from 3·10⁶,
// which the workload does not use), about 20 transactions a second each,
// until the func it returns is called; that waits for the writers and
// fails the test on an error.
func writeOrders(ctx context.Context, t *testing.T, bed *pgbed.Cluster) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, len(bed.Shards))
	for i, sh := range bed.Shards {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					// One last write, after everything the test did before.
					errs[i] = sh.Primary.Exec(ctx, `INSERT INTO public.orders VALUES ($1, 'last', 1, NULL, now())`, 3_900_000+i)
					return
				case <-time.After(50 * time.Millisecond):
				}
				id := 3_000_000 + int64(i)*100_000 + int64(n)
				if err := sh.Primary.Exec(ctx, `INSERT INTO public.orders VALUES ($1, 'w', $2, NULL, now())`, id, id%1000); err != nil {
					errs[i] = err
					return
				}
				if err := sh.Primary.Exec(ctx, `UPDATE public.orders SET amount = amount + 1 WHERE id = $1`, id-5); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
	}
}
