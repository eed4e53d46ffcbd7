package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// The replication connection stays answered while reading pauses between
// two reads (a sink commit that takes 10 s, past the server's
// wal_sender_timeout of 5 s): the walsender does not hang up, and the next
// read goes on, on the same connection, instead of failing and charging
// the replica for it.
func TestTheReplicationConnectionIsAnsweredWhileReadingPauses(t *testing.T) {
	defer postgres.SetWalSenderTimeout(5 * time.Second)()
	b := newBed(t, pgbed.Options{Shards: 1})
	ctx := ctxT(t, time.Minute)
	const stream = "pause"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (1, 1, 'a', 1, 'x')`))
	rd := b.primaryReader(t)
	first, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: st.Start["s1"], MaxRecords: 10, MaxWait: 5 * time.Second})
	require.NoError(t, err)
	require.Len(t, first.Records, 1)
	var pid int
	require.NoError(t, p.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, postgres.SlotName(stream, "s1")).Scan(&pid))

	// The sink's commit of the batch takes 10 s (the scenario, not a wait
	// for a result); meanwhile a change comes.
	time.Sleep(10 * time.Second)
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (2, 1, 'b', 1, 'y')`))
	require.NoError(t, rd.Ack(ctx, stream, "s1", first.Checkpoint))
	next, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: first.Checkpoint, MaxRecords: 10, MaxWait: 5 * time.Second})
	require.NoError(t, err, "the connection outlived the pause")
	require.Len(t, next.Records, 1)
	var still int
	require.NoError(t, p.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, postgres.SlotName(stream, "s1")).Scan(&still))
	require.Equal(t, pid, still, "the same walsender serves the slot: the reader did not connect again")
}
