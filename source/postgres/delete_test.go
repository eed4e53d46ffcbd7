package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// stop with dropSourceStream drops what it can reach: with a standby
// down, the other replicas' slots, every shard's publication and the
// other shards go, and the error names what is left (retried, as a
// server down is); once the standby is back, deleting again drops its
// slot too.
func TestDeleteStreamDropsWhatItCanReachAndNamesWhatIsLeft(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 2, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	const stream = "left"
	_, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	count := func(n *pgbed.Node, q string) int {
		var k int
		require.NoError(t, n.QueryRow(ctx, q).Scan(&k))
		return k
	}
	down := b.c.Shards[0].Standbys[0]
	downAlias := b.cfg.Shards[0].Replicas[1].Alias
	require.NoError(t, down.Stop())

	err = b.src.DeleteStream(ctx, stream)
	require.Error(t, err, "a slot is left")
	require.Contains(t, err.Error(), "slot "+postgres.SlotName(stream, "s1")+" on "+downAlias)
	require.Equal(t, source.RetrySame, b.src.Classify(err).Action, "%v", err)
	for _, n := range b.c.Nodes() {
		if n == down {
			continue
		}
		require.Zero(t, count(n, `SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'`), "%s: its slot was dropped", n.Name)
		if !n.IsStandby() {
			require.Zero(t, count(n, `SELECT count(*) FROM pg_publication`), "%s: its publication was dropped", n.Name)
		}
	}

	require.NoError(t, down.Start(ctx))
	require.NoError(t, b.src.DeleteStream(ctx, stream), "the rest goes once the standby is back")
	require.Zero(t, count(down, `SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'`))
	require.NoError(t, b.src.DeleteStream(context.Background(), stream), "deleting an absent stream is fine")
}
