package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// An acknowledgement that fails (the replication connection lost) makes
// the reader reconnect where it goes on reading: after the last batch it
// handed out, which the sink has not committed. The server is never told
// that position: here that batch's commit then fails, and the tablet
// resumes from the sink's checkpoint on its only replica, losing nothing.
func TestAFailedAckNeverConfirmsWhatTheSinkHasNotCommitted(t *testing.T) {
	defer postgres.SetStatusEvery(0)() // the committed position goes out after every read
	b := newBed(t, pgbed.Options{Shards: 1})
	ctx := ctxT(t, time.Minute)
	const stream = "ackfail"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	p := b.c.Shards[0].Primary
	for i := 1; i <= 3; i++ {
		require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES ($1, 1, 'a', 1, 'x')`, i))
	}
	get := func(rd *postgres.Reader, from source.Checkpoint) source.Batch {
		t.Helper()
		batch, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: from, MaxRecords: 1, MaxWait: 5 * time.Second})
		require.NoError(t, err)
		require.Len(t, batch.Records, 1)
		return batch
	}
	rd := b.primaryReader(t)
	b1 := get(rd, st.Start["s1"])
	b2 := get(rd, b1.Checkpoint) // handed out; the sink commits b1 while it writes b2
	postgres.BreakConnection(rd)
	require.Error(t, rd.Ack(ctx, stream, "s1", b1.Checkpoint), "the acknowledgement of b1 fails: the connection is gone")
	get(rd, b2.Checkpoint) // the reader goes on after b2, on a new connection
	require.NoError(t, rd.Close())

	// Once the session has ended, the slot holds every position it was told.
	var confirmed string
	require.Eventually(t, func() bool {
		var free bool
		require.NoError(t, p.QueryRow(ctx, `SELECT active_pid IS NULL, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
			postgres.SlotName(stream, "s1")).Scan(&free, &confirmed))
		return free
	}, 30*time.Second, 20*time.Millisecond, "the reader's session lets go of the slot")
	l, _ := slotState(t, ctx, p, stream)
	require.LessOrEqual(t, uint64(l), b1.Checkpoint.Term, "the slot (at %s) is confirmed no further than the committed b1 (b2, not committed, ends at %s)",
		confirmed, b2.Checkpoint)

	// The sink's commit of b2 fails: the tablet resumes from b1, the sink's
	// checkpoint, on its only replica, and reads b2 again.
	again := get(b.primaryReader(t), b1.Checkpoint)
	require.Equal(t, b2.Records[0].Position, again.Records[0].Position)
}
