package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// bed is a test bed and a Source over it: shard i is "s<i+1>", its primary
// "zone1-s<i+1>p" and its standbys "zone2-s<i+1>a", "zone3-s<i+1>b", each
// DSN in a variable of its own.
type bed struct {
	c   *pgbed.Cluster
	src *postgres.Source
	cfg postgres.Config
}

func newBed(t *testing.T, opts pgbed.Options) *bed {
	t.Helper()
	c := pgbed.StartT(t, opts)
	env := map[string]string{}
	cfg := postgres.Config{Tables: pgbed.Tables}
	for i, sh := range c.Shards {
		id := fmt.Sprintf("s%d", i+1)
		s := postgres.Shard{ID: id}
		for j, n := range sh.Nodes() {
			cell, role, typ := fmt.Sprintf("zone%d", j+1), string(rune('a'+j-1)), "REPLICA"
			if j == 0 {
				role, typ = "p", "PRIMARY"
			}
			dsnEnv := strings.ToUpper(fmt.Sprintf("%s_%s_DSN", id, role))
			env[dsnEnv] = n.DSN()
			s.Replicas = append(s.Replicas, postgres.ShardReplica{Alias: cell + "-" + id + role, Cell: cell, Type: typ, DSNEnv: dsnEnv})
		}
		cfg.Shards = append(cfg.Shards, s)
	}
	src, err := postgres.New(cfg, func(k string) string { return env[k] })
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	return &bed{c: c, src: src, cfg: cfg}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// reader opens a replica of shard s1 by alias.
func (b *bed) reader(t *testing.T, alias string) *postgres.Reader {
	t.Helper()
	rd, err := b.src.OpenReplica(context.Background(), source.Replica{Tablet: "s1", Alias: alias})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.(*postgres.Reader).Close() })
	return rd.(*postgres.Reader)
}

// read reads from rd after from until it has at least want records, or,
// with want < 0, until two polls in a row bring nothing; it acks each
// batch. It checks that every batch holds whole transactions and that
// positions increase.
func read(t *testing.T, rd *postgres.Reader, stream string, from source.Checkpoint, want int) ([]source.Record, source.Checkpoint) {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	var out []source.Record
	empty := 0
	cp := from
	for want < 0 && empty < 2 || want >= 0 && len(out) < want {
		b := readBatch(ctx, t, rd, stream, cp, 50)
		require.GreaterOrEqual(t, b.Checkpoint.Compare(cp), 0, "the checkpoint never goes back")
		if len(b.Records) == 0 {
			empty++
		} else {
			empty = 0
			last := b.Records[len(b.Records)-1].Position
			require.Equal(t, last, b.Checkpoint, "the checkpoint is the last record's position")
			require.Equal(t, uint64(len(slices.DeleteFunc(slices.Clone(b.Records), func(r source.Record) bool { return r.Position.Term != last.Term }))),
				last.Index, "a batch ends with a whole transaction")
		}
		cp = b.Checkpoint
		out = append(out, b.Records...)
	}
	return out, cp
}

// readBatch reads one batch of at most size records from rd after from,
// checks that its positions increase from from, and acks it.
func readBatch(ctx context.Context, t *testing.T, rd *postgres.Reader, stream string, from source.Checkpoint, size int) source.Batch {
	t.Helper()
	b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: size, MaxWait: 300 * time.Millisecond})
	require.NoError(t, err)
	cp := from
	for _, r := range b.Records {
		require.Equal(t, 1, r.Position.Compare(cp), "positions increase: %s after %s", r.Position, cp)
		cp = r.Position
	}
	require.NoError(t, rd.Ack(ctx, stream, "s1", b.Checkpoint))
	return b
}

func TestStreamFromAStandbyIsExactAndMovesToAnotherReplica(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 2})
	ctx := ctxT(t, 3*time.Minute)
	const stream = "orders"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartEarliest})
	require.NoError(t, err)
	start := st.Start["s1"]
	require.False(t, start.IsZero())
	again, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartEarliest})
	require.NoError(t, err)
	require.Equal(t, start, again.Start["s1"], "EnsureStream is idempotent")

	w := b.c.StartWorkload(pgbed.WorkloadOptions{Rate: 300, Count: 400, Seed: 7})
	require.NoError(t, w.Wait())
	require.NoError(t, b.c.WaitReplayed(ctx))

	// The other replicas' slots are advanced at a reader's first ack only
	// (to c1, the first batch), so that which replica can serve what is
	// known below.
	defer postgres.SetAdvanceEvery(time.Hour)()
	standby := b.cfg.Shards[0].Replicas[1].Alias
	rd := b.reader(t, standby)
	// Two batches read, the first committed (acked) while the second is
	// being written, as in a group commit: the slots not being read are
	// advanced to the committed checkpoint c1, never past it to c2.
	get := func(from source.Checkpoint) source.Batch {
		batch, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: 50, MaxWait: 2 * time.Second})
		require.NoError(t, err)
		require.NotEmpty(t, batch.Records)
		return batch
	}
	b1 := get(start)
	b2 := get(b1.Checkpoint)
	c1 := b1.Checkpoint
	require.NoError(t, rd.Ack(ctx, stream, "s1", c1))
	for _, n := range []*pgbed.Node{b.c.Shards[0].Primary, b.c.Shards[0].Standbys[1]} {
		l, why := slotState(t, ctx, n, stream)
		require.Empty(t, why, n.Name)
		require.Equal(t, pglogrepl.LSN(c1.Term), l, "%s: the slot not read stands at the committed checkpoint (c2 %s read, not committed)",
			n.Name, pglogrepl.LSN(b2.Checkpoint.Term))
	}
	require.NoError(t, rd.Ack(ctx, stream, "s1", b2.Checkpoint))
	first := append(b1.Records, b2.Records...)
	more, mid := read(t, rd, stream, b2.Checkpoint, 300)
	first = append(first, more...)
	// The standby's slot now stands at mid (once the server took in the
	// ack): it cannot serve c1 any more (PostgreSQL would skip ahead
	// silently) and says so, while the other replicas (at c1) can.
	require.Eventually(t, func() bool {
		l, _ := slotState(t, ctx, b.c.Shards[0].Standbys[0], stream)
		return uint64(l) == mid.Term
	}, 30*time.Second, 50*time.Millisecond, "the standby's slot moves to the acked checkpoint")
	ask := func(from source.Checkpoint) error {
		_, err := b.reader(t, standby).GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: 10, MaxWait: time.Second})
		require.Error(t, err)
		return err
	}
	err = ask(c1)
	require.Equal(t, source.RetryElsewhere, b.src.Classify(err).Action, "%v", err)
	require.Equal(t, "POSITION_MISMATCH", b.src.Classify(err).Reason)
	// No replica can go back to the start: every slot is past it.
	err = ask(start)
	require.Equal(t, source.Expired, b.src.Classify(err).Action, "%v", err)

	// Another replica continues from mid: nothing lost, nothing twice.
	rest, _ := read(t, b.reader(t, b.cfg.Shards[0].Replicas[0].Alias), stream, mid, -1)
	all := append(first, rest...)
	seen := map[source.Checkpoint]bool{}
	for _, r := range all {
		require.False(t, seen[r.Position], "position %s twice", r.Position)
		seen[r.Position] = true
	}
	want, err := b.c.Shards[0].Primary.TextTables(ctx)
	require.NoError(t, err)
	got, err := pgbed.Replay(all)
	require.NoError(t, err)
	require.Equal(t, want, got, "replaying the records gives the shard's tables")
	t.Logf("%d records (workload: %+v), moved at %s", len(all), w.Stats(), mid)
}

func TestNoReplicaHoldingTheCheckpointMeansExpired(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	const stream = "lost"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	for _, n := range b.c.Shards[0].Nodes() {
		require.NoError(t, n.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, postgres.SlotName(stream, "s1")))
	}
	require.NoError(t, b.c.Shards[0].Primary.Exec(ctx, `INSERT INTO public.items VALUES (1, 1, 'x', 1, 'b')`))
	_, err = b.reader(t, b.cfg.Shards[0].Replicas[1].Alias).GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: st.Start["s1"], MaxRecords: 10, MaxWait: time.Second})
	require.Error(t, err)
	require.Equal(t, source.Expired, b.src.Classify(err).Action, "%v", err)
	require.Contains(t, err.Error(), "no replica of the shard can serve")

	// The slot was re-created on the replica read: it serves from its own
	// start on (a checkpoint past it).
	var lsn string
	require.NoError(t, b.c.Shards[0].Standbys[0].QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
		postgres.SlotName(stream, "s1")).Scan(&lsn))
	l, err := pglogrepl.ParseLSN(lsn)
	require.NoError(t, err)
	_, err = b.reader(t, b.cfg.Shards[0].Replicas[1].Alias).GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: source.Checkpoint{Term: uint64(l)}, MaxRecords: 10, MaxWait: 200 * time.Millisecond})
	require.NoError(t, err)
}

// A standby promoted (a failover's new timeline) never serves the stream's
// checkpoints, though its slot could: past the fork its WAL is not the
// stream's. The old primary, still on the stream's timeline, serves them;
// with no replica left on it (a config that lists only the promoted
// server) the tablet is Expired, and the error names the timelines.
func TestAReplicaOnAnotherTimelineNeverServesTheStreamsCheckpoints(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	const stream = "tli"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	p, sb := b.c.Shards[0].Primary, b.c.Shards[0].Standbys[0]
	primary, standby := b.cfg.Shards[0].Replicas[0].Alias, b.cfg.Shards[0].Replicas[1].Alias
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (1, 1, 'a', 1, 'one')`))
	_, c1 := read(t, b.primaryReader(t), stream, st.Start["s1"], 1) // the standby's slot advanced to c1
	require.NoError(t, b.c.WaitReplayed(ctx))
	ask := func(src *postgres.Source, alias string) error {
		rd, err := src.OpenReplica(ctx, source.Replica{Tablet: "s1", Alias: alias})
		require.NoError(t, err)
		defer rd.(*postgres.Reader).Close()
		_, err = rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: c1, MaxRecords: 10, MaxWait: 300 * time.Millisecond})
		return err
	}
	require.NoError(t, ask(b.src, standby), "on the stream's timeline the standby serves c1")

	var promoted bool
	require.NoError(t, sb.QueryRow(ctx, `SELECT pg_promote()`).Scan(&promoted)) // waits for the promotion
	require.True(t, promoted)
	err = ask(b.src, standby)
	require.Error(t, err, "the promoted standby does not serve the stream's checkpoint")
	require.Equal(t, source.RetryElsewhere, b.src.Classify(err).Action, "%v", err)
	require.Equal(t, "TIMELINE_MISMATCH", b.src.Classify(err).Reason)
	require.Contains(t, err.Error(), standby+" is on timeline 2, the stream's checkpoints are on timeline 1")
	require.NoError(t, ask(b.src, primary), "the old primary, on the stream's timeline, still serves c1")

	// After the failover the config lists the promoted server alone.
	after := postgres.Config{Tables: pgbed.Tables, Shards: []postgres.Shard{{ID: "s1",
		Replicas: []postgres.ShardReplica{{Alias: standby, Cell: "zone2", Type: "PRIMARY", DSNEnv: "S1_DSN"}}}}}
	src, err := postgres.New(after, func(string) string { return sb.DSN() })
	require.NoError(t, err)
	defer src.Close()
	err = ask(src, standby)
	require.Error(t, err)
	require.Equal(t, source.Expired, src.Classify(err).Action, "%v", err)
	require.Contains(t, err.Error(), fmt.Sprintf("no replica of the shard can serve the checkpoint at %s on timeline 1 (the slots of %s on timeline 2)",
		pglogrepl.LSN(c1.Term), standby))
}

func TestDeleteStreamDropsSlotsAndPublication(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	_, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: "gone", Tables: pgbed.Tables})
	require.NoError(t, err)
	count := func(n *pgbed.Node, q string) int {
		var k int
		require.NoError(t, n.QueryRow(ctx, q).Scan(&k))
		return k
	}
	for _, n := range b.c.Shards[0].Nodes() {
		require.Equal(t, 1, count(n, `SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'`), n.Name)
	}
	require.NoError(t, b.src.DeleteStream(ctx, "gone"))
	require.NoError(t, b.src.DeleteStream(ctx, "gone"), "deleting an absent stream is fine")
	for _, n := range b.c.Shards[0].Nodes() {
		require.Zero(t, count(n, `SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'`), n.Name)
	}
	require.Zero(t, count(b.c.Shards[0].Primary, `SELECT count(*) FROM pg_publication`))
}

func TestListTabletsReportsEachReplicasRoleAndReach(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 2, Standbys: 1})
	ctx := ctxT(t, time.Minute)
	require.NoError(t, b.c.Shards[1].Standbys[0].Stop())
	time.Sleep(1100 * time.Millisecond) // past the health cache's second
	tablets, err := b.src.ListTablets(ctx)
	require.NoError(t, err)
	require.Len(t, tablets, 2)
	got := map[string]source.Replica{}
	for _, tab := range tablets {
		for _, r := range tab.Replicas {
			got[r.Alias] = r
		}
	}
	require.True(t, got["zone1-s1p"].Healthy)
	require.Equal(t, source.TypePrimary, got["zone1-s1p"].Type)
	require.True(t, got["zone2-s1a"].Healthy)
	require.Equal(t, source.TypeReplica, got["zone2-s1a"].Type)
	require.False(t, got["zone2-s2a"].Healthy, "a stopped standby is not healthy")
	require.Equal(t, "zone2", got["zone2-s2a"].Cell)
}

// slotState is the stream's slot on a node: its confirmed position and
// why it was invalidated ("" if it was not).
func slotState(t *testing.T, ctx context.Context, n *pgbed.Node, stream string) (pglogrepl.LSN, string) {
	t.Helper()
	var lsn, reason *string
	require.NoError(t, n.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, COALESCE(invalidation_reason, CASE WHEN wal_status = 'lost' THEN 'lost' END)
		FROM pg_replication_slots WHERE slot_name = $1`, postgres.SlotName(stream, "s1")).Scan(&lsn, &reason))
	var l pglogrepl.LSN
	if lsn != nil {
		var err error
		l, err = pglogrepl.ParseLSN(*lsn)
		require.NoError(t, err)
	}
	if reason == nil {
		return l, ""
	}
	return l, *reason
}

// A shard whose published tables are idle still advances: the reader
// writes a heartbeat on the primary, which reaches the standby's slot, and
// the empty batches' checkpoint (acked) moves the slot on.
func TestAnIdleShardAdvancesItsCheckpointAndSlot(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, time.Minute)
	const stream = "idle"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	rd := b.reader(t, b.cfg.Shards[0].Replicas[1].Alias)
	cp := st.Start["s1"]
	deadline := time.Now().Add(30 * time.Second)
	for cp.Compare(st.Start["s1"]) <= 0 {
		require.True(t, time.Now().Before(deadline), "the checkpoint of an idle shard advances within 30s")
		batch, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: cp, MaxRecords: 10, MaxWait: 500 * time.Millisecond})
		require.NoError(t, err)
		require.Empty(t, batch.Records, "no change to the published tables")
		cp = batch.Checkpoint
	}
	require.Zero(t, cp.Index, "an idle advance is a position between transactions")
	require.NoError(t, rd.Ack(ctx, stream, "s1", cp))
	require.Eventually(t, func() bool {
		l, _ := slotState(t, ctx, b.c.Shards[0].Standbys[0], stream)
		return uint64(l) == cp.Term
	}, 10*time.Second, 100*time.Millisecond, "the standby's slot moves to the acked checkpoint")
	stats, err := rd.SlotStats(ctx, stream)
	require.NoError(t, err)
	require.GreaterOrEqual(t, stats.LagBytes, int64(0))
	require.Equal(t, int64(-1), stats.SafeWALBytes, "no max_slot_wal_keep_size: no limit")
}

// A standby's slot invalidated (WAL past max_slot_wal_keep_size while it
// was not read) is never used again: the reader re-makes it, and the new
// slot serves only checkpoints at or after its start.
func TestAnInvalidatedSlotIsRemadeAndNeverUsedBelowItsStart(t *testing.T) {
	defer postgres.SetAdvanceEvery(time.Hour)()
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	const stream = "inval"
	p, sb := b.c.Shards[0].Primary, b.c.Shards[0].Standbys[0]
	// Only the standby limits what its slots may hold.
	require.NoError(t, sb.Exec(ctx, `ALTER SYSTEM SET max_slot_wal_keep_size = '16MB'`))
	require.NoError(t, sb.Exec(ctx, `SELECT pg_reload_conf()`))
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (1, 1, 'a', 1, 'one')`))
	primary := b.reader(t, b.cfg.Shards[0].Replicas[0].Alias)
	_, c1 := read(t, primary, stream, st.Start["s1"], 1) // the standby's slot advanced to c1 (first ack)
	stats, err := b.reader(t, b.cfg.Shards[0].Replicas[1].Alias).SlotStats(ctx, stream)
	require.NoError(t, err)
	require.Positive(t, stats.SafeWALBytes, "the standby's slot may hold a bounded amount more")

	// 64 MB of WAL in a table the stream does not publish, then a change
	// it does; the primary's slot follows, the standby's stays at c1.
	require.NoError(t, p.Exec(ctx, `CREATE TABLE public.filler (b text);
		ALTER TABLE public.filler ALTER COLUMN b SET STORAGE EXTERNAL;
		INSERT INTO public.filler SELECT repeat(md5(g::text), 100) FROM generate_series(1, 20000) g`))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (2, 1, 'b', 1, 'two')`))
	_, c2 := read(t, primary, stream, c1, 1)
	require.NoError(t, b.c.WaitReplayed(ctx))
	require.Eventually(t, func() bool {
		require.NoError(t, p.Exec(ctx, `CHECKPOINT`))
		require.NoError(t, sb.Exec(ctx, `CHECKPOINT`)) // a restartpoint removes the old WAL
		_, why := slotState(t, ctx, sb, stream)
		return why != ""
	}, time.Minute, 500*time.Millisecond, "the standby's slot is invalidated")

	standby := b.cfg.Shards[0].Replicas[1].Alias
	ask := func(from source.Checkpoint) error {
		_, err := b.reader(t, standby).GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: 10, MaxWait: 300 * time.Millisecond})
		return err
	}
	err = ask(c2)
	require.Error(t, err)
	require.Equal(t, source.RetryElsewhere, b.src.Classify(err).Action, "%v", err)
	require.Equal(t, "SLOT_INVALIDATED", b.src.Classify(err).Reason)
	start, why := slotState(t, ctx, sb, stream)
	require.Empty(t, why, "the slot was made anew")
	require.Greater(t, uint64(start), c2.Term, "the new slot starts after the checkpoint")
	err = ask(c2)
	require.Error(t, err, "the new slot does not serve a checkpoint before its start")
	require.Equal(t, "POSITION_MISMATCH", b.src.Classify(err).Reason)

	// Once the checkpoint passes the new slot's start, it serves again.
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (3, 1, 'c', 1, 'three')`))
	_, c3 := read(t, primary, stream, c2, 1)
	require.Greater(t, c3.Term, uint64(start))
	require.NoError(t, b.c.WaitReplayed(ctx))
	require.NoError(t, ask(c3))
}

// startFrom "snapshot": the rows the tables already hold are copied as
// Read records in chunks woven into the change log, while the rows keep
// changing (updates leaving TOASTed values unchanged among them), across a
// crash of the reader mid-copy and a move to another replica; replaying
// everything gives the shard's tables.
func TestSnapshotCopiesExistingRowsConsistentlyAcrossACrash(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 3*time.Minute)
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.orders SELECT g, 'c' || g, g * 1.5, CASE WHEN g % 10 = 0 THEN repeat('n', 3000) END, now()
		FROM generate_series(1, 1200) g`))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'sku' || g, g % 7, CASE WHEN g % 5 = 0 THEN repeat('b', 3000) END
		FROM generate_series(1, 800) g`))
	const stream = "snap"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartSnapshot})
	require.NoError(t, err)

	// Changes to the rows being copied, and new rows, while the copy runs.
	churn := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < 300 && err == nil; i++ {
			switch i % 3 {
			case 0:
				err = p.Exec(ctx, `UPDATE public.orders SET amount = amount + 1 WHERE id = $1`, 1+i*7%1200)
			case 1:
				err = p.Exec(ctx, `UPDATE public.items SET qty = qty + 1 WHERE id = $1`, 1+i*11%800) // body left as it is
			default:
				err = p.Exec(ctx, `DELETE FROM public.items WHERE id = $1`, 1+i*13%800)
			}
			time.Sleep(5 * time.Millisecond) // spreads the changes over the copy
		}
		churn <- err
	}()
	load := b.c.StartWorkload(pgbed.WorkloadOptions{Rate: 100, Count: 150, Seed: 9})

	first, cp := read(t, b.reader(t, b.cfg.Shards[0].Replicas[1].Alias), stream, st.Start["s1"], 900)
	// The reader dies mid-copy; another, on the primary, resumes from the
	// committed checkpoint.
	require.NoError(t, <-churn)
	require.NoError(t, load.Wait())
	require.NoError(t, b.c.WaitReplayed(ctx))
	rest, _ := read(t, b.reader(t, b.cfg.Shards[0].Replicas[0].Alias), stream, cp, -1)
	all := append(first, rest...)
	reads := 0
	for _, r := range all {
		if r.Op == source.Read {
			reads++
		}
	}
	t.Logf("%d records, %d of them read by the snapshot; crash at %s", len(all), reads, cp)
	require.GreaterOrEqual(t, reads, 1800, "the existing rows were copied")
	want, err := p.TextTables(ctx)
	require.NoError(t, err)
	got, err := pgbed.ReplaySnapshot(all)
	require.NoError(t, err)
	require.Equal(t, want, got, "replaying the snapshot and the changes gives the shard's tables")
}

// snapshotBed is a one-shard bed (primary only) whose tables hold rows
// before a snapshot stream starts: items 1…items, orders 1…2.
func snapshotBed(t *testing.T, stream string, items int) (b *bed, primary *pgbed.Node, start source.Checkpoint) {
	t.Helper()
	b = newBed(t, pgbed.Options{Shards: 1})
	ctx := ctxT(t, time.Minute)
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'sku' || g, 1, 'b' FROM generate_series(1, $1::int) g`, items))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.orders SELECT g, 'c' || g, g, NULL, now() FROM generate_series(1, 2) g`))
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartSnapshot})
	require.NoError(t, err)
	return b, p, st.Start["s1"]
}

// primaryReader opens a reader on shard s1's primary.
func (b *bed) primaryReader(t *testing.T) *postgres.Reader {
	return b.reader(t, b.cfg.Shards[0].Replicas[0].Alias)
}

// firstChunk has rd read a snapshot stream's first chunk (items 1…3), and
// acks it.
func firstChunk(t *testing.T, rd *postgres.Reader, stream string, start source.Checkpoint) ([]source.Record, source.Checkpoint) {
	t.Helper()
	first, cp := getAcked(t, rd, stream, start, 3)
	require.Len(t, first, 3)
	return first, cp
}

// getAcked asks rd for up to max records after from and acks the batch;
// a read that found nothing within its wait (a loaded machine's walsender
// or snapshot select can take longer) is acked and asked again, for up to
// a minute. It returns the first batch that brings records.
func getAcked(t *testing.T, rd *postgres.Reader, stream string, from source.Checkpoint, max int) ([]source.Record, source.Checkpoint) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	var b source.Batch
	for len(b.Records) == 0 {
		require.NoError(t, ctx.Err(), "no records after %s within a minute", from)
		var err error
		b, err = rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: max, MaxWait: 2 * time.Second})
		require.NoError(t, err)
		require.NoError(t, rd.Ack(ctx, stream, "s1", b.Checkpoint))
		from = b.Checkpoint
	}
	return b.Records, b.Checkpoint
}

// A transaction whose commit is the very next WAL record after a chunk's
// watermark comes after the chunk, and is still read when a reader resumes
// from the chunk's checkpoint: the chunk's position must not skip the
// record that starts where the watermark ends.
func TestAChangeCommittedRightAfterAChunksWatermarkSurvivesARestart(t *testing.T) {
	const stream = "wm"
	b, p, start := snapshotBed(t, stream, 6)
	ctx := ctxT(t, time.Minute)
	first, cp := firstChunk(t, b.primaryReader(t), stream, start)

	// An update of a row already copied, written now and committed right
	// after the next chunk's watermark.
	tx, err := p.Connect(ctx)
	require.NoError(t, err)
	defer tx.Close(ctx)
	_, err = tx.Exec(ctx, `BEGIN; UPDATE public.items SET qty = 99 WHERE id = 1`)
	require.NoError(t, err)
	committed := false
	defer postgres.SetSnapshotHook(func(step string) {
		if step == "watermark" && !committed {
			committed = true
			_, err := tx.Exec(ctx, `COMMIT`)
			require.NoError(t, err)
		}
	})()
	rd := b.primaryReader(t)
	chunk, cp := getAcked(t, rd, stream, cp, 3) // items 4…6, alone in its batch
	require.True(t, committed)
	require.Len(t, chunk, 3)
	require.Equal(t, source.Read, chunk[0].Op)
	require.NoError(t, rd.Close()) // the reader dies; another resumes from the chunk

	rest, _ := read(t, b.primaryReader(t), stream, cp, -1)
	all := slices.Concat(first, chunk, rest)
	want, err := p.TextTables(ctx)
	require.NoError(t, err)
	got, err := pgbed.ReplaySnapshot(all)
	require.NoError(t, err)
	require.Equal(t, want, got, "the update committed right after the watermark is read after the restart: %v", rest)
}

// syncRepOn names a synchronous standby that does not exist on p, with
// synchronous_commit 'local' for everyone who does not ask for more, and
// waits until the setting is in force. A reload reaches the server's
// processes one by one, and whether a commit waits for a standby is
// decided by the checkpointer's copy of synchronous_standby_names: a
// commit made before the checkpointer has it does not wait (seen under
// load, when a test's hanging commit went through at once). In force
// means a probe commit waited for the standby (a commit waits only if it
// wrote WAL: the probe creates a temporary table that its commit drops);
// the probe is then cancelled, which commits it locally.
func syncRepOn(t *testing.T, p *pgbed.Node) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	require.NoError(t, p.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'ghost'`))
	require.NoError(t, p.Exec(ctx, `ALTER SYSTEM SET synchronous_commit = 'local'`))
	require.NoError(t, p.Exec(ctx, `SELECT pg_reload_conf()`))
	t.Cleanup(func() {
		for _, q := range []string{`ALTER SYSTEM RESET synchronous_standby_names`, `ALTER SYSTEM RESET synchronous_commit`, `SELECT pg_reload_conf()`} {
			_ = p.Exec(context.Background(), q)
		}
	})
	require.Eventually(t, func() bool {
		waited, release, done := syncRepCommit(t, p, `CREATE TEMP TABLE syncrep_probe () ON COMMIT DROP`, 2*time.Second)
		release()
		<-done
		return waited
	}, 30*time.Second, 50*time.Millisecond, "a commit waits for the synchronous standby")
}

// syncRepCommit runs sql on a connection of its own with synchronous_commit
// 'on' and waits up to within for its commit to wait for the synchronous
// standby (syncRepOn names one that never answers), or to end. It returns
// whether the commit waited; release cancels the wait, which makes the
// commit visible; done reports the statement's end.
func syncRepCommit(t *testing.T, p *pgbed.Node, sql string, within time.Duration) (waited bool, release func(), done <-chan error) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	conn, err := p.Connect(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var pid int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	ch := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, `SET synchronous_commit = 'on'; `+sql)
		_ = conn.Close(context.Background())
		ch <- err
	}()
	for deadline := time.Now().Add(within); !waited && len(ch) == 0 && time.Now().Before(deadline); {
		var ev *string
		err := p.QueryRow(ctx, `SELECT wait_event FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&ev)
		if errors.Is(err, pgx.ErrNoRows) {
			break // the statement ended and its session closed between two looks: it did not wait
		}
		require.NoError(t, err)
		waited = ev != nil && *ev == "SyncRep"
		if !waited {
			time.Sleep(20 * time.Millisecond)
		}
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = p.Exec(context.Background(), `SELECT pg_cancel_backend($1)`, pid) }) }
	t.Cleanup(release) // before the bed stops: a server waits for such a session at shutdown
	return waited, release, ch
}

// hangingCommit runs sql in a transaction on p whose commit is written and
// flushed but stays invisible to everyone else: it waits for the synchronous
// standby syncRepOn named (only that session asks for one). release ends
// the wait (the commit becomes visible); done reports the end.
func hangingCommit(t *testing.T, p *pgbed.Node, sql string) (release func(), done <-chan error) {
	t.Helper()
	waited, release, done := syncRepCommit(t, p, sql, 30*time.Second)
	require.True(t, waited, "the commit waits for the synchronous standby")
	return release, done
}

// A transaction whose commit is in the WAL before a chunk's watermark but
// not yet visible when the chunk is selected (on a primary a commit becomes
// visible only after its record is flushed and, here, acknowledged by a
// synchronous standby that never answers) must not be overwritten by the
// chunk's older copy of its rows: the chunk waits until it is visible.
func TestAChunkNeverHoldsRowsOlderThanAChangeBeforeItsWatermark(t *testing.T) {
	const stream = "vis"
	b, p, start := snapshotBed(t, stream, 6)
	ctx := ctxT(t, time.Minute)
	syncRepOn(t, p)
	release, committed := hangingCommit(t, p, `UPDATE public.items SET qty = 99 WHERE id = 1`)
	var qty int
	require.NoError(t, p.QueryRow(ctx, `SELECT qty FROM public.items WHERE id = 1`).Scan(&qty))
	require.Equal(t, 1, qty, "the update is not visible yet")

	// Released once a select waits for it, or else (no wait: the fault)
	// after the second select, so that the first missed it.
	selects := 0
	defer postgres.SetSnapshotHook(func(step string) {
		if step == "selected" {
			selects++
		}
		if step == "waiting" || selects == 2 {
			release()
		}
	})()
	all, _ := read(t, b.primaryReader(t), stream, start, -1)
	require.NoError(t, <-committed, "the commit was released from its wait")
	want, err := p.TextTables(ctx)
	require.NoError(t, err)
	require.Equal(t, "99", want["public.items"][`{"id":1}`]["qty"])
	got, err := pgbed.ReplaySnapshot(all)
	require.NoError(t, err)
	require.Equal(t, want, got, "no chunk overwrote the update with an older copy: %v", all)
}

// The same across a restart: a reader was delivered the invisible commit
// (it came after its chunk's watermark), handed it out and died; the next
// reader does not get that commit from its log, yet must not select a
// chunk that misses it.
func TestAChunkAfterARestartWaitsForACommitTheLogAlreadyDelivered(t *testing.T) {
	const stream = "vis2"
	b, p, start := snapshotBed(t, stream, 4)
	ctx := ctxT(t, time.Minute)
	syncRepOn(t, p)
	a := b.primaryReader(t)
	first, cp := firstChunk(t, a, stream, start)

	// Right after the next chunk's select (item 4), an update of an order
	// (copied later) commits and stays invisible. It is released once the
	// second reader waits for it, or else (no wait: the fault) once that
	// reader has selected its second chunk, the orders.
	var release func()
	var committed <-chan error
	var mu sync.Mutex
	selects, restarted := 0, 0
	defer postgres.SetSnapshotHook(func(step string) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case step == "waiting" && restarted > 0:
			release()
		case step == "selected" && restarted > 0:
			if restarted++; restarted == 3 {
				release()
			}
		case step == "selected":
			if selects++; selects == 1 {
				release, committed = hangingCommit(t, p, `UPDATE public.orders SET amount = 99 WHERE id = 1`)
			}
		}
	})()
	// One record per batch: item 4, then the update (before the next
	// chunk, of no rows, is delivered); the reader dies.
	second, cp := getAcked(t, a, stream, cp, 1)
	require.Equal(t, source.Read, second[0].Op)
	third, cp := getAcked(t, a, stream, cp, 1)
	require.Equal(t, source.Update, third[0].Op)
	got := slices.Concat(second, third)
	require.NoError(t, a.Close())
	mu.Lock()
	restarted = 1
	mu.Unlock()
	rest, _ := read(t, b.primaryReader(t), stream, cp, -1)
	require.NoError(t, <-committed)
	want, err := p.TextTables(ctx)
	require.NoError(t, err)
	require.Equal(t, "99", want["public.orders"][`{"id":1}`]["amount"])
	all := slices.Concat(first, got, rest)
	replayed, err := pgbed.ReplaySnapshot(all)
	require.NoError(t, err)
	require.Equal(t, want, replayed, "no chunk overwrote the update with an older copy: %v", all)

	// Deleting the stream deletes what the copy kept on the primary.
	require.Positive(t, progressRows(t, p, stream))
	require.NoError(t, b.src.DeleteStream(ctx, stream))
	require.Zero(t, progressRows(t, p, stream))
}

// progressRows counts what a stream's copies keep on primary p.
func progressRows(t *testing.T, p *pgbed.Node, stream string) (n int) {
	t.Helper()
	require.NoError(t, p.QueryRow(ctxT(t, 30*time.Second), `SELECT (SELECT count(*) FROM tabletflow.snapshot_chunks WHERE stream = $1)
		+ (SELECT count(*) FROM tabletflow.snapshot_delivered WHERE stream = $1)`, stream).Scan(&n))
	return n
}

// A reader on a standby that has not replayed the stream's record yet (the
// primary writes it last, after every slot) still copies the snapshot: it
// asks the primary whether the stream begins with one.
func TestASnapshotIsCopiedByAStandbyThatHasNotReplayedTheStreamsRecord(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	p, sb := b.c.Shards[0].Primary, b.c.Shards[0].Standbys[0]
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'sku' || g, 1, 'b' FROM generate_series(1, 5) g`))
	require.NoError(t, b.c.WaitReplayed(ctx))
	const stream = "lag"
	resume := func() { _ = sb.Exec(context.Background(), `SELECT pg_wal_replay_resume()`) }
	t.Cleanup(resume)
	defer postgres.SetSnapshotHook(func(step string) {
		switch step {
		case "meta": // every slot made: the standby stops replaying
			require.NoError(t, sb.Exec(ctx, `SELECT pg_wal_replay_pause()`))
		case "watermark": // the reader started and copies (it waits for the replay)
			resume()
		}
	})()
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartSnapshot})
	require.NoError(t, err)
	all, _ := read(t, b.reader(t, b.cfg.Shards[0].Replicas[1].Alias), stream, st.Start["s1"], -1)
	reads := slices.DeleteFunc(slices.Clone(all), func(r source.Record) bool { return r.Op != source.Read })
	require.Len(t, reads, 5, "the rows are copied: %v", all)
}

// A batch cut short by a pause in the walsender's flow (here: decoding a
// large transaction the stream does not publish) is not caught up, so
// the GetChanges activity reads on at once instead of lingering for a
// group commit; one that ends where the walsender waits for more WAL is.
func TestOnlyABatchThatReachedTheEndOfTheWALIsCaughtUp(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 3*time.Minute)
	const stream = "caughtup"
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, `CREATE TABLE public.filler (id bigint, pad text)`))
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables, StartFrom: source.StartEarliest})
	require.NoError(t, err)
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.orders (id, customer) VALUES (1, 'first')`))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.filler SELECT g, repeat('x', 100) FROM generate_series(1, 300000) g`))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.orders (id, customer) VALUES (2, 'last')`))
	require.NoError(t, b.c.WaitReplayed(ctx))

	rd := b.reader(t, b.cfg.Shards[0].Replicas[1].Alias)
	req := source.ChangesRequest{Stream: stream, Tablet: "s1", From: st.Start["s1"], MaxRecords: 1000, MaxWait: 30 * time.Second}
	first, err := rd.GetChanges(ctx, req)
	require.NoError(t, err)
	require.Len(t, first.Records, 1, "the first order alone: the filler takes the walsender longer than the reader's 20 ms linger")
	require.False(t, first.CaughtUp, "the walsender was still decoding the WAL after the first order")
	req.From = first.Checkpoint
	last, err := rd.GetChanges(ctx, req)
	require.NoError(t, err)
	require.Len(t, last.Records, 1, "the last order")
	require.True(t, last.CaughtUp, "after the last order the walsender waits for WAL")
}
