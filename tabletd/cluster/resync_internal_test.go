package cluster

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

// A resync waits for a change the workload made (its row already changed)
// but has not yet put in its tablet's log, so that the copy holds the
// change and the change is before the copy's start: the rows copied are
// exactly the log's at the start, never ahead of it.
func TestResyncWaitsForAChangeOnItsWayToTheLog(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Rate, cfg.Tablets, cfg.Seed = 0, 1, 3
	c, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	_, err = c.createStream(&sourcepb.CreateStreamRequest{Stream: "s"})
	require.NoError(t, err)
	c.Write(10)

	// A change in flight, as generate leaves it between the workload's
	// lock and the log.
	w := c.workload
	w.mu.Lock()
	r, h := w.next()
	w.routing.Add(1)
	w.mu.Unlock()

	type result struct {
		resp *sourcepb.ResyncStreamResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := c.Resync("s", "t-0001", "")
		done <- result{resp, err}
	}()
	select {
	case <-done:
		t.Fatal("the resync did not wait for the change in flight")
	case <-time.After(100 * time.Millisecond):
	}
	c.route(r, h)
	w.routing.Done()
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, "1.11", r.Position, "the change went to the log first")
	require.Equal(t, "1.11", res.resp.Start, "and the copy starts after it")
}
