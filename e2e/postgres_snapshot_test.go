package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// An ad-hoc snapshot of one table on a running stream, under a write
// workload: the shards' orders hold rows from before the stream started
// (which it never read), and the operator asks for a snapshot of
// public.orders. Rows of it are updated and deleted while the copy runs.
// Afterwards replaying each shard's JSONL (its changes, then from the
// first Read record on the copy woven with them) gives the shard's tables
// exactly, with no position twice and positions increasing: without the
// copy the rows from before would be missing. No row of public.items is
// copied, the snapshot is Done in the status, and a second one can be
// asked and cancelled.
func TestPostgresAdhocSnapshotOfOneTableUnderLoad(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 2, Standbys: 1})
	p.replay = pgbed.ReplayAdhoc
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const before = 5000 // rows per shard from before the stream (ids the workload does not use)
	for _, sh := range p.bed.Shards {
		require.NoError(t, sh.Primary.Exec(ctx, fmt.Sprintf(`INSERT INTO public.orders SELECT g, 'c' || g, g * 1.5, NULL, now() FROM generate_series(1000001, %d) g`, 1000000+before)))
	}
	p.startWorker()
	out := filepath.Join(p.dir, "out")
	const stream = "pgadhoc"
	// The default run.duration (5 m): a run whose copy finishes ends
	// there and reports it, so the snapshot is Done well before.
	load := p.streamUnderLoad(stream, out, 33)
	require.Error(t, p.update(stream, workflows.CmdSnapshot, `{"tables": ["public.nope"]}`), "a table the stream does not read is refused")

	p.signal(stream, workflows.CmdSnapshot, `{"tables": ["public.orders"], "reason": "e2e: backfill orders"}`)
	p.eventually("the copy is under way on both shards", 2*time.Minute, func() (bool, string) {
		n1, n2 := reads(t, out, "s1"), reads(t, out, "s2")
		return n1 > 0 && n2 > 0, fmt.Sprintf("%d and %d rows copied", n1, n2)
	})
	// Rows from before, changed while the copy runs: some before their
	// chunk, some after it.
	for _, sh := range p.bed.Shards {
		require.NoError(t, sh.Primary.Exec(ctx, `UPDATE public.orders SET amount = amount + 1 WHERE id % 97 = 0 AND id BETWEEN 1000001 AND 1100000`))
		require.NoError(t, sh.Primary.Exec(ctx, `DELETE FROM public.orders WHERE id % 89 = 0 AND id BETWEEN 1000001 AND 1100000`))
	}
	st := p.waitStatus(stream, "the snapshot is done", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		sn := st.Snapshot
		if sn == nil {
			return false, "no snapshot in the status"
		}
		return sn.State == workflows.SnapshotDone, fmt.Sprintf("%s: %v done; %s", sn.State, sn.Done, summary(st))
	})
	require.Empty(t, st.Snapshot.Failed)
	require.True(t, strings.HasPrefix(st.Snapshot.Key, "snapshot-1@") && len(st.Snapshot.Key) > len("snapshot-1@"),
		"the job at the source is named by the stream's first run too (a stream started again under its id never meets it): %q", st.Snapshot.Key)
	for _, id := range []string{"s1", "s2"} {
		c := tabletStatus(st, id).Copy
		require.NotNil(t, c, id)
		require.Equal(t, source.CopySnapshot, c.Kind, id)
		require.True(t, c.Done, id)
		require.GreaterOrEqual(t, c.Rows, int64(before-before/89-1), "%s: the status counts the rows copied", id)
	}
	require.NoError(t, load.Stop())
	p.requireShardsExact(out, 3*time.Minute)
	for _, id := range []string{"s1", "s2"} {
		for _, l := range tabletLines(t, out, id) {
			if l.Op == source.Read {
				require.Equal(t, "public.orders", l.Table, "only the table asked for is copied")
			}
		}
	}

	// A second snapshot, cancelled at once: the stream goes on.
	require.NoError(t, p.update(stream, workflows.CmdSnapshot, `{"tables": ["public.items"]}`))
	require.NoError(t, p.update(stream, workflows.CmdSnapshotCancel, `{"reason": "e2e: not needed"}`))
	st = p.waitStatus(stream, "the second snapshot is cancelled, both shards streaming", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		ok, why := allStreaming(2)(st)
		return ok && st.Snapshot != nil && st.Snapshot.ID == "snapshot-2" && st.Snapshot.State == workflows.SnapshotCancelled, why
	})
	require.Equal(t, "e2e: not needed", st.Snapshot.Reason)
}

// reads counts a tablet's Read records in the JSONL sink.
func reads(t *testing.T, out, tablet string) int {
	n := 0
	for _, l := range tabletLines(t, out, tablet) {
		if l.Op == source.Read {
			n++
		}
	}
	return n
}

// streamUnderLoad starts a stream of both shards into the JSONL directory
// out in batches of 100, waits until both stream, starts a workload of 40
// transactions a second per shard (seed) and waits until 200 records
// reach the sink.
func (p *pgEnv) streamUnderLoad(stream, out string, seed uint64) *pgbed.Workload {
	p.t.Helper()
	p.startStream(stream, p.config(out, map[string]any{"batch": map[string]any{"maxRecords": 100}}))
	p.waitStatus(stream, "both shards streaming", 2*time.Minute, allStreaming(2))
	load := p.bed.StartWorkload(pgbed.WorkloadOptions{Rate: 40, Seed: seed, KeepGoing: true})
	p.eventually("changes reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 200, fmt.Sprintf("%d records", n)
	})
	return load
}
