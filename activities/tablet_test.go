package activities

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/temporalclient"
)

// activityEnv returns an activity test environment for r's GetChanges,
// with the heartbeat spy. bg, if not nil, is the activity's parent
// context (cancel it to cancel the activity). The environment sets no
// heartbeat timeout, so GetChanges records heartbeats only per batch.
func (r *rig) activityEnv(bg context.Context) *testsuite.TestActivityEnvironment {
	var s testsuite.WorkflowTestSuite
	s.SetLogger(temporalclient.Quiet{})
	env := s.NewTestActivityEnvironment()
	opts := worker.Options{Interceptors: []interceptor.WorkerInterceptor{r.spy}, BackgroundActivityContext: bg}
	env.SetWorkerOptions(opts)
	env.RegisterActivity(r.a)
	return env
}

// run executes GetChanges in env.
func (r *rig) run(env *testsuite.TestActivityEnvironment, in GetChangesInput) (GetChangesResult, error) {
	val, err := env.ExecuteActivity(r.a.GetChanges, in)
	if err != nil {
		return GetChangesResult{}, err
	}
	var res GetChangesResult
	require.NoError(r.t, val.Get(&res))
	return res, nil
}

// requireTyped checks that err is the non-retryable ApplicationError typ
// and returns its details.
func requireTyped(t *testing.T, err error, typ string) ErrorDetails {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, typ, appErr.Type(), "error: %v", err)
	require.True(t, appErr.NonRetryable(), "a %s error is not retried by the RetryPolicy, which would count it against the replica", typ)
	var d ErrorDetails
	require.NoError(t, appErr.Details(&d))
	return d
}

func TestGetChangesCommitsThenHeartbeatsAndAcksEachBatch(t *testing.T) {
	r := newRig(t)
	r.script(batch(1, 3), batch(4, 6))
	res, err := r.run(r.activityEnv(context.Background()), input())
	require.NoError(t, err)

	// Each commit is heartbeat; the poller acknowledges between its polls
	// the latest commit so far (one ack may cover several commits), and
	// the last one before the run returns; no ack precedes its commit.
	log := r.log.list()
	var acks, rest []string
	for _, e := range log {
		if strings.HasPrefix(e, "ack ") {
			acks = append(acks, e)
			requireBefore(t, log, "commit "+strings.TrimPrefix(e, "ack "), e)
		} else {
			rest = append(rest, e)
		}
	}
	require.Equal(t, []string{"open t-0001", "commit 1.3", "heartbeat 1.3", "commit 1.6", "heartbeat 1.6"}, rest)
	require.Equal(t, "ack 1.6", acks[len(acks)-1])
	require.Equal(t, GetChangesResult{Checkpoint: cp(6), Records: 6, Batches: 2, CaughtUp: true, Stopped: StoppedRunEnded}, res)
	require.Len(t, r.mem.records(testTablet), 6)
}

// requireBefore checks that entry a comes before entry b in log.
func requireBefore(t *testing.T, log []string, a, b string) {
	t.Helper()
	i, j := slices.Index(log, a), slices.Index(log, b)
	require.True(t, i >= 0 && j >= 0 && i < j, "%q before %q in %q", a, b, log)
}

func TestGetChangesResumesFromTheLatestOfHeartbeatSinkAndInput(t *testing.T) {
	tests := []struct {
		name       string
		start      source.Checkpoint // in.Start
		checkpoint source.Checkpoint // in.Checkpoint, the workflow's
		heartbeat  *Heartbeat        // an earlier attempt's details
		stored     source.Checkpoint // the sink's
		wantFrom   source.Checkpoint
		wantCounts [2]int64 // records, batches: the earlier attempts' plus this one's (2 records, 1 batch)
	}{
		// A split's child starts from its hand-off: the input is the
		// latest, the sink holds nothing yet.
		{name: "input: split child at its hand-off", start: cp(40), checkpoint: cp(40),
			wantFrom: cp(40), wantCounts: [2]int64{2, 1}},
		// The workflow's checkpoint lags the sink (its last run's result was
		// lost): the sink's is the latest.
		{name: "sink: ahead of the input", checkpoint: cp(4), stored: cp(9),
			wantFrom: cp(9), wantCounts: [2]int64{2, 1}},
		// An earlier attempt of this run committed past the input and
		// heartbeat it: resume there, counting what it committed.
		{name: "heartbeat: ahead of the input", checkpoint: cp(4),
			heartbeat: &Heartbeat{Checkpoint: cp(8), Records: 4, Batches: 2}, stored: cp(8),
			wantFrom: cp(8), wantCounts: [2]int64{6, 3}},
		// An earlier attempt committed once more but died before its
		// heartbeat: the sink's checkpoint is the latest.
		{name: "sink: ahead of the heartbeat", checkpoint: cp(4),
			heartbeat: &Heartbeat{Checkpoint: cp(8), Records: 4, Batches: 2}, stored: cp(12),
			wantFrom: cp(12), wantCounts: [2]int64{6, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			if !tt.stored.IsZero() {
				r.mem.set(testTablet, tt.stored)
			}
			r.script(batch(tt.wantFrom.Index+1, tt.wantFrom.Index+2))
			env := r.activityEnv(context.Background())
			if tt.heartbeat != nil {
				env.SetHeartbeatDetails(*tt.heartbeat)
			}
			in := input()
			in.Start, in.Checkpoint = tt.start, tt.checkpoint
			res, err := r.run(env, in)
			require.NoError(t, err)

			reqs := r.src.requests()
			require.NotEmpty(t, reqs)
			require.Equal(t, tt.wantFrom, reqs[0].From, "the first poll's position")
			require.Equal(t, cp(tt.wantFrom.Index+2), res.Checkpoint)
			require.Equal(t, cp(tt.wantFrom.Index+2), r.mem.checkpoint(testTablet))
			require.Equal(t, tt.wantCounts, [2]int64{res.Records, res.Batches})
		})
	}
}

func TestGetChangesReturnsFencedWhenTheCommitIsFenced(t *testing.T) {
	r := newRig(t)
	r.script(batch(1, 3), batch(4, 6))
	r.mem.onCommit = func(n int, _ source.Checkpoint) error {
		if n == 1 { // another writer commits behind this one's back
			r.mem.set(testTablet, cp(5))
		}
		return nil
	}
	_, err := r.run(r.activityEnv(context.Background()), input())

	d := requireTyped(t, err, ErrFenced)
	require.ErrorContains(t, err, sink.ErrFenced.Error())
	require.Equal(t, ErrorDetails{Reason: "FENCED", Replica: testAlias, Checkpoint: cp(3), Records: 3, Batches: 1}, d,
		"the checkpoint is this writer's last commit, the counts what it committed")
	log := r.log.list()
	require.ElementsMatch(t, []string{"open t-0001", "commit 1.3", "ack 1.3", "heartbeat 1.3"}, log,
		"nothing of the fenced batch is acked or heartbeat")
	requireBefore(t, log, "commit 1.3", "ack 1.3")
}

func TestGetChangesReturnsAtABatchBoundaryAfterTheCommitWhenCancelled(t *testing.T) {
	r := newRig(t)
	bg, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.src.poll = func(ctx context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
		switch n {
		case 0:
			return batch(1, 3), nil
		case 1: // the cancellation arrives while this batch is on its way
			cancel()
			<-ctx.Done()
			return batch(4, 6), nil
		}
		t.Errorf("poll %d after the cancellation", n)
		return source.Batch{}, ctx.Err()
	}
	res, err := r.run(r.activityEnv(bg), input())
	require.NoError(t, err)

	require.Equal(t, "cancelled", res.Stopped)
	require.Equal(t, cp(3), res.Checkpoint, "the run ends at its last commit; the batch in flight at the cancellation is read again by the next run")
	require.Equal(t, int64(1), res.Batches)
	require.Equal(t, cp(3), r.mem.checkpoint(testTablet))
	log := r.log.list()
	require.ElementsMatch(t, []string{"open t-0001", "commit 1.3", "ack 1.3", "heartbeat 1.3"}, log)
	requireBefore(t, log, "commit 1.3", "ack 1.3")
}

// TestGetChangesReturnsSinkUnavailableWhenTheSinkCannotTakeWritesNow: a
// held lock (on the real JSONL sink) or an I/O error is the sink's
// trouble, not the replica's: a non-retryable SinkUnavailable, never a
// plain error the RetryPolicy would count against the replica.
func TestGetChangesReturnsSinkUnavailableWhenTheSinkCannotTakeWritesNow(t *testing.T) {
	t.Run("lock held", func(t *testing.T) {
		r := newRig(t)
		dir := t.TempDir()
		other, err := jsonl.New(dir, testStream)
		require.NoError(t, err)
		defer other.Close()
		held, err := other.Open(context.Background(), testTablet)
		require.NoError(t, err)
		defer held.Close()
		r.snk, err = jsonl.New(dir, testStream)
		require.NoError(t, err)
		defer r.snk.Close()

		in := input()
		in.Checkpoint = cp(4)
		_, err = r.run(r.activityEnv(context.Background()), in)
		d := requireTyped(t, err, ErrSinkUnavailable)
		require.ErrorContains(t, err, sink.ErrLocked.Error())
		require.Equal(t, ErrorDetails{Reason: "SINK_LOCKED", Replica: testAlias, Checkpoint: cp(4)}, d)
		require.Empty(t, r.src.requests(), "nothing was read")
	})
	t.Run("disk full at commit", func(t *testing.T) {
		r := newRig(t)
		r.script(batch(1, 3), batch(4, 6))
		r.mem.onCommit = func(n int, _ source.Checkpoint) error {
			if n == 1 {
				return &fs.PathError{Op: "write", Path: "t-0001.jsonl", Err: syscall.ENOSPC}
			}
			return nil
		}
		_, err := r.run(r.activityEnv(context.Background()), input())
		d := requireTyped(t, err, ErrSinkUnavailable)
		require.Equal(t, ErrorDetails{Reason: "SINK_IO", Replica: testAlias, Checkpoint: cp(3), Records: 3, Batches: 1}, d)
	})
}

// TestGetChangesReturnsSinkFailedWhenTheSinkCannotTakeTheTablet: a
// corrupt sink, a record it cannot store, or a sink that lost committed
// data fails the tablet with the reason, whatever replica it reads.
func TestGetChangesReturnsSinkFailedWhenTheSinkCannotTakeTheTablet(t *testing.T) {
	tests := []struct {
		name       string
		setup      func(t *testing.T, r *rig, in *GetChangesInput, env *testsuite.TestActivityEnvironment)
		wantReason string
		wantCP     source.Checkpoint // ErrorDetails.Checkpoint
		wantMsg    string            // part of the error's message
		wantPolls  int
		// What the run committed before (ErrorDetails.Records, Batches).
		wantRecords, wantBatches int64
	}{
		// The JSONL sink holds data whose manifest is gone.
		{name: "corrupt sink", setup: func(t *testing.T, r *rig, in *GetChangesInput, _ *testsuite.TestActivityEnvironment) {
			dir := t.TempDir()
			useJSONL(t, r, dir)
			w, err := r.snk.Open(context.Background(), testTablet)
			require.NoError(t, err)
			require.NoError(t, w.Write(context.Background(), sinktest.Records(testTablet, 1, 3)))
			require.NoError(t, w.Commit(context.Background(), cp(3)))
			require.NoError(t, w.Close())
			require.NoError(t, os.Remove(filepath.Join(dir, testTablet+".manifest.json")))
			in.Checkpoint = cp(3)
		}, wantReason: "SINK_CORRUPT", wantCP: cp(3), wantMsg: "t-0001.jsonl holds"},
		// A record the JSONL sink cannot write (an unknown op), in the
		// second batch: the first stays committed.
		{name: "bad record", setup: func(t *testing.T, r *rig, _ *GetChangesInput, _ *testsuite.TestActivityEnvironment) {
			useJSONL(t, r, t.TempDir())
			bad := batch(4, 6)
			bad.Records[1].Op = "upsert"
			r.script(batch(1, 3), bad)
		}, wantReason: "SINK_BAD_RECORD", wantCP: cp(3), wantMsg: "upsert", wantPolls: 2, wantRecords: 3, wantBatches: 1},
		// The sink is behind the workflow's checkpoint: records are gone
		// from it (restored from an old backup, say).
		{name: "sink behind the workflow", setup: func(_ *testing.T, r *rig, in *GetChangesInput, _ *testsuite.TestActivityEnvironment) {
			r.mem.set(testTablet, cp(5))
			in.Checkpoint = cp(9)
		}, wantReason: "SINK_BEHIND", wantCP: cp(9), wantMsg: "sink checkpoint 1.5 is behind the workflow's 1.9"},
		// The sink holds nothing, but the workflow has read past the start.
		{name: "empty sink, tablet past its start", setup: func(_ *testing.T, _ *rig, in *GetChangesInput, _ *testsuite.TestActivityEnvironment) {
			in.Checkpoint = cp(9)
		}, wantReason: "SINK_BEHIND", wantCP: cp(9), wantMsg: "sink checkpoint none is behind the workflow's 1.9"},
		// A split child whose sink is empty although it read past its
		// hand-off.
		{name: "empty sink, split child past its hand-off", setup: func(_ *testing.T, _ *rig, in *GetChangesInput, _ *testsuite.TestActivityEnvironment) {
			in.Start, in.Checkpoint = cp(40), cp(45)
		}, wantReason: "SINK_BEHIND", wantCP: cp(45), wantMsg: "behind the workflow's 1.45"},
		// The sink is behind what an earlier attempt of this run committed
		// (its heartbeat), though not behind the workflow's checkpoint.
		{name: "sink behind an earlier attempt", setup: func(_ *testing.T, r *rig, in *GetChangesInput, env *testsuite.TestActivityEnvironment) {
			r.mem.set(testTablet, cp(5))
			in.Checkpoint = cp(2)
			env.SetHeartbeatDetails(Heartbeat{Checkpoint: cp(9), Records: 9, Batches: 3})
		}, wantReason: "SINK_BEHIND", wantCP: cp(9), wantMsg: "sink checkpoint 1.5 is behind", wantRecords: 9, wantBatches: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			in := input()
			env := r.activityEnv(context.Background())
			tt.setup(t, r, &in, env)
			_, err := r.run(env, in)

			d := requireTyped(t, err, ErrSinkFailed)
			require.Equal(t, ErrorDetails{Reason: tt.wantReason, Replica: testAlias, Checkpoint: tt.wantCP, Records: tt.wantRecords, Batches: tt.wantBatches}, d)
			require.ErrorContains(t, err, tt.wantMsg)
			// The poller may have sent the next poll before the commit failed.
			if polls := len(r.src.requests()); tt.wantPolls == 0 {
				require.Zero(t, polls, "nothing was read")
			} else {
				require.GreaterOrEqual(t, polls, tt.wantPolls)
			}
		})
	}
}

// useJSONL makes r's activity write to a JSONL sink over dir.
func useJSONL(t *testing.T, r *rig, dir string) {
	s, err := jsonl.New(dir, testStream)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	r.snk = s
}

// TestGetChangesReturnsSourceRetrySameErrorsPlain: a transient source
// error stays a plain retryable error (the RetryPolicy retries it on the
// same replica and counts it), with a heartbeat saying why for the next
// attempt.
func TestGetChangesReturnsSourceRetrySameErrorsPlain(t *testing.T) {
	r := newRig(t)
	r.src.poll = func(_ context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
		if n == 0 {
			return batch(1, 3), nil
		}
		return source.Batch{}, errSourceDown
	}
	_, err := r.run(r.activityEnv(context.Background()), input())

	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.False(t, appErr.NonRetryable())
	require.NotContains(t, NonRetryable, appErr.Type())
	beats := r.spy.heartbeats()
	require.Equal(t, Heartbeat{Checkpoint: cp(3), Records: 3, Batches: 1, LastError: errSourceDown.Error(),
		LastSuccess: r.clock.now()}, beats[len(beats)-1].hb)
}

// getChangesWorkflow runs GetChanges once with a heartbeat timeout: the
// activity test environment cannot set one, the workflow one can, and it
// fails an activity whose heartbeats stop for longer.
func getChangesWorkflow(ctx workflow.Context, in GetChangesInput, heartbeatTimeout time.Duration) (GetChangesResult, error) {
	var a *Activities
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		HeartbeatTimeout:    heartbeatTimeout,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var res GetChangesResult
	err := workflow.ExecuteActivity(ctx, a.GetChanges, in).Get(ctx, &res)
	return res, err
}

// TestGetChangesHeartbeatsThroughSlowStartupPollsAndCommits: while start-up,
// a poll or a commit takes twice the heartbeat timeout, heartbeats are
// recorded at least every third of the timeout, carrying the last
// committed checkpoint (never the one in flight), and the attempt does not
// time out.
func TestGetChangesHeartbeatsThroughSlowStartupPollsAndCommits(t *testing.T) {
	const (
		heartbeatTimeout = 1500 * time.Millisecond
		slow             = 2 * heartbeatTimeout
		// Scheduling slack on a loaded machine, over the third.
		slack = 250 * time.Millisecond
	)
	// block waits out the slow part, between the times it records.
	block := func(ctx context.Context, from, to *atomic.Pointer[time.Time]) {
		began := time.Now()
		from.Store(&began)
		select {
		case <-time.After(slow):
		case <-ctx.Done():
		}
		ended := time.Now()
		to.Store(&ended)
	}
	tests := []struct {
		name   string
		rig    func(r *rig, from, to *atomic.Pointer[time.Time])
		wantCP source.Checkpoint // what heartbeats during the slow part carry
	}{
		// Opening the sink (a start-up check) is slow.
		{name: "startup", rig: func(r *rig, from, to *atomic.Pointer[time.Time]) {
			r.mem.onOpen = func(ctx context.Context) error { block(ctx, from, to); return nil }
			r.script(batch(1, 3))
		}, wantCP: source.Checkpoint{}},
		// The second poll is slow (a long poll on a quiet tablet, a slow
		// replica).
		{name: "poll", rig: func(r *rig, from, to *atomic.Pointer[time.Time]) {
			r.src.poll = func(ctx context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
				if n == 1 {
					block(ctx, from, to)
					r.clock.end()
					return batch(4, 6), nil
				}
				return batch(1, 3), nil
			}
		}, wantCP: cp(3)},
		// The second commit is slow.
		{name: "commit", rig: func(r *rig, from, to *atomic.Pointer[time.Time]) {
			r.script(batch(1, 3), batch(4, 6))
			r.mem.onCommit = func(n int, _ source.Checkpoint) error {
				if n == 1 {
					block(context.Background(), from, to)
				}
				return nil
			}
		}, wantCP: cp(3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			var from, to atomic.Pointer[time.Time]
			tt.rig(r, &from, &to)
			var s testsuite.WorkflowTestSuite
			s.SetLogger(temporalclient.Quiet{})
			env := s.NewTestWorkflowEnvironment()
			env.SetTestTimeout(time.Minute)
			env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{r.spy}})
			var sent atomic.Int32
			env.SetOnActivityHeartbeatListener(func(*activity.Info, converter.EncodedValues) { sent.Add(1) })
			env.RegisterWorkflow(getChangesWorkflow)
			env.RegisterActivity(r.a)

			env.ExecuteWorkflow(getChangesWorkflow, input(), heartbeatTimeout)
			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError(), "no heartbeat timeout")
			var res GetChangesResult
			require.NoError(t, env.GetWorkflowResult(&res))
			require.Equal(t, StoppedRunEnded, res.Stopped)

			require.NotNil(t, from.Load())
			require.NotNil(t, to.Load())
			start, end := *from.Load(), *to.Load()
			last := start
			var during []Heartbeat
			for _, b := range r.spy.heartbeats() {
				if b.at.Before(start) || b.at.After(end) {
					continue
				}
				require.LessOrEqual(t, b.at.Sub(last), heartbeatTimeout/3+slack, "gap before the heartbeat at %v", b.at.Sub(start))
				last = b.at
				during = append(during, b.hb)
			}
			require.LessOrEqual(t, end.Sub(last), heartbeatTimeout/3+slack, "gap before the slow part ended")
			require.GreaterOrEqual(t, len(during), int(slow/(heartbeatTimeout/3))-1)
			for _, hb := range during {
				require.Equal(t, tt.wantCP, hb.Checkpoint, "a heartbeat carries the last committed checkpoint, never the one in flight")
			}
			require.GreaterOrEqual(t, sent.Load(), int32(2), "heartbeats reached the (test) server")
		})
	}
}

// A trickle's next read is on the worker's shared grid of lingers, at
// least an eighth of a linger away: tablets in step read exactly every
// linger, and one joining waits at most one and an eighth.
func TestLingerForWaitsForTheNextSharedMultipleOfTheLinger(t *testing.T) {
	const linger = 500 * time.Millisecond
	grid := time.Unix(1_800_000_000, 0) // a multiple of the linger
	for _, c := range []struct {
		after, want time.Duration
	}{
		{0, linger}, // in step: one linger
		{10 * time.Millisecond, 490 * time.Millisecond},  // just after a multiple: the next one
		{260 * time.Millisecond, 240 * time.Millisecond}, // the next is an eighth of a linger away or more
		{437 * time.Millisecond, 63 * time.Millisecond},
		{438 * time.Millisecond, 562 * time.Millisecond}, // the next is too close: the one after
		{499 * time.Millisecond, 501 * time.Millisecond},
	} {
		got := lingerFor(grid.Add(c.after), linger)
		require.Equal(t, c.want, got, "%v after a multiple", c.after)
		require.Zero(t, grid.Add(c.after+got).UnixNano()%int64(linger), "lands on a multiple")
	}
}

// The group commit: after a read that brought records but fewer than
// batch.maxRecords, the next read waits batch.linger, so it brings what
// arrived meanwhile at once; a full read is followed at once.
func TestGetChangesLingersAfterASmallReadOnly(t *testing.T) {
	withLinger := func(maxRecords int, linger time.Duration) GetChangesInput {
		in := input()
		d := config.Duration(linger)
		in.Batch.MaxRecords, in.Batch.Linger = maxRecords, &d
		return in
	}
	// timed records when each poll is sent (the real clock), then serves
	// batches like script.
	timed := func(r *rig, batches ...source.Batch) *[]time.Time {
		var mu sync.Mutex
		var at []time.Time
		r.src.poll = func(ctx context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
			mu.Lock()
			at = append(at, time.Now())
			mu.Unlock()
			if n >= len(batches) {
				r.clock.end()
				<-ctx.Done()
				return source.Batch{}, ctx.Err()
			}
			return batches[n], nil
		}
		return &at
	}
	t.Run("a small read: the next one waits the linger", func(t *testing.T) {
		r := newRig(t)
		at := timed(r, batch(1, 1), batch(2, 3))
		res, err := r.run(r.activityEnv(context.Background()), withLinger(100, 300*time.Millisecond))
		require.NoError(t, err)
		require.GreaterOrEqual(t, len(*at), 2)
		require.GreaterOrEqual(t, (*at)[1].Sub((*at)[0]), 300*time.Millisecond/8, "at least an eighth of a linger (lingerFor)")
		require.Equal(t, cp(3), res.Checkpoint)
		require.Len(t, r.mem.records(testTablet), 3)
	})
	t.Run("a full read: the next one at once", func(t *testing.T) {
		r := newRig(t)
		timed(r, batch(1, 2), batch(3, 4))
		// A linger of an hour: the run ends only if full reads do not wait.
		_, err := r.runWithin(t, withLinger(2, time.Hour), "a full read was followed by the linger")
		require.NoError(t, err)
		require.Equal(t, cp(4), r.mem.checkpoint(testTablet))
	})
	t.Run("a small read that is not caught up: the next one at once", func(t *testing.T) {
		// A PostgreSQL read ends before a transaction that would not fit:
		// fewer than maxRecords, with more waiting. Lingering there made a
		// backlog drain one small batch per linger.
		r := newRig(t)
		partial := func(from, to uint64) source.Batch {
			b := batch(from, to)
			b.CaughtUp = false
			return b
		}
		timed(r, partial(1, 1), partial(2, 3))
		_, err := r.runWithin(t, withLinger(100, time.Hour), "a read with more waiting was followed by the linger")
		require.NoError(t, err)
		require.Equal(t, cp(3), r.mem.checkpoint(testTablet))
	})
	t.Run("an empty read: the next one at once", func(t *testing.T) {
		r := newRig(t)
		timed(r, source.Batch{Checkpoint: cp(0), CaughtUp: true}, batch(1, 1))
		// The read after the empty one is full (1 of 1): it does not
		// linger either, and the run can end.
		_, err := r.runWithin(t, withLinger(1, time.Hour), "an empty read (a long poll that found nothing) was followed by the linger")
		require.NoError(t, err)
		require.Equal(t, cp(1), r.mem.checkpoint(testTablet))
	})
}

// gather groups the reads already waiting, up to maxRecords, without
// waiting for more; a failed read ends the group.
func TestGatherGroupsTheReadsAlreadyRead(t *testing.T) {
	b := config.Batch{MaxRecords: 5}
	read := func(from, to uint64) polled { return polled{batch: batch(from, to)} }
	waiting := func(ps ...polled) *poller {
		pl := &poller{out: make(chan polled, len(ps)+1)}
		for _, p := range ps {
			pl.out <- p
		}
		return pl
	}
	group, failed := gather(waiting(read(3, 4), read(5, 9)), read(1, 2), b)
	require.Nil(t, failed)
	require.Len(t, group, 3, "2 + 2 records, under 5: the next read joins; then 9 ≥ 5")

	group, failed = gather(waiting(), read(1, 2), b)
	require.Nil(t, failed)
	require.Len(t, group, 1, "nothing waiting: no wait")

	group, failed = gather(waiting(read(1, 5)), read(1, 5), b)
	require.Nil(t, failed)
	require.Len(t, group, 1, "a full read commits alone")

	bad := polled{err: errSourceDown}
	group, failed = gather(waiting(bad), read(1, 2), b)
	require.Len(t, group, 1)
	require.Equal(t, &bad, failed)

	group, failed = gather(waiting(), bad, b)
	require.Empty(t, group)
	require.Equal(t, &bad, failed)
}

// fakeStream answers the exclusion watcher's query with a list a test
// sets, after delay, and counts the queries.
type fakeStream struct {
	mu      sync.Mutex
	list    config.ExcludeList
	delay   time.Duration
	queries int
	signals []any         // what the activities signalled, in order
	hold    chan struct{} // if set, a signal is taken only once it is closed (a slow server)
}

func (f *fakeStream) SignalWorkflow(ctx context.Context, _, _, _ string, arg any) error {
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals = append(f.signals, arg)
	return nil
}

func (f *fakeStream) signalled() []any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.signals)
}

func (f *fakeStream) QueryWorkflow(ctx context.Context, _, _, _ string, _ ...any) (converter.EncodedValue, error) {
	f.mu.Lock()
	delay := f.delay
	f.mu.Unlock()
	select { // a busy stream workflow answers slowly; the caller may not wait
	case <-time.After(delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queries++
	p, err := converter.GetDefaultDataConverter().ToPayloads(f.list)
	if err != nil {
		return nil, err
	}
	return encodedList{p}, nil
}

func (f *fakeStream) set(list config.ExcludeList) {
	f.mu.Lock()
	f.list = list
	f.mu.Unlock()
}

type encodedList struct{ p *commonpb.Payloads }

func (e encodedList) HasValue() bool { return true }
func (e encodedList) Get(v any) error {
	return converter.GetDefaultDataConverter().FromPayloads(e.p, v)
}

// A GetChanges waiting on a quiet long poll leaves its replica as soon as
// the watcher reads an exclusion of it, not at a periodic check (set to an
// hour here) or the end of its run.
func TestGetChangesWaitingForAReadStopsWhenItsReplicaIsExcluded(t *testing.T) {
	r := newRig(t)
	stream := &fakeStream{}
	r.a.Watcher = &Watcher{Client: stream, Interval: 20 * time.Millisecond}
	r.a.RecheckEvery = time.Hour
	r.src.poll = func(ctx context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
		if n == 0 {
			return batch(1, 3), nil
		}
		<-ctx.Done() // a quiet tablet
		return source.Batch{}, ctx.Err()
	}
	go func() { // after the first commit (runWithin fails the test if it never comes)
		for r.mem.checkpoint(testTablet) != cp(3) {
			time.Sleep(5 * time.Millisecond)
		}
		stream.set(config.ExcludeList{{Alias: "zone9-other", Reason: "not this one"}})
		stream.set(config.ExcludeList{{Alias: testAlias, Reason: "maintenance"}})
	}()
	res, err := r.runWithin(t, input(), "the exclusion did not wake the waiting GetChanges")
	require.NoError(t, err)
	require.Equal(t, "replica excluded: maintenance", res.Stopped)
	require.Equal(t, cp(3), res.Checkpoint)
}

// On the real clock and the default recheck (DefaultRecheck, far longer
// than this run), a quiet tablet's run ends at its deadline: the run's
// timer wakes it, not the periodic check.
func TestGetChangesQuietRunEndsAtItsDeadlineWithoutTheRecheck(t *testing.T) {
	r := newRig(t)
	r.a.Now, r.a.RecheckEvery = nil, 0
	r.src.poll = func(ctx context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
		if n == 0 {
			return batch(1, 3), nil
		}
		<-ctx.Done() // a quiet tablet: no read comes back before the run ends
		return source.Batch{}, ctx.Err()
	}
	in := input()
	in.Batch.MaxWait = config.Duration(time.Hour)
	in.RunFor = config.Duration(300 * time.Millisecond)
	began := time.Now()
	res, err := r.runWithin(t, in, "the quiet run did not end")
	require.NoError(t, err)
	require.Equal(t, StoppedRunEnded, res.Stopped)
	require.Less(t, time.Since(began), DefaultRecheck/2, "the run ended at a recheck, not at its deadline")
}

// Tablets picking replicas at once, with no copy of the exclude
// list on the worker, share one query of the stream instead of sending
// one each.
func TestExclusionsAskedAtOnceShareOneQuery(t *testing.T) {
	stream := &fakeStream{list: config.ExcludeList{{Alias: testAlias, Reason: "maintenance"}}, delay: time.Second}
	w := &Watcher{Client: stream, Interval: time.Hour}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			list, err := w.Exclusions(context.Background(), testStream)
			if err == nil && (len(list) != 1 || list[0].Alias != testAlias) {
				err = fmt.Errorf("got %v", list)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	stream.mu.Lock()
	defer stream.mu.Unlock()
	require.Equal(t, 1, stream.queries)
}

// A stream with many tablets on the worker is read more often than once
// an interval (a quarter of it from 64 tablets on), one with a few once
// an interval.
func TestAStreamWithManyTabletsHereIsReadMoreOften(t *testing.T) {
	w := &Watcher{Interval: time.Second}
	for refs, want := range map[int]time.Duration{1: time.Second, ManyTablets: time.Second,
		2 * ManyTablets: 500 * time.Millisecond, 64: 250 * time.Millisecond, 1000: 250 * time.Millisecond} {
		require.Equal(t, want, w.intervalFor(refs), "%d tablets", refs)
	}

	// The watcher's reads follow it: 64 tablets watching see five reads
	// within 2.4 s (reads a second apart would make three). The first
	// read may find fewer tablets watching and wait a whole second.
	stream := &fakeStream{}
	w = &Watcher{Client: stream, Interval: time.Second}
	for range 64 {
		defer w.Watch(testStream)()
	}
	require.Eventually(t, func() bool {
		stream.mu.Lock()
		defer stream.mu.Unlock()
		return stream.queries >= 5
	}, 2400*time.Millisecond, 10*time.Millisecond, "five reads")
}

// A stream too busy to answer within the watcher's interval is still
// read: the query waits up to QueryTimeout, not one interval, so pickers
// waiting for it get the list instead of an error each interval.
func TestExclusionsOfAStreamSlowerThanTheIntervalAreRead(t *testing.T) {
	stream := &fakeStream{list: config.ExcludeList{{Alias: testAlias, Reason: "maintenance"}}, delay: 200 * time.Millisecond}
	w := &Watcher{Client: stream, Interval: 20 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := w.Exclusions(ctx, testStream)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, testAlias, list[0].Alias)
}

// The tablet picker does not wait on a stream too busy to answer: while
// this worker watches the stream it picks with the watcher's copy at once;
// otherwise after PickerWait with the exclude list as this worker last
// read it (its tablets all paused meanwhile), or, never read here, as the
// tablet last heard it; with neither it fails (and the tablet retries).
func TestPickerFallsBackToTheListAsLastKnownWhenTheStreamIsSlow(t *testing.T) {
	read := config.ExcludeList{{Alias: testAlias, Reason: "maintenance"}}
	heard := config.ExcludeList{{Alias: "zone9-heard", Reason: "at the tablet's start"}}
	for _, tc := range []struct {
		name     string
		readHere bool
		watching bool // a GetChanges of the stream still runs here
		fallback bool
		want     config.ExcludeList
	}{
		{"watched here now", true, true, true, read},
		{"last read here", true, false, true, read},
		{"as the tablet heard it", false, false, true, heard},
		{"neither", false, false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := &fakeStream{list: read}
			w := &Watcher{Client: stream, Interval: 10 * time.Millisecond, QueryTimeout: time.Hour}
			if tc.readHere { // a GetChanges watched the stream, then ended
				release := w.Watch(testStream)
				_, err := w.Exclusions(context.Background(), testStream)
				require.NoError(t, err)
				if tc.watching {
					defer release()
				} else {
					release()
				}
			}
			stream.mu.Lock()
			stream.delay = time.Hour // the stream no longer answers in time
			stream.list = nil
			stream.mu.Unlock()
			wait := 50 * time.Millisecond
			if tc.watching {
				wait = time.Hour // the watched copy is used without waiting
			}
			a := &Activities{Client: stream, Watcher: w, PickerWait: wait}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			list, err := a.operatorExclusions(ctx, SelectReplicaInput{Stream: testStream, Tablet: testTablet, Operator: heard, OperatorFallback: tc.fallback})
			require.NoError(t, ctx.Err(), "the picker waited past PickerWait")
			if tc.want == nil {
				require.ErrorContains(t, err, "query the stream's exclude list")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, list)
		})
	}
}

// memoStream is a stream whose memo holds its exclude list (from
// changeExclusionsMemo on); memo nil: a stream from before, without one.
type memoStream struct {
	fakeStream
	memo *config.ExcludeList
}

func (m *memoStream) DescribeWorkflow(context.Context, string, string) (*client.WorkflowExecutionDescription, error) {
	d := &client.WorkflowExecutionDescription{}
	d.Memo = &commonpb.Memo{Fields: map[string]*commonpb.Payload{}}
	if m.memo != nil {
		p, err := converter.GetDefaultDataConverter().ToPayload(*m.memo)
		if err != nil {
			return nil, err
		}
		d.Memo.Fields[MemoExclusions] = p
	}
	return d, nil
}

// The watcher reads the exclude list from the stream's memo, with no
// query (a stream busy with its tablets' reports answers none); a stream
// without the list in its memo is queried as before.
func TestWatcherReadsTheExcludeListFromTheStreamsMemo(t *testing.T) {
	inMemo := config.ExcludeList{{Alias: testAlias, Reason: "maintenance"}}
	for _, tt := range []struct {
		name        string
		memo        *config.ExcludeList
		want        config.ExcludeList
		wantQueries bool
	}{
		{name: "in the memo", memo: &inMemo, want: inMemo},
		{name: "an empty list in the memo", memo: &config.ExcludeList{}, want: config.ExcludeList{}},
		{name: "no list in the memo", want: config.ExcludeList{{Alias: "zone9-0000000901", Reason: "queried"}}, wantQueries: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stream := &memoStream{memo: tt.memo}
			stream.list = config.ExcludeList{{Alias: "zone9-0000000901", Reason: "queried"}}
			w := &Watcher{Client: stream, Interval: time.Hour}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			list, err := w.Exclusions(ctx, testStream)
			require.NoError(t, err)
			require.Equal(t, tt.want, list)
			stream.mu.Lock()
			defer stream.mu.Unlock()
			require.Equal(t, tt.wantQueries, stream.queries > 0, "queries: %d", stream.queries)
		})
	}
}

// TestGetChangesFindingItsHistoryGoneBecauseAnotherAttemptCommittedRetries:
// another attempt of the same tablet (a zombie whose heartbeats timed out,
// still running) committed past this run's checkpoint and acknowledged it,
// so the source answers that the history this run asks for is gone. The
// sink holds the later checkpoint: that is no expiry, and the run ends with
// a plain retryable error, the next attempt resuming at the sink's
// checkpoint, instead of a terminal StreamExpired.
func TestGetChangesFindingItsHistoryGoneBecauseAnotherAttemptCommittedRetries(t *testing.T) {
	r := newRig(t)
	r.src.poll = func(_ context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
		r.mem.set(testTablet, cp(9)) // the other attempt's commit
		return source.Batch{}, errHistoryGone
	}
	_, err := r.run(r.activityEnv(context.Background()), input())
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.False(t, appErr.NonRetryable(), "%v", err)
	require.NotEqual(t, ErrStreamExpired, appErr.Type())
	require.ErrorContains(t, err, "1.9")
}

// TestGetChangesFindingItsHistoryGoneIsExpiredWhenTheSinkHasNotMoved: the
// same answer with the sink still at the run's checkpoint is a real
// expiry.
func TestGetChangesFindingItsHistoryGoneIsExpiredWhenTheSinkHasNotMoved(t *testing.T) {
	r := newRig(t)
	r.src.poll = func(context.Context, int, source.ChangesRequest) (source.Batch, error) {
		return source.Batch{}, errHistoryGone
	}
	_, err := r.run(r.activityEnv(context.Background()), input())
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.True(t, appErr.NonRetryable())
	require.Equal(t, ErrStreamExpired, appErr.Type())
}

// A run whose reader's copy of rows finishes ends at the commit that sees
// it done ("copy finished"), its result carrying the copy, so that the
// tablet reports it at once rather than at the run's end; the copies the
// commits saw before it are in progress.
func TestGetChangesEndsTheRunWhenItsCopyFinishes(t *testing.T) {
	for _, tt := range []struct {
		name string
		// copyOf is the reader's copy after n reads.
		copyOf func(n int) *source.CopyProgress
		want   string
	}{
		{"seen under way, then done", func(n int) *source.CopyProgress {
			return &source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 1, Rows: int64(3 * n), Done: n >= 2}
		}, StoppedCopyFinished},
		{"one chunk: done at the first read, rows handed out", func(n int) *source.CopyProgress {
			return &source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 1, Rows: 3, Done: true}
		}, StoppedCopyFinished},
		{"found complete as the reader opened", func(n int) *source.CopyProgress {
			return &source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 1, TablesDone: 1, Done: true}
		}, StoppedRunEnded},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.script(batch(1, 3), batch(4, 6), batch(7, 9), batch(10, 12))
			r.src.copyOf = tt.copyOf
			res, err := r.run(r.activityEnv(context.Background()), input())
			require.NoError(t, err)
			require.Equal(t, tt.want, res.Stopped)
			require.NotNil(t, res.Copy)
			require.True(t, res.Copy.Done)
			require.Equal(t, "snapshot-1", res.Copy.ID)
			if tt.want == StoppedCopyFinished {
				require.LessOrEqual(t, res.Checkpoint.Compare(cp(9)), 0, "the run ended after the copy's last chunk (and a batch read ahead), not at its deadline: %s", res.Checkpoint)
			} else {
				require.Equal(t, cp(12), res.Checkpoint, "a copy the run did not make does not end it")
			}
		})
	}
}

// A run that commits nothing reports its reader's copy as the reader
// has it: done when the reader found it complete as it opened, and not
// done when the reader handed rows of it out in a batch the run never
// committed (it ended first): the next run copies them again, and the
// stream must not take the copy for done before a sink holds them.
func TestGetChangesReportsACopyWhoseRowsNoCommitTookUnderWay(t *testing.T) {
	for _, tt := range []struct {
		name string
		rows int64
		done bool
	}{
		{"found complete as the reader opened", 0, true},
		{"its last rows handed out in a batch not committed", 3, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.script() // the run ends at its first poll, committing nothing
			r.src.copyOf = func(int) *source.CopyProgress {
				return &source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 1, TablesDone: 1, Rows: tt.rows, Done: true}
			}
			res, err := r.run(r.activityEnv(context.Background()), input())
			require.NoError(t, err)
			require.Zero(t, res.Batches)
			require.NotNil(t, res.Copy)
			require.Equal(t, tt.done, res.Copy.Done)
		})
	}
}

// snapshotterSource is a fakeSource that takes snapshot jobs, answering
// each tablet with answers[tablet] (nil: taken).
type snapshotterSource struct {
	*fakeSource
	answers map[string]error
}

func (s snapshotterSource) Snapshot(_ context.Context, _, tablet string, _ source.SnapshotJob) error {
	return s.answers[tablet]
}
func (s snapshotterSource) CancelSnapshot(_ context.Context, _, tablet, _ string) error {
	return s.answers[tablet]
}

// Snapshot tells the source of every tablet and says how each went: one
// whose server is down (a RetrySame error) is to be told later, one the
// source refuses is failed, and neither holds the others up.
func TestSnapshotSaysPerTabletWhatTheSourceAnswered(t *testing.T) {
	r := newRig(t)
	src := snapshotterSource{r.src, map[string]error{"s2": errSourceDown, "s3": fmt.Errorf("public.x is not a table the stream reads")}}
	r.a.Resources.NewSource = func(config.Source) (source.Source, error) { return src, nil }
	var s testsuite.WorkflowTestSuite
	s.SetLogger(temporalclient.Quiet{})
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(r.a)
	val, err := env.ExecuteActivity(r.a.Snapshot, SnapshotInput{Stream: testStream, Source: config.Source{Kind: "fake"},
		Tablets: []string{"s1", "s2", "s3", "s4"}, Job: source.SnapshotJob{ID: "snapshot-1", Tables: []string{"public.orders"}}})
	require.NoError(t, err)
	var res SnapshotResult
	require.NoError(t, val.Get(&res))
	require.Equal(t, SnapshotResult{Done: []string{"s1", "s4"}, Later: map[string]string{"s2": errSourceDown.Error()},
		Failed: map[string]string{"s3": "public.x is not a table the stream reads"}}, res)
}
