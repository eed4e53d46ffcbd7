package activities

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
)

// trickleReader hands out one small batch, then long-polls until stopped,
// and records its acknowledgements.
type trickleReader struct {
	mu    sync.Mutex
	reads int
	acked []source.Checkpoint
}

func (r *trickleReader) GetChanges(ctx context.Context, req source.ChangesRequest) (source.Batch, error) {
	r.mu.Lock()
	r.reads++
	n := r.reads
	r.mu.Unlock()
	if n == 1 {
		return source.Batch{Records: sinktest.Records(testTablet, 1, 2), Checkpoint: cp(2), CaughtUp: true}, nil
	}
	<-ctx.Done()
	return source.Batch{}, ctx.Err()
}

func (r *trickleReader) Ack(_ context.Context, _, _ string, c source.Checkpoint) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acked = append(r.acked, c)
	return nil
}

func (r *trickleReader) acks() []source.Checkpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]source.Checkpoint(nil), r.acked...)
}

// A poller lingering after a small read acknowledges a commit at once
// (the first of its run), not after the linger: the source hears where
// the tablet is without waiting for the next read.
func TestLingeringPollerAcknowledgesACommitAtOnce(t *testing.T) {
	rd := &trickleReader{}
	p := startPoller(context.Background(), rd, source.ChangesRequest{Stream: "s", Tablet: testTablet, MaxRecords: 100, MaxWait: time.Second},
		time.Hour, time.Now, zap.NewNop(), nil)
	defer p.stop()
	first := <-p.out
	require.NoError(t, first.err)
	p.ack(first.batch.Checkpoint)
	deadline := time.Now().Add(5 * time.Second)
	for len(rd.acks()) == 0 {
		require.True(t, time.Now().Before(deadline), "the commit was not acknowledged while the poller lingered")
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, []source.Checkpoint{cp(2)}, rd.acks())
	rd.mu.Lock()
	require.Equal(t, 1, rd.reads, "still lingering: no second read")
	rd.mu.Unlock()
}
