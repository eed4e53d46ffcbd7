package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// A shard whose slots are all gone (Expired) is resynced: new slots, and
// from the checkpoint Resync returns a resync-begin, the shard's rows as
// they are then (read records, woven with the changes made meanwhile), a
// resync-end, and the changes after; across a reader that dies in the
// middle of the copy. Replaying everything the stream delivered, before
// the expiry and after the resync, gives the shard's tables; positions
// keep increasing across the resync; a second Resync of the same id
// answers the same checkpoint.
func TestResyncOfAnExpiredShardCopiesItsRowsBetweenMarkers(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 3*time.Minute)
	p := b.c.Shards[0].Primary
	const stream = "again"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'sku' || g, 1, 'b' FROM generate_series(1, 400) g`))
	rd := b.primaryReader(t)
	before, cp := read(t, rd, stream, st.Start["s1"], 400)
	require.NoError(t, rd.Close())

	for _, n := range b.c.Shards[0].Nodes() {
		require.NoError(t, n.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, postgres.SlotName(stream, "s1")))
	}
	// Changes the stream never reads: a delete among them.
	require.NoError(t, p.Exec(ctx, `DELETE FROM public.items WHERE id <= 50`))
	require.NoError(t, p.Exec(ctx, `UPDATE public.items SET qty = 7 WHERE id > 350`))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.orders SELECT g, 'c' || g, g, NULL, now() FROM generate_series(1, 300) g`))
	_, err = b.primaryReader(t).GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: cp, MaxRecords: 10, MaxWait: time.Second})
	require.Equal(t, source.Expired, b.src.Classify(err).Action, "%v", err)

	start, err := b.src.Resync(ctx, stream, "s1", "1", source.Checkpoint{})
	require.NoError(t, err)
	require.Equal(t, 1, start.Compare(cp), "the resync's start %s is after the old checkpoint %s", start, cp)
	again, err := b.src.Resync(ctx, stream, "s1", "1", source.Checkpoint{})
	require.NoError(t, err)
	require.Equal(t, start, again, "the same resync answers the same start")

	load := b.c.StartWorkload(pgbed.WorkloadOptions{Rate: 100, Count: 150, Seed: 3})
	standby := b.cfg.Shards[0].Replicas[1].Alias
	first, mid := read(t, b.reader(t, standby), stream, start, 300)
	// The reader dies in the middle of the copy; another resumes.
	require.NoError(t, load.Wait())
	require.NoError(t, b.c.WaitReplayed(ctx))
	rest, _ := read(t, b.reader(t, standby), stream, mid, -1)
	after := append(first, rest...)

	require.Equal(t, source.ResyncBegin, after[0].Op, "the copy begins with a marker")
	begins, ends, reads, lastRead, end := 0, 0, 0, -1, -1
	for i, r := range after {
		switch r.Op {
		case source.ResyncBegin:
			begins++
		case source.ResyncEnd:
			ends, end = ends+1, i
		case source.Read:
			reads, lastRead = reads+1, i
		}
	}
	require.Equal(t, 1, begins)
	require.Equal(t, 1, ends)
	require.Greater(t, end, lastRead, "resync-end comes after every read")
	require.GreaterOrEqual(t, reads, 350+300, "the shard's rows were copied")

	want, err := p.TextTables(ctx)
	require.NoError(t, err)
	got, err := pgbed.Replay(append(before, after...))
	require.NoError(t, err)
	require.Equal(t, want, got, "replaying what the stream delivered gives the shard's tables")
}
