package activities

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/source"
)

// A poller lingering after a small read acknowledges a commit at once
// (the first of its run), not after the linger: the source hears where
// the tablet is without waiting for the next read.
func TestLingeringPollerAcknowledgesACommitAtOnce(t *testing.T) {
	src := &fakeSource{log: &callLog{}, poll: func(ctx context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
		if n == 0 {
			return batch(1, 2), nil // a trickle, caught up: the poller lingers
		}
		<-ctx.Done()
		return source.Batch{}, ctx.Err()
	}}
	rd, err := src.OpenReplica(context.Background(), source.Replica{Tablet: testTablet, Alias: testAlias})
	require.NoError(t, err)
	p := startPoller(context.Background(), rd, source.ChangesRequest{Stream: "s", Tablet: testTablet, MaxRecords: 100, MaxWait: time.Second},
		time.Hour, time.Now, zap.NewNop(), nil)
	defer p.stop()
	first := <-p.out
	require.NoError(t, first.err)
	p.ack(first.batch.Checkpoint)
	deadline := time.Now().Add(5 * time.Second)
	for len(src.log.list()) == 0 {
		require.True(t, time.Now().Before(deadline), "the commit was not acknowledged while the poller lingered")
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, []string{"ack 1.2"}, src.log.list())
	require.Len(t, src.requests(), 1, "still lingering: no second read")
}
