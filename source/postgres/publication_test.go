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

// A publication dropped, or no longer publishing a table of source.tables
// (or one of inserts, updates, deletes), never makes an empty stream: on
// PostgreSQL 18 pgoutput skips a missing publication with only a warning,
// and a table left out is never sent. Every reader start checks it, and
// the tablet fails naming what is missing. A standby that has not yet
// replayed the primary's latest change to the publication still reads:
// the primary has the last word.
func TestAMissingPublicationFailsTheTabletRatherThanStreamingNothing(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	const stream = "nopub"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	p, sb := b.c.Shards[0].Primary, b.c.Shards[0].Standbys[0]
	primary, standby := b.cfg.Shards[0].Replicas[0].Alias, b.cfg.Shards[0].Replicas[1].Alias
	pub := postgres.PublicationName(stream)
	ask := func(alias string) error {
		rd, err := b.src.OpenReplica(ctx, source.Replica{Tablet: "s1", Alias: alias})
		require.NoError(t, err)
		defer rd.(*postgres.Reader).Close()
		_, err = rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: st.Start["s1"], MaxRecords: 10, MaxWait: 300 * time.Millisecond})
		return err
	}
	requireFailed := func(alias, says string) {
		t.Helper()
		err := ask(alias)
		require.Error(t, err, "%s: a reader of a stream whose publication %s fails", alias, says)
		c := b.src.Classify(err)
		require.Equal(t, source.Fatal, c.Action, "%v", err)
		require.Equal(t, "PUBLICATION_MISSING", c.Reason)
		require.Contains(t, err.Error(), says)
	}

	require.NoError(t, p.Exec(ctx, `ALTER PUBLICATION `+pub+` DROP TABLE public.items`))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (1, 1, 'a', 1, 'one')`))
	require.NoError(t, b.c.WaitReplayed(ctx))
	requireFailed(primary, fmt.Sprintf("publication %s on %s does not publish public.items", pub, primary))
	requireFailed(standby, fmt.Sprintf("publication %s on %s does not publish public.items", pub, primary))

	// The standby has not replayed the table's return yet: it reads.
	require.NoError(t, sb.Exec(ctx, `SELECT pg_wal_replay_pause()`))
	t.Cleanup(func() { _ = sb.Exec(context.Background(), `SELECT pg_wal_replay_resume()`) })
	require.NoError(t, p.Exec(ctx, `ALTER PUBLICATION `+pub+` ADD TABLE public.items`))
	var onStandby int
	require.NoError(t, sb.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'items'`, pub).Scan(&onStandby))
	require.Zero(t, onStandby, "the standby has not replayed the table's return")
	require.NoError(t, ask(standby), "the primary publishes every table: the standby has yet to replay it")
	require.NoError(t, sb.Exec(ctx, `SELECT pg_wal_replay_resume()`))

	require.NoError(t, p.Exec(ctx, `ALTER PUBLICATION `+pub+` SET (publish = 'insert')`))
	require.NoError(t, b.c.WaitReplayed(ctx))
	requireFailed(primary, "does not publish updates, deletes")

	require.NoError(t, p.Exec(ctx, `DROP PUBLICATION `+pub))
	require.NoError(t, b.c.WaitReplayed(ctx))
	for _, alias := range []string{primary, standby} {
		requireFailed(alias, fmt.Sprintf("publication %s on %s does not exist", pub, primary))
	}
}
