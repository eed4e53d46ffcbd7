package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// The source works on every PostgreSQL version it supports (decoding on
// standbys needs 16), not only on the 18 the other tests run: a stream
// is made (a slot on each replica), read from a standby and then from the
// primary with nothing lost or repeated, a snapshot is copied from a
// standby, a standby's slot invalidated is
// known as such, a dropped publication fails the tablet, and deleting the
// stream drops its slots. Each version's catalog differs
// (pg_replication_slots.invalidation_reason exists from 17 on), and
// pgoutput's behaviour too (16 and 17 fail on a missing publication, 18
// skips it). Versions other than the suite's own run here.
func TestTheSourceWorksOnEverySupportedVersion(t *testing.T) {
	suite, err := pgbed.Major(pgbed.Require(t))
	require.NoError(t, err)
	for _, major := range pgbed.Versions {
		if major == suite {
			continue // every other test runs on it
		}
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			smokeVersion(t, major, pgbed.RequireOf(t, major))
		})
	}
}

func smokeVersion(t *testing.T, major int, bin string) {
	defer postgres.SetAdvanceEvery(time.Hour)() // other slots advanced at a reader's first ack only
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1, Bin: bin})
	ctx := ctxT(t, 3*time.Minute)
	p, sb := b.c.Shards[0].Primary, b.c.Shards[0].Standbys[0]
	primary, standby := b.cfg.Shards[0].Replicas[0].Alias, b.cfg.Shards[0].Replicas[1].Alias
	var version int
	require.NoError(t, p.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&version))
	require.Equal(t, major, version)

	const stream = "smoke"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err, "PostgreSQL %d", major)
	w := b.c.StartWorkload(pgbed.WorkloadOptions{Rate: 300, Count: 200, Seed: uint64(major)})
	require.NoError(t, w.Wait())
	require.NoError(t, b.c.WaitReplayed(ctx))
	first, mid := read(t, b.reader(t, standby), stream, st.Start["s1"], 100)
	rd := b.primaryReader(t)
	rest, c1 := read(t, rd, stream, mid, -1)
	all := append(first, rest...)
	want, err := p.TextTables(ctx)
	require.NoError(t, err)
	got, err := pgbed.Replay(all)
	require.NoError(t, err)
	require.Equal(t, want, got, "replaying the records read from the standby, then the primary, gives the shard's tables")

	// A stream that starts with a snapshot copies the rows, from a standby.
	snap, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: "smokesnap", Tables: pgbed.Tables, StartFrom: source.StartSnapshot})
	require.NoError(t, err)
	copied, _ := read(t, b.reader(t, standby), "smokesnap", snap.Start["s1"], -1)
	got, err = pgbed.ReplaySnapshot(copied)
	require.NoError(t, err)
	require.Equal(t, want, got, "replaying the snapshot gives the shard's tables")
	require.NoError(t, b.src.DeleteStream(ctx, "smokesnap"))

	// The standby's slot, left behind, is invalidated by the WAL written
	// past it (its max_slot_wal_keep_size): it is known as such.
	require.NoError(t, sb.Exec(ctx, `ALTER SYSTEM SET max_slot_wal_keep_size = '16MB'`))
	require.NoError(t, sb.Exec(ctx, `SELECT pg_reload_conf()`))
	require.NoError(t, p.Exec(ctx, `CREATE TABLE public.filler (b text);
		ALTER TABLE public.filler ALTER COLUMN b SET STORAGE EXTERNAL;
		INSERT INTO public.filler SELECT repeat(md5(g::text), 100) FROM generate_series(1, 20000) g`))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (1, 1, 'b', 1, 'two')`))
	_, c2 := read(t, rd, stream, c1, 1)
	require.NoError(t, b.c.WaitReplayed(ctx))
	require.Eventually(t, func() bool {
		require.NoError(t, p.Exec(ctx, `CHECKPOINT`))
		require.NoError(t, sb.Exec(ctx, `CHECKPOINT`)) // a restartpoint removes the old WAL
		var status string
		require.NoError(t, sb.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`,
			postgres.SlotName(stream, "s1")).Scan(&status))
		return status == "lost"
	}, time.Minute, 500*time.Millisecond, "the standby's slot is invalidated")
	ask := func(alias string, from source.Checkpoint) error {
		rd, err := b.src.OpenReplica(ctx, source.Replica{Tablet: "s1", Alias: alias})
		require.NoError(t, err)
		defer rd.(*postgres.Reader).Close()
		_, err = rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: 10, MaxWait: 300 * time.Millisecond})
		return err
	}
	err = ask(standby, c2)
	require.Error(t, err)
	require.Equal(t, "SLOT_INVALIDATED", b.src.Classify(err).Reason, "%v", err)

	require.NoError(t, rd.Close())
	require.NoError(t, p.Exec(ctx, `DROP PUBLICATION `+postgres.PublicationName(stream)))
	err = ask(primary, c2)
	require.Error(t, err)
	require.Equal(t, "PUBLICATION_MISSING", b.src.Classify(err).Reason, "%v", err)

	require.NoError(t, b.src.DeleteStream(context.Background(), stream))
	for _, n := range b.c.Shards[0].Nodes() {
		var slots int
		require.NoError(t, n.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'`).Scan(&slots))
		require.Zero(t, slots, n.Name)
	}
}
