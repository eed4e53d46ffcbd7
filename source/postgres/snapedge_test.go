package postgres_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// A stream that began with a snapshot and whose copy is complete reads
// from a standby while the primary is down, as any stream does: what it
// needs to know of the copy (that it is done) the standby has replayed.
func TestACompleteSnapshotStreamReadsFromAStandbyWithThePrimaryDown(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'sku' || g, 1, 'b' FROM generate_series(1, 5) g`))
	const stream = "done"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartSnapshot})
	require.NoError(t, err)
	standby := b.cfg.Shards[0].Replicas[1].Alias
	rd := b.reader(t, standby)
	all, cp := read(t, rd, stream, st.Start["s1"], -1)
	reads := slices.DeleteFunc(slices.Clone(all), func(r source.Record) bool { return r.Op != source.Read })
	require.Len(t, reads, 5, "the copy is complete and committed")
	require.NoError(t, rd.Close())
	require.NoError(t, b.c.WaitReplayed(ctx))

	require.NoError(t, p.Stop())
	rest, _ := read(t, b.reader(t, standby), stream, cp, -1) // reads and acks, failing on any error
	require.Empty(t, rest, "nothing more to read: the primary is down")
}

// A commit written before the stream is made but still invisible (it
// waits for a synchronous standby that does not answer) is in the copy:
// making the slot waits for it (PostgreSQL's snapshot builder waits for
// every transaction the running-transactions record lists, and a commit
// waiting for a standby is listed until it is visible), so the stream's
// start is never past a commit that a chunk selected on the primary could
// miss and the change log would not deliver. The commit is released once
// the slot's creation waits for it; were the start ever past it, it would
// be released only after the first chunk was selected, which then missed
// it, and the replay would lack it.
func TestACommitWaitingForASynchronousStandbyWhenTheStreamIsMadeIsInTheCopy(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1})
	ctx := ctxT(t, 2*time.Minute)
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'sku' || g, 1, 'b' FROM generate_series(1, 4) g`))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.orders SELECT g, 'c' || g, g, NULL, now() FROM generate_series(1, 2) g`))
	syncRepOn(t, p)
	release, committed := hangingCommit(t, p, `UPDATE public.items SET qty = 99 WHERE id = 1`)
	defer postgres.SetSnapshotHook(func(step string) {
		if step == "selected" {
			release()
		}
	})()
	const stream = "syncrep"
	made := make(chan error, 1)
	var st source.Stream
	go func() {
		var err error
		st, err = b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartSnapshot})
		made <- err
	}()
	var err error
	waited := false
	for done := false; !done; {
		select {
		case err = <-made:
			done = true
		case <-time.After(20 * time.Millisecond):
			var n int
			require.NoError(t, p.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE query LIKE '%pg_create_logical_replication_slot%' AND wait_event = 'transactionid'`).Scan(&n))
			if n > 0 && !waited {
				waited = true
				release()
			}
		}
	}
	require.NoError(t, err)
	t.Logf("the slot's creation waited for the commit: %v", waited)
	all, _ := read(t, b.primaryReader(t), stream, st.Start["s1"], -1)
	require.NoError(t, <-committed)
	want, err := p.TextTables(ctx)
	require.NoError(t, err)
	require.Equal(t, "99", want["public.items"][`{"id":1}`]["qty"])
	got, err := pgbed.ReplaySnapshot(all)
	require.NoError(t, err)
	require.Equal(t, want, got, "the commit made before the stream is in the copy: %v", all)
}
