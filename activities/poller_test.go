package activities

import (
	"context"
	"errors"
	"sync/atomic"
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
		time.Hour, time.Now, zap.NewNop(), nil, nil)
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

// The acknowledgement that reaches the end of a backlog goes out at once,
// though the one before it went out just now (acknowledgements are
// otherwise at most one per ackEvery): the source hears at once that the
// tablet has caught up. The trickle that follows keeps the pace.
func TestPollerAcknowledgesTheEndOfABacklogAtOnce(t *testing.T) {
	src := &fakeSource{log: &callLog{}, poll: func(ctx context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
		switch n {
		case 0:
			b := batch(1, 3) // full: a backlog
			b.CaughtUp = false
			return b, nil
		case 1:
			return batch(4, 5), nil // the rest, caught up: the backlog ends here
		case 2:
			return batch(6, 6), nil // a trickle
		}
		<-ctx.Done()
		return source.Batch{}, ctx.Err()
	}}
	rd, err := src.OpenReplica(context.Background(), source.Replica{Tablet: testTablet, Alias: testAlias})
	require.NoError(t, err)
	// The linger is short enough for the trickle's read to come within the
	// test, far shorter than ackEvery.
	var busy atomic.Int32 // the reads that found a backlog
	p := startPoller(context.Background(), rd, source.ChangesRequest{Stream: "s", Tablet: testTablet, MaxRecords: 3, MaxWait: time.Second},
		100*time.Millisecond, time.Now, zap.NewNop(), nil, func() { busy.Add(1) })
	defer p.stop()
	acked := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(ackEvery / 2)
		for len(src.log.list()) < len(want) {
			require.True(t, time.Now().Before(deadline), "acknowledged %v, want %v within half of ackEvery", src.log.list(), want)
			time.Sleep(5 * time.Millisecond)
		}
		require.Equal(t, want, src.log.list())
	}
	backlog := <-p.out
	require.NoError(t, backlog.err)
	p.ack(backlog.batch.Checkpoint)
	acked("ack 1.3") // the first of a run: at once
	rest := <-p.out
	require.NoError(t, rest.err)
	p.ack(rest.batch.Checkpoint)
	acked("ack 1.3", "ack 1.5")
	trickle := <-p.out
	require.NoError(t, trickle.err)
	p.ack(trickle.batch.Checkpoint)
	require.Never(t, func() bool { return len(src.log.list()) > 2 }, ackEvery/2, 10*time.Millisecond,
		"a trickle's commit was acknowledged before ackEvery passed")
	require.Equal(t, int32(1), busy.Load(), "the full read, and only it, told the worker it is busy")
}

// At the end of a backlog a read that finds nothing returns within
// ackPoll while the source has yet to hear of what was handed over,
// though an acknowledgement went out just now (they are otherwise at most
// one per ackEvery): the source hears soon after the commit that the
// tablet caught up. Once it has, an idle replica's read waits up to
// maxWait, to the grid the worker's tablets share (one call per maxWait is
// what an idle tablet costs).
func TestPollerWaitsBrieflyAtTheEndOfABacklog(t *testing.T) {
	const maxWait = time.Minute
	firstAcked := make(chan struct{}) // the second read returns after the first commit
	src := &fakeSource{log: &callLog{}, poll: func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
		if n < 2 {
			if n == 1 {
				<-firstAcked
			}
			b := batch(uint64(3*n+1), uint64(3*n+3)) // full: a backlog
			b.CaughtUp = false
			return b, nil
		}
		return nothingMore(ctx, req)
	}}
	rd, err := src.OpenReplica(context.Background(), source.Replica{Tablet: testTablet, Alias: testAlias})
	require.NoError(t, err)
	p := startPoller(context.Background(), rd, source.ChangesRequest{Stream: "s", Tablet: testTablet, MaxRecords: 3, MaxWait: maxWait},
		time.Hour, time.Now, zap.NewNop(), nil, nil)
	defer p.stop()
	first := <-p.out
	require.NoError(t, first.err)
	p.ack(first.batch.Checkpoint) // the first of the run: at once, before the third read
	close(firstAcked)
	last := <-p.out
	require.NoError(t, last.err)
	empty := <-p.out // read while the backlog's last commit is not acknowledged
	require.Equal(t, []string{"ack 1.3"}, src.log.list())
	require.NoError(t, empty.err)
	require.Empty(t, empty.batch.Records)
	reqs := src.requests()
	requireIdleWait(t, maxWait, reqs[0], src.sentAt()[0], "nothing owed yet: the first read waits up to maxWait, to the grid")
	require.Equal(t, ackPoll, reqs[2].MaxWait, "the backlog's last acknowledgement owed: a short read")

	p.ack(last.batch.Checkpoint) // committed
	deadline := time.Now().Add(5 * time.Second)
	for len(src.log.list()) < 2 {
		require.True(t, time.Now().Before(deadline), "the end of the backlog was not acknowledged")
		select {
		case <-p.out: // the short reads go on until it is
		case <-time.After(5 * time.Millisecond):
		}
	}
	require.Equal(t, []string{"ack 1.3", "ack 1.6"}, src.log.list())
	require.Eventually(t, func() bool {
		reqs := src.requests()
		return reqs[len(reqs)-1].MaxWait > ackPoll
	}, 5*time.Second, 5*time.Millisecond, "once acknowledged, the idle read waits longer")
	reqs, sent := src.requests(), src.sentAt()
	requireIdleWait(t, maxWait, reqs[len(reqs)-1], sent[len(reqs)-1], "once acknowledged, the idle read waits up to maxWait, to the grid")
}

// requireIdleWait checks an idle read's wait: more than half of maxWait,
// at most maxWait, and ending on a multiple of half of it (onGrid), the
// grid the worker's tablets share.
func requireIdleWait(t *testing.T, maxWait time.Duration, req source.ChangesRequest, sent time.Time, msg string) {
	t.Helper()
	require.Greater(t, req.MaxWait, maxWait/2, msg)
	require.LessOrEqual(t, req.MaxWait, maxWait, msg)
	end := time.Duration(sent.Add(req.MaxWait).UnixNano() % int64(maxWait/2))
	require.True(t, end < 50*time.Millisecond || end > maxWait/2-50*time.Millisecond,
		"%s: ends %v past a multiple of maxWait/2", msg, end)
}

// A trickle's acknowledgements keep their pace (one per ackEvery): while
// one is owed but not due, an empty read waits until it is due, not
// ackPoll (an idle PostgreSQL shard's checkpoint advances without
// records every few seconds) and not the whole maxWait.
func TestPollerWaitsUntilATricklesAcknowledgementIsDue(t *testing.T) {
	const maxWait = time.Minute
	src := &fakeSource{log: &callLog{}, poll: func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
		switch n {
		case 0:
			return batch(1, 2), nil // a trickle, caught up
		case 1:
			return batch(3, 3), nil
		}
		return nothingMore(ctx, req)
	}}
	rd, err := src.OpenReplica(context.Background(), source.Replica{Tablet: testTablet, Alias: testAlias})
	require.NoError(t, err)
	p := startPoller(context.Background(), rd, source.ChangesRequest{Stream: "s", Tablet: testTablet, MaxRecords: 100, MaxWait: maxWait},
		10*time.Millisecond, time.Now, zap.NewNop(), nil, nil)
	defer p.stop()
	first := <-p.out
	require.NoError(t, first.err)
	p.ack(first.batch.Checkpoint) // the first of the run: at once
	require.Eventually(t, func() bool { return len(src.log.list()) == 1 }, 5*time.Second, 5*time.Millisecond)
	second := <-p.out
	require.NoError(t, second.err)
	p.ack(second.batch.Checkpoint) // owed, due ackEvery after the first
	require.Eventually(t, func() bool { return len(src.requests()) >= 3 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"ack 1.2"}, src.log.list())
	wait := src.requests()[2].MaxWait
	require.Greater(t, wait, ackEvery/2, "a trickle's owed acknowledgement is not due yet: no short read")
	require.LessOrEqual(t, wait, ackEvery, "the read returns when the acknowledgement is due, not after maxWait")
}

// nothingMore is a read of a caught-up replica with nothing more to
// give: it waits req.MaxWait, as a replica does, and returns no records.
func nothingMore(ctx context.Context, req source.ChangesRequest) (source.Batch, error) {
	select {
	case <-time.After(req.MaxWait):
		return source.Batch{Checkpoint: req.From, CaughtUp: true}, nil
	case <-ctx.Done():
		return source.Batch{}, ctx.Err()
	}
}

// lossReader is a reader whose connection can be lost (source.LossWatcher).
type lossReader struct {
	source.ReplicaReader
	lost chan struct{}
}

func (r lossReader) Lost(context.Context) <-chan struct{} { return r.lost }

// A lingering poller whose connection is lost (the server went down)
// reads again at once, not at the end of the linger: the read fails and
// the tablet moves on without waiting out the group commit.
func TestALingeringPollerReadsAtOnceWhenItsConnectionIsLost(t *testing.T) {
	src := &fakeSource{log: &callLog{}, poll: func(ctx context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
		if n == 0 {
			return batch(1, 2), nil // a trickle, caught up: the poller lingers
		}
		return source.Batch{}, errors.New("connection refused")
	}}
	rd, err := src.OpenReplica(context.Background(), source.Replica{Tablet: testTablet, Alias: testAlias})
	require.NoError(t, err)
	lr := lossReader{ReplicaReader: rd, lost: make(chan struct{})}
	p := startPoller(context.Background(), lr, source.ChangesRequest{Stream: "s", Tablet: testTablet, MaxRecords: 100, MaxWait: time.Second},
		time.Hour, time.Now, zap.NewNop(), nil, nil)
	defer p.stop()
	first := <-p.out
	require.NoError(t, first.err)
	require.Len(t, src.requests(), 1, "lingering: no second read yet")
	close(lr.lost)
	select {
	case next := <-p.out:
		require.ErrorContains(t, next.err, "connection refused")
	case <-time.After(10 * time.Second):
		t.Fatal("the poller went on lingering after its connection was lost")
	}
}

// countingLossReader counts its watches (source.LossWatcher); the first
// firesFirst of them have fired already (the connection was lost), the
// others never fire.
type countingLossReader struct {
	source.ReplicaReader
	firesFirst int32
	watches    atomic.Int32
}

func (r *countingLossReader) Lost(ctx context.Context) <-chan struct{} {
	lost := make(chan struct{})
	if r.watches.Add(1) <= r.firesFirst {
		close(lost)
	}
	return lost
}

// readsOf takes n reads from p, each without an error.
func readsOf(t *testing.T, p *poller, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case got := <-p.out:
			require.NoError(t, got.err)
		case <-time.After(10 * time.Second):
			t.Fatalf("read %d did not come", i+1)
		}
	}
}

// A poller watches its connection once for all its lingers, not once a
// linger: each watch is a goroutine, a context and a gRPC state
// subscription, and a live tablet lingers every batch.
func TestAPollerWatchesItsConnectionOnceForAllItsLingers(t *testing.T) {
	src := &fakeSource{log: &callLog{}, poll: func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
		return batch(uint64(2*n+1), uint64(2*n+2)), nil // a trickle, caught up, every read: the poller lingers each time
	}}
	rd, err := src.OpenReplica(context.Background(), source.Replica{Tablet: testTablet, Alias: testAlias})
	require.NoError(t, err)
	lr := &countingLossReader{ReplicaReader: rd}
	p := startPoller(context.Background(), lr, source.ChangesRequest{Stream: "s", Tablet: testTablet, MaxRecords: 100, MaxWait: time.Second},
		time.Millisecond, time.Now, zap.NewNop(), nil, nil)
	defer p.stop()
	readsOf(t, p, 5)
	require.Equal(t, int32(1), lr.watches.Load(), "watches of the connection over five lingers")
}

// A watch that fired is not selected on again (a closed channel would end
// every later linger at once): the next linger watches afresh, and
// lingers on that watch.
func TestAPollerWatchesAfreshAfterItsConnectionWasLost(t *testing.T) {
	src := &fakeSource{log: &callLog{}, poll: func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
		return batch(uint64(2*n+1), uint64(2*n+2)), nil // a trickle, caught up, every read
	}}
	rd, err := src.OpenReplica(context.Background(), source.Replica{Tablet: testTablet, Alias: testAlias})
	require.NoError(t, err)
	lr := &countingLossReader{ReplicaReader: rd, firesFirst: 1}
	p := startPoller(context.Background(), lr, source.ChangesRequest{Stream: "s", Tablet: testTablet, MaxRecords: 100, MaxWait: time.Second},
		time.Millisecond, time.Now, zap.NewNop(), nil, nil)
	defer p.stop()
	readsOf(t, p, 5)
	require.Equal(t, int32(2), lr.watches.Load(), "watches: the one that fired, then one for the lingers after it")
}
