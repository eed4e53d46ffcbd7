package postgres_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// latestBed is a one-shard bed whose tables hold rows before a stream
// that starts at its latest (so the log never delivers them): items
// 1…items, orders 1…orders. It returns the stream's checkpoint after a
// reader on the replica alias read it to the end (nothing), and closed.
func latestBed(t *testing.T, opts pgbed.Options, stream string, items, orders int) (*bed, source.Checkpoint) {
	t.Helper()
	b := newBed(t, opts)
	ctx := ctxT(t, time.Minute)
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'sku' || g, g % 7, CASE WHEN g % 5 = 0 THEN repeat('b', 3000) END
		FROM generate_series(1, $1::int) g`, items))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.orders SELECT g, 'c' || g, g, NULL, now() FROM generate_series(1, $1::int) g`, orders))
	require.NoError(t, p.Exec(ctx, `ANALYZE public.items`))
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartLatest})
	require.NoError(t, err)
	rd := b.primaryReader(t)
	got, cp := read(t, rd, stream, st.Start["s1"], -1)
	require.Empty(t, got)
	require.Nil(t, rd.Copy(), "no copy: the stream starts at its latest")
	require.NoError(t, rd.Close())
	return b, cp
}

// readCopy reads from rd after from, size records at most a batch
// (acking each batch, checking that positions increase), until the copy
// it has open reports done, for up to a minute; it fails, printing what
// it saw, if that does not happen.
func readCopy(t *testing.T, rd *postgres.Reader, stream string, from source.Checkpoint, size int) ([]source.Record, source.Checkpoint) {
	t.Helper()
	return readCopyOf(t, rd, stream, from, size, "")
}

// readCopyOf is readCopy until a copy of kind (any, if "") is done.
func readCopyOf(t *testing.T, rd *postgres.Reader, stream string, from source.Checkpoint, size int, kind string) ([]source.Record, source.Checkpoint) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	var out []source.Record
	cp := from
	for c := rd.Copy(); c == nil || !c.Done || (kind != "" && c.Kind != kind); c = rd.Copy() {
		require.NoError(t, ctx.Err(), "the copy is not done after a minute: %+v, %d records", c, len(out))
		b := readBatch(ctx, t, rd, stream, cp, size)
		cp = b.Checkpoint
		out = append(out, b.Records...)
	}
	return out, cp
}

// reads are the Read records of recs, by table.
func reads(recs []source.Record) map[string][]source.Record {
	out := map[string][]source.Record{}
	for _, r := range recs {
		if r.Op == source.Read {
			out[r.Table] = append(out[r.Table], r)
		}
	}
	return out
}

// copies counts the Read records of recs by table (what a failed check
// prints).
func copies(recs []source.Record) map[string]int {
	out := map[string]int{}
	for t, rs := range reads(recs) {
		out[t] = len(rs)
	}
	return out
}

// A snapshot job of one of the stream's two tables, on a stream that
// reads only changes: a reader opened after it copies every row the table
// holds as Read records, woven into the changes made meanwhile (updates,
// deletes and inserts of both tables), and not the other table; its Copy
// reports the job done. The same job again copies nothing more, and
// deleting the stream deletes what the job kept.
func TestASnapshotJobCopiesItsTableWhileTheShardStreams(t *testing.T) {
	const stream = "adhoc"
	b, cp := latestBed(t, pgbed.Options{Shards: 1}, stream, 600, 300)
	ctx := ctxT(t, 3*time.Minute)
	p := b.c.Shards[0].Primary
	job := source.SnapshotJob{ID: "j1", Tables: []string{"public.items"}}
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", job))

	// Changes to both tables while the copy runs; the reader opens once
	// they began.
	churn, started := make(chan error, 1), make(chan struct{})
	go func() {
		var err error
		defer close(started)
		for i := 0; i < 240 && err == nil; i++ {
			if i == 20 {
				started <- struct{}{}
			}
			switch i % 4 {
			case 0:
				err = p.Exec(ctx, `UPDATE public.items SET qty = qty + 1 WHERE id = $1`, 1+i*11%600) // body left as it is
			case 1:
				err = p.Exec(ctx, `DELETE FROM public.items WHERE id = $1`, 1+i*13%600)
			case 2:
				err = p.Exec(ctx, `INSERT INTO public.items VALUES ($1, 1, 'new', 1, NULL)`, 1000+i)
			default:
				err = p.Exec(ctx, `UPDATE public.orders SET amount = amount + 1 WHERE id = $1`, 1+i*7%300)
			}
			time.Sleep(5 * time.Millisecond) // spreads the changes over the copy
		}
		churn <- err
	}()
	<-started
	defer postgres.SetSnapshotHook(func(step string) {
		if step == "selected" {
			time.Sleep(10 * time.Millisecond) // a change or two between chunks
		}
	})()
	rd := b.primaryReader(t)
	all, cp := readCopy(t, rd, stream, cp, 10)
	require.NoError(t, <-churn)
	rest, cp := read(t, rd, stream, cp, -1)
	all = append(all, rest...)

	copied := reads(all)
	require.Equal(t, []string{"public.items"}, slices.Collect(maps.Keys(copied)), "the other table is not copied")
	var at []int // the reads' places
	for i, r := range all {
		if r.Op == source.Read {
			at = append(at, i)
		}
	}
	woven := at[len(at)-1] - at[0] + 1 - len(at)
	require.Positive(t, woven, "changes come between the copy's rows")
	var left []int64 // rows of before the job still there
	rows, err := p.Query(ctx, `SELECT id FROM public.items WHERE id <= 600 ORDER BY id`)
	require.NoError(t, err)
	for _, r := range rows {
		left = append(left, r["id"].(int64))
	}
	for _, id := range left {
		key := fmt.Sprintf(`{"id":%d}`, id)
		require.True(t, slices.ContainsFunc(copied["public.items"], func(r source.Record) bool { return string(r.Key) == key }), "row %s is copied", key)
	}
	want, err := p.TextTables(ctx)
	require.NoError(t, err)
	got, err := pgbed.ReplaySnapshot(all)
	require.NoError(t, err)
	require.Equal(t, want["public.items"], got["public.items"], "replaying the copy and the changes gives the table")

	c := rd.Copy()
	t.Logf("copy: %+v; %d records, %d reads, %d changes among them", c, len(all), len(copied["public.items"]), woven)
	require.Equal(t, source.CopyProgress{Kind: source.CopySnapshot, ID: "j1", Tables: 1, TablesDone: 1,
		Rows: int64(len(copied["public.items"])), Estimate: c.Estimate, Done: true}, *c)
	require.Positive(t, c.Rows)
	require.Positive(t, c.Estimate, "the table was analyzed")

	// The same job again: a new reader copies nothing more.
	require.NoError(t, rd.Close())
	require.Equal(t, c, rd.Copy(), "the report outlives Close")
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", job))
	require.NoError(t, p.Exec(ctx, `UPDATE public.orders SET amount = 0 WHERE id = 1`))
	rd = b.primaryReader(t)
	again, _ := read(t, rd, stream, cp, -1)
	require.NotEmpty(t, again)
	require.Empty(t, copies(again), "a job done is not copied again")
	require.Equal(t, &source.CopyProgress{Kind: source.CopySnapshot, ID: "j1", Tables: 1, TablesDone: 1, Done: true}, rd.Copy(),
		"a reader that finds the job complete says so (the stream may not have heard)")
	require.NoError(t, rd.Close())

	// Deleting the stream deletes what the job kept.
	require.Positive(t, progressRows(t, p, stream))
	require.NoError(t, b.src.DeleteStream(ctx, stream))
	require.Zero(t, progressRows(t, p, stream))
}

// A job cancelled in the middle of its copy: a reader opened after copies
// no more of it, and its progress is gone; the same job again does
// nothing, and a job of another id (the other table) replaces it. A
// stream the shard does not have has no job to take; its cancel is nil.
func TestACancelledSnapshotJobCopiesNothingMore(t *testing.T) {
	const stream = "cancel"
	b, cp := latestBed(t, pgbed.Options{Shards: 1}, stream, 2000, 40)
	ctx := ctxT(t, 3*time.Minute)
	p := b.c.Shards[0].Primary
	job := source.SnapshotJob{ID: "j1", Tables: []string{"public.items"}}
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", job))
	rd := b.primaryReader(t)
	var first []source.Record
	for len(reads(first)["public.items"]) < 100 {
		var recs []source.Record
		recs, cp = getAcked(t, rd, stream, cp, 50)
		first = append(first, recs...)
	}
	require.False(t, rd.Copy().Done, "cancelled in the middle")

	require.NoError(t, b.src.CancelSnapshot(ctx, stream, "s1", "j1"))
	require.NoError(t, b.src.CancelSnapshot(ctx, stream, "s1", "j1"), "again: nothing to do")
	require.NoError(t, b.src.CancelSnapshot(ctx, stream, "s1", "other"), "not the shard's job: nothing to do")
	require.NoError(t, rd.Close())
	var jobRows int
	require.NoError(t, p.QueryRow(ctx, `SELECT count(*) FROM tabletflow.snapshot_chunks WHERE stream = $1`, stream).Scan(&jobRows))
	require.Zero(t, jobRows, "the job's progress is deleted")
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", job), "the same job again does nothing")
	require.NoError(t, p.Exec(ctx, `UPDATE public.orders SET amount = 0 WHERE id = 1`))
	rd = b.primaryReader(t)
	after, cp := read(t, rd, stream, cp, -1)
	require.NotEmpty(t, after)
	require.Empty(t, copies(after), "nothing more is copied")
	require.Nil(t, rd.Copy())
	require.NoError(t, rd.Close())

	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", source.SnapshotJob{ID: "j2", Tables: []string{"public.orders"}}))
	rd = b.primaryReader(t)
	replaced, _ := readCopy(t, rd, stream, cp, 50)
	require.Equal(t, map[string]int{"public.orders": 40}, copies(replaced), "the new job copies its table")
	require.Equal(t, "j2", rd.Copy().ID)

	err := b.src.Snapshot(ctx, "nosuch", "s1", job)
	require.ErrorContains(t, err, "no publication")
	require.Equal(t, source.Fatal, b.src.Classify(err).Action)
	require.NoError(t, b.src.CancelSnapshot(ctx, "nosuch", "s1", "j1"))
}

// A job has an id and names at least one table; an unknown shard is
// refused as Resync refuses it. Checked before any server is asked. (That
// its tables are ones the stream reads is checked against the stream's
// record on the primary:
// TestSetTablesChangesWhatTheStreamReadsAndReadersFollowTheRecord.)
func TestASnapshotJobNamesTablesTheStreamReads(t *testing.T) {
	cfg := postgres.Config{Tables: pgbed.Tables, Shards: []postgres.Shard{{ID: "s1", Replicas: []postgres.ShardReplica{
		{Alias: "zone1-s1p", Cell: "zone1", Type: "PRIMARY", DSNEnv: "S1_P_DSN"}}}}}
	src, err := postgres.New(cfg, func(string) string { return "postgres://nobody@127.0.0.1:1/none" })
	require.NoError(t, err)
	defer src.Close()
	ctx := context.Background()
	require.ErrorContains(t, src.Snapshot(ctx, "s", "s1", source.SnapshotJob{ID: "j"}), "no tables")
	require.Error(t, src.Snapshot(ctx, "s", "s1", source.SnapshotJob{Tables: []string{"public.items"}}))
	require.ErrorIs(t, src.Snapshot(ctx, "s", "s9", source.SnapshotJob{ID: "j", Tables: []string{"public.items"}}), source.ErrUnknownTablet)
	require.ErrorIs(t, src.CancelSnapshot(ctx, "s", "s9", "j"), source.ErrUnknownTablet)
}

// A reader on a standby that has not replayed the job's record yet still
// copies the job: it takes the job from the primary's record.
func TestASnapshotJobIsCopiedByAStandbyThatHasNotReplayedIt(t *testing.T) {
	const stream = "lagjob"
	b, cp := latestBed(t, pgbed.Options{Shards: 1, Standbys: 1}, stream, 50, 3)
	ctx := ctxT(t, 2*time.Minute)
	sb := b.c.Shards[0].Standbys[0]
	require.NoError(t, b.c.WaitReplayed(ctx))
	resume := func() { _ = sb.Exec(context.Background(), `SELECT pg_wal_replay_resume()`) }
	t.Cleanup(resume)
	require.NoError(t, sb.Exec(ctx, `SELECT pg_wal_replay_pause()`))
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", source.SnapshotJob{ID: "j1", Tables: []string{"public.items"}}))
	defer postgres.SetSnapshotHook(func(step string) {
		if step == "watermark" { // the reader copies (it waits for the replay)
			resume()
		}
	})()
	rd := b.reader(t, b.cfg.Shards[0].Replicas[1].Alias)
	all, _ := readCopy(t, rd, stream, cp, 50)
	require.Equal(t, map[string]int{"public.items": 50}, copies(all), "the job is copied")
}

// A job recorded while the stream's start copy is under way is copied
// after it by the same reader, without waiting for another.
func TestASnapshotJobRecordedDuringTheStartCopyFollowsItInTheSameReader(t *testing.T) {
	const stream = "follow"
	b, _, start := snapshotBed(t, stream, 300)
	ctx := ctxT(t, time.Minute)
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", source.SnapshotJob{ID: "j1", Tables: []string{"public.orders"}}))
	rd := b.primaryReader(t)
	all, _ := readCopyOf(t, rd, stream, start, 50, source.CopySnapshot)
	var copied []source.Record
	for _, r := range all {
		if r.Op == source.Read {
			copied = append(copied, r)
		}
	}
	require.Len(t, copied, 300+2+2)
	require.Equal(t, map[string]int{"public.items": 300, "public.orders": 2}, copies(copied[:302]), "the start copy")
	require.Equal(t, map[string]int{"public.orders": 2}, copies(copied[302:]), "then the job's")
	require.Equal(t, "j1", rd.Copy().ID)
}

// A resync ends the shard's job: its copy takes every table, after the
// job. Nothing is copied after the resync's end marker, and the job's id
// again does nothing.
func TestAResyncEndsTheShardsSnapshotJob(t *testing.T) {
	const stream = "resyncjob"
	b, _ := latestBed(t, pgbed.Options{Shards: 1}, stream, 120, 10)
	ctx := ctxT(t, 2*time.Minute)
	job := source.SnapshotJob{ID: "j1", Tables: []string{"public.items"}}
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", job))
	start, err := b.src.Resync(ctx, stream, "s1", "r1", source.Checkpoint{})
	require.NoError(t, err)
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", job))
	rd := b.primaryReader(t)
	all, _ := read(t, rd, stream, start, -1)
	end := slices.IndexFunc(all, func(r source.Record) bool { return r.Op == source.ResyncEnd })
	require.Positive(t, end, "the resync's copy: %d records", len(all))
	require.Equal(t, map[string]int{"public.items": 120, "public.orders": 10}, copies(all[:end]))
	require.Empty(t, copies(all[end:]), "nothing is copied after the resync")
	c := rd.Copy()
	require.Equal(t, source.CopyResync, c.Kind)
	require.Equal(t, "r1", c.ID)
	require.True(t, c.Done)
	require.Equal(t, 2, c.TablesDone)
}

// itemsJob is a one-shard bed whose stream (starting at its latest) has a
// snapshot job of public.items (items rows), and a reader on the primary;
// it returns the stream's checkpoint before the job's copy.
func itemsJob(t *testing.T, stream string, items int) (*bed, *postgres.Reader, source.Checkpoint) {
	t.Helper()
	b, cp := latestBed(t, pgbed.Options{Shards: 1}, stream, items, 10)
	require.NoError(t, b.src.Snapshot(ctxT(t, time.Minute), stream, "s1", source.SnapshotJob{ID: "j1", Tables: []string{"public.items"}}))
	return b, b.primaryReader(t), cp
}

// firstChunk50 reads from cp with rd, 50 records a read, without acking,
// until a batch holds records: the job's first chunk of 50 rows. It
// returns the checkpoint that batch was read from, and the batch.
func firstChunk50(ctx context.Context, t *testing.T, rd *postgres.Reader, stream string, cp source.Checkpoint) (source.Checkpoint, source.Batch) {
	t.Helper()
	var b source.Batch
	from := cp
	for len(b.Records) == 0 {
		require.NoError(t, ctx.Err(), "no chunk in time")
		if !b.Checkpoint.IsZero() {
			from = b.Checkpoint
		}
		var err error
		b, err = rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: 50, MaxWait: 2 * time.Second})
		require.NoError(t, err)
	}
	require.Equal(t, 50, len(reads(b.Records)["public.items"]), "the first chunk")
	return from, b
}

// A read that fails after the reader returned a chunk (the run's context
// cancelled in the middle of the next chunk: the reader closes itself)
// leaves the chunk to the caller's Ack that comes after it, as a run's
// last Ack does: that Ack marks the chunk, and the next reader copies on
// after it, no row twice and none missed. (Once the failed read forgot
// the chunk, and the next reader copied it again: a whole job, when the
// run ended as its copy finished.)
func TestAChunkReturnedBeforeAFailedReadIsMarkedByTheAckAfterIt(t *testing.T) {
	const stream = "failedread"
	const items = 200
	b, rd, cp := itemsJob(t, stream, items)
	ctx := ctxT(t, 2*time.Minute)
	_, first := firstChunk50(ctx, t, rd, stream, cp)
	cp = first.Checkpoint

	readCtx, cancel := context.WithCancel(ctx)
	restore := postgres.SetSnapshotHook(func(step string) {
		if step == "selected" {
			cancel() // the next chunk is selected, and its read fails
		}
	})
	_, err := rd.GetChanges(readCtx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: cp, MaxRecords: 50, MaxWait: 2 * time.Second})
	restore()
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, rd.Ack(ctx, stream, "s1", cp), "the caller committed the first chunk")
	require.NoError(t, rd.Close())

	rd = b.primaryReader(t)
	rest, _ := readCopy(t, rd, stream, cp, 50)
	all := append(slices.Clone(first.Records), rest...)
	require.Equal(t, items, len(reads(all)["public.items"]), "every row once (copied again: the first chunk was not marked)")
	seen := map[string]bool{}
	for _, r := range reads(all)["public.items"] {
		require.False(t, seen[string(r.Key)], "row %s twice", r.Key)
		seen[string(r.Key)] = true
	}
}

// A chunk returned and then read again from before it (the caller did not
// commit it) is copied again, and an Ack that reaches its old place does
// not mark it: its rows may not be in the sink then.
func TestAChunkReadAgainFromBeforeItIsNotMarkedByAnAckAtItsOldPlace(t *testing.T) {
	const stream = "readagain"
	b, rd, cp := itemsJob(t, stream, 200)
	ctx := ctxT(t, 2*time.Minute)
	p := b.c.Shards[0].Primary
	from, first := firstChunk50(ctx, t, rd, stream, cp)
	low := pglogrepl.LSN(first.Records[0].Position.Term).String()

	again, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: 50, MaxWait: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, rd.Ack(ctx, stream, "s1", first.Checkpoint))
	var acked bool
	require.NoError(t, p.QueryRow(ctx, `SELECT acked FROM tabletflow.snapshot_chunks WHERE stream = $1 AND low_lsn = $2::pg_lsn`, stream, low).Scan(&acked))
	require.False(t, acked, "the chunk read again from before it is not marked by an Ack at its old place (%d records read again)", len(again.Records))
}

// A table removed from the stream (SetTables) while a reader copies it
// in a job is copied no further: the next chunk, selected after the
// removal, sees it unpublished, and the copy ends there, done. Its rows
// changed after the removal reach the stream neither as changes nor as
// copies. (Once a reader that had opened the job before the removal
// copied on, and a sink got an update made after it.)
func TestATableRemovedWhileAReaderCopiesItIsCopiedNoFurther(t *testing.T) {
	const stream = "removed"
	b, rd, cp := itemsJob(t, stream, 300)
	ctx := ctxT(t, 2*time.Minute)
	p := b.c.Shards[0].Primary
	first, cp := getAcked(t, rd, stream, cp, 50)
	require.Equal(t, 50, len(reads(first)["public.items"]), "the first chunk")
	require.False(t, rd.Copy().Done)

	require.NoError(t, b.src.SetTables(ctx, stream, []string{"public.orders"}, time.Now()))
	require.NoError(t, p.Exec(ctx, `UPDATE public.items SET qty = qty + 100; UPDATE public.orders SET amount = amount + 1 WHERE id = 1`))
	rest, cp := readCopy(t, rd, stream, cp, 50)
	more, _ := read(t, rd, stream, cp, -1)
	rest = append(rest, more...)
	require.True(t, rd.Copy().Done, "the copy ends with the table's removal")
	for _, r := range rest {
		require.NotEqual(t, "public.items", r.Table, "after the removal: %s %s", r.Op, r.Key)
	}
	require.True(t, slices.ContainsFunc(rest, func(r source.Record) bool { return r.Table == "public.orders" && r.Op == source.Update }),
		"the stream reads on")
}
