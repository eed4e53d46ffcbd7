package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// streamingTablet sets up a tablet workflow whose GetChanges runs until
// cancelled (or a minute), returning checkpoint 10 per run.
func streamingTablet(t *testing.T) *testsuite.TestWorkflowEnvironment {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 2}, nil)
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(ctx context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			return activities.GetChangesResult{Checkpoint: cp(in.Checkpoint.Index + 10), Records: 10, Batches: 1, Stopped: activities.StoppedRunEnded}, nil
		}).After(time.Minute)
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
	return env
}

func TestTabletStopArrivingWithContinueAsNewEndsTheTablet(t *testing.T) {
	env := streamingTablet(t)
	env.RegisterDelayedCallback(func() {
		// The stop and the suggestion to continue as new come together:
		// the stop wins, it is not carried into a run that might drop it.
		env.SetContinueAsNewSuggested(true)
		env.SignalWorkflow(SignalTabletCommand, TabletCommand{Kind: CmdStop})
	}, 90*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError(), "the tablet completes instead of continuing as new")
	v, err := env.QueryWorkflow(QueryStatus)
	require.NoError(t, err)
	var st TabletStatus
	require.NoError(t, v.Get(&st))
	require.Equal(t, Stopped, st.State)
	require.Equal(t, cp(10), st.Checkpoint)
}

func TestTabletPauseArrivingWithContinueAsNewRidesInTheState(t *testing.T) {
	env := streamingTablet(t)
	env.RegisterDelayedCallback(func() {
		env.SetContinueAsNewSuggested(true)
		env.SignalWorkflow(SignalTabletCommand, TabletCommand{Kind: CmdPause})
	}, 90*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "%v", env.GetWorkflowError())
	var in TabletInput
	var st *TabletState
	require.NoError(t, decodeArgs(can, &in, &st))
	require.True(t, st.Pause, "the pause reaches the next run")
	require.False(t, st.Stop)
	require.Equal(t, cp(10), st.Checkpoint)
}

func TestTabletRestartedPausedStaysPausedAndStopsWhenTheStreamStops(t *testing.T) {
	env := newEnv(t) // no activity may run
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
	// A restart (the stream's reconcile) hands over the intents: a stopping
	// stream's restarted tablet stops at once, at its checkpoint.
	st := &TabletState{Checkpoint: cp(70), Status: TabletStatus{ID: "t-0001", State: Starting, Checkpoint: cp(70), Records: 70, Restarts: 1}, Pause: true, Stop: true, Intents: true}
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, st)
	require.NoError(t, env.GetWorkflowError())
	v, err := env.QueryWorkflow(QueryStatus)
	require.NoError(t, err)
	var got TabletStatus
	require.NoError(t, v.Get(&got))
	require.Equal(t, Stopped, got.State)
	require.Equal(t, int64(70), got.Records, "counters survive the restart")
	require.Equal(t, 1, got.Restarts)
}

func TestTabletSinkErrorsAreNotCountedAgainstTheReplica(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	selections := 0
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.SelectReplicaInput) (activities.Selection, error) {
			selections++
			return activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 3}, nil
		})
	runs := 0
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			runs++
			if runs <= 3 { // the sink's lock is held: wait, same replica
				return activities.GetChangesResult{}, nonRetryable(activities.ErrSinkUnavailable, "tablet is locked by another writer")
			}
			// a record the sink cannot write: no replica can help
			return activities.GetChangesResult{}, nonRetryable(activities.ErrSinkFailed, "jsonl: bad record")
		})
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	require.NoError(t, env.GetWorkflowError())
	v, err := env.QueryWorkflow(QueryStatus)
	require.NoError(t, err)
	var st TabletStatus
	require.NoError(t, v.Get(&st))
	require.Equal(t, Failed, st.State)
	require.Contains(t, st.Reason, "bad record")
	require.Empty(t, st.Excluded, "the sink's errors exclude no replica")
	require.Equal(t, 1, selections, "the replica is kept while the sink is unavailable")
	require.Equal(t, 4, runs)
}

// TestTabletWaitsForAnUnavailableSinkByTheStreamsRetryPolicy: the runs
// after a sink-unavailable end start the retry policy's intervals apart
// (initialInterval, times backoffCoefficient, up to maximumInterval), and
// its maximumAttempts never ends the waiting.
func TestTabletWaitsForAnUnavailableSinkByTheStreamsRetryPolicy(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	cfg := mustConfig(t)
	one := int32(1)
	cfg.Retry = config.Retry{InitialInterval: config.Duration(3 * time.Second), BackoffCoefficient: 3,
		MaximumInterval: config.Duration(20 * time.Second), MaximumAttempts: &one}
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 3}, nil)
	var starts []time.Time
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			starts = append(starts, env.Now())
			if len(starts) <= 5 {
				return activities.GetChangesResult{}, nonRetryable(activities.ErrSinkUnavailable, "connect: connection refused")
			}
			return activities.GetChangesResult{}, nonRetryable(activities.ErrSinkFailed, "jsonl: bad record")
		})
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: cfg, Tablets: 1}, (*TabletState)(nil))

	require.NoError(t, env.GetWorkflowError())
	require.Len(t, starts, 6, "five sink-unavailable runs are waited out, more than maximumAttempts")
	var gaps []time.Duration
	for i := 1; i < len(starts); i++ {
		gaps = append(gaps, starts[i].Sub(starts[i-1]).Round(time.Second))
	}
	require.Equal(t, []time.Duration{3 * time.Second, 9 * time.Second, 20 * time.Second, 20 * time.Second, 20 * time.Second}, gaps)
}

// nonRetryable is the error GetChanges returns for a typed outcome.
func nonRetryable(typ, msg string) error {
	return temporalNonRetryable(msg, typ, activities.ErrorDetails{Reason: typ})
}

// streamWith sets up a stream whose topology lists tablets (one call's
// answer per element of lists; the last repeats) and whose CheckTablets
// answers closed (one call's answer per element; then none).
type streamWith struct {
	mu     sync.Mutex
	lists  [][]source.Tablet
	listed int
	closed [][]activities.ClosedTablet
	checks []activities.CheckTabletsInput
}

func (w *streamWith) mock(env *testsuite.TestWorkflowEnvironment) {
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil)
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(
		func(context.Context, config.Source) (activities.Topology, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			i := min(w.listed, len(w.lists)-1)
			w.listed++
			if w.lists[i] == nil {
				return activities.Topology{}, errors.New("UNAVAILABLE: topology down")
			}
			return activities.TopologyOf(w.lists[i]), nil
		})
	env.OnActivity(a.CheckTablets, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.CheckTabletsInput) ([]activities.ClosedTablet, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.checks = append(w.checks, in)
			if len(w.closed) == 0 {
				return nil, nil
			}
			c := w.closed[0]
			w.closed = w.closed[1:]
			return c, nil
		}).Maybe()
}

func streamConfig(t *testing.T) json.RawMessage {
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(goodConfig), &m))
	m["topologyRefresh"] = "10s"
	m["selection"] = map[string]any{"cells": []string{"zone1", "zone2"}}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

// queryStatus reads the status of the workflow env runs: a StreamStatus
// or a TabletStatus.
func queryStatus[T StreamStatus | TabletStatus](t *testing.T, env *testsuite.TestWorkflowEnvironment) T {
	t.Helper()
	v, err := env.QueryWorkflow(QueryStatus)
	require.NoError(t, err)
	var st T
	require.NoError(t, v.Get(&st))
	return st
}

// tabletRunner records the TabletWorkflows a stream starts, with their
// state; each returns at once (its workflow closes, as a terminated one
// would, without a terminal report).
type tabletRunner struct {
	mu     sync.Mutex
	starts []TabletInput
	states []*TabletState
}

func (r *tabletRunner) mock(env *testsuite.TestWorkflowEnvironment) {
	env.OnWorkflow(TabletWorkflow, mock.Anything, mock.Anything, mock.Anything).Return(
		func(_ workflow.Context, in TabletInput, st *TabletState) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.starts, r.states = append(r.starts, in), append(r.states, st)
			return nil
		})
}

func TestStreamRestartsATabletThatClosedWithoutATerminalReport(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{
		lists:  [][]source.Tablet{{{ID: "t-0001"}}},
		closed: [][]activities.ClosedTablet{{{Tablet: "t-0001", Status: "Terminated"}}},
	}
	w.mock(env)
	var r tabletRunner
	r.mock(env)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Streaming, Replica: "zone1-0000000101", Checkpoint: cp(77), Records: 77, Updated: env.Now()})
	}, 5*time.Second)
	var st StreamStatus
	env.RegisterDelayedCallback(func() { st = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 25*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.Len(t, r.starts, 2, "started, then restarted once")
	require.Nil(t, r.states[0])
	require.NotNil(t, r.states[1])
	require.Equal(t, cp(77), r.states[1].Checkpoint, "restarted from its last checkpoint")
	require.Equal(t, int64(77), r.states[1].Status.Records, "with its counters")
	row := st.Tablets[0]
	require.Equal(t, 1, row.Restarts)
	require.Contains(t, row.Reason, "Terminated")
	require.NotEmpty(t, w.checks)
	require.Equal(t, "orders/tablet/t-0001", w.checks[0].Tablets[0].WorkflowID)
}

func TestStreamAppliesALostSplitReportFromTheClosedTablet(t *testing.T) {
	env := newEnv(t)
	final, err := json.Marshal(TabletStatus{ID: "t-0001", State: Split, Children: []string{"t-0002", "t-0003"}, Handoff: cp(40), Checkpoint: cp(40)})
	require.NoError(t, err)
	w := &streamWith{
		lists: [][]source.Tablet{
			{{ID: "t-0001"}},
			// The parent gone from the listing, its children there.
			{{ID: "t-0002", Parent: "t-0001"}, {ID: "t-0003", Parent: "t-0001"}},
		},
		closed: [][]activities.ClosedTablet{nil, {{Tablet: "t-0001", Status: "Completed", Final: final}}},
	}
	w.mock(env)
	var r tabletRunner
	r.mock(env)
	var st StreamStatus
	env.RegisterDelayedCallback(func() { st = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 35*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.Len(t, r.starts, 3)
	starts := map[string]source.Checkpoint{}
	for _, in := range r.starts {
		starts[in.Tablet] = in.Start
	}
	require.Equal(t, map[string]source.Checkpoint{"t-0001": {}, "t-0002": cp(40), "t-0003": cp(40)}, starts, "children start from the hand-off")
	require.Equal(t, Split, st.Tablets[0].State)
	require.Zero(t, st.Tablets[0].Restarts, "a split tablet is not restarted")
}

func TestSplitChildrenWaitForTheParentEvenWhenItLeavesTheListing(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{lists: [][]source.Tablet{
		{{ID: "t-0001"}},
		{{ID: "t-0002", Parent: "t-0001"}, {ID: "t-0003", Parent: "t-0001"}},
	}}
	w.mock(env)
	// The tablet workflows return at once, but CheckTablets (finding none
	// closed) keeps the parent "being read" in the stream's eyes.
	var started startedTablets
	started.mock(env)
	var before []string
	env.RegisterDelayedCallback(func() {
		started.mu.Lock()
		before = append(before, started.ids...)
		started.mu.Unlock()
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Split, Children: []string{"t-0002", "t-0003"}, Handoff: cp(40), Updated: env.Now()})
	}, 45*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 50*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.Equal(t, []string{"orders/tablet/t-0001"}, before, "no child starts while its parent is read")
	require.Equal(t, cp(40), started.in["t-0002"].Start, "the split report starts them from the hand-off")
	require.Equal(t, cp(40), started.in["t-0003"].Start)
}

func TestStreamTakesCommandsWhileTheTopologyIsUnreachable(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{lists: [][]source.Tablet{
		{{ID: "t-0001", Replicas: []source.Replica{replica("t-0001", "zone1-0000000101"), replica("t-0001", "zone1-0000000102")}}},
		nil, // from the second read on, the topology is down
	}}
	w.mock(env)
	var started startedTablets
	started.mock(env)
	var during, later StreamStatus
	env.RegisterDelayedCallback(func() {
		// The second read is retrying: the stream still takes the signal.
		env.SignalWorkflow(CmdExclude, json.RawMessage(`{"aliases": ["zone1-0000000102"], "reason": "maintenance"}`))
	}, 15*time.Second)
	env.RegisterDelayedCallback(func() { during = queryStatus[StreamStatus](t, env) }, 16*time.Second)
	env.RegisterDelayedCallback(func() { later = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 2*time.Minute)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.Len(t, during.Exclude, 1, "the exclusion is applied while the topology read retries")
	require.NotNil(t, later.Topology, "the status says the topology is unreachable")
	require.Contains(t, later.Topology.Error, "topology down")
	require.False(t, later.Topology.Since.IsZero())
}

func TestRejectedConfigureLeavesTheStreamUnchanged(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{lists: [][]source.Tablet{{{ID: "t-0001"}}, {{ID: "t-0001"}, {ID: "t-0002"}}}}
	w.mock(env)
	var started startedTablets
	started.mock(env)
	var rejected error
	env.RegisterDelayedCallback(func() {
		// Repeated cells: rejected by the validator after decoding.
		env.UpdateWorkflow(CmdConfigure, "cfg", &testsuite.TestUpdateCallback{
			OnReject:   func(err error) { rejected = err },
			OnAccept:   func() {},
			OnComplete: func(any, error) {},
		}, json.RawMessage(`{"selection": {"cells": ["zone9", "zone9"]}}`))
	}, 5*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 15*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.Error(t, rejected)
	require.Contains(t, rejected.Error(), "selection.cells")
	started.mu.Lock()
	defer started.mu.Unlock()
	require.Equal(t, []string{"zone1", "zone2"}, started.in["t-0002"].Config.Selection.Cells, "a rejected update changes nothing")
}

func temporalNonRetryable(msg, typ string, d activities.ErrorDetails) error {
	return temporal.NewNonRetryableApplicationError(msg, typ, errors.New(msg), d)
}

func TestStreamStartsManyTabletsInWavesOfOneRunEach(t *testing.T) {
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("t-%05d", i)
		}
		return out
	}
	tests := []struct {
		name     string
		fresh    int
		started  int
		now      int
		deferred bool
	}{
		// Within the run's budget: all at once.
		{"few", 10, 0, 10, false},
		{"exactly the budget", maxChildrenPerRun, 0, maxChildrenPerRun, false},
		// More than a run may start: one wave now, the rest in the next run.
		{"many", 5000, 0, maxChildrenPerRun, true},
		// Splits and restarts this run used part of the budget.
		{"budget partly used", 600, maxChildrenPerRun - 100, 100, true},
		{"budget used up", 5, maxChildrenPerRun, 0, true},
		{"nothing to start", 0, maxChildrenPerRun, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now, deferred := wave(ids(tt.fresh), tt.started)
			require.Len(t, now, tt.now)
			require.Equal(t, tt.deferred, deferred)
		})
	}
}

func TestRetryRestartsAFailedTabletFromItsCheckpointKeepingItsStart(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{lists: [][]source.Tablet{{{ID: "t-0001"}}}}
	w.mock(env)
	var r tabletRunner
	r.mock(env)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Failed, Reason: "sink: SINK_CORRUPT",
			Checkpoint: cp(77), Start: cp(5), Records: 72, Updated: env.Now()})
	}, 5*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdRetry, json.RawMessage(`{}`)) }, 6*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 8*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.Len(t, r.starts, 2)
	require.Equal(t, cp(5), r.starts[1].Start, "the tablet's own start, not its checkpoint")
	require.NotNil(t, r.states[1])
	require.Equal(t, cp(77), r.states[1].Checkpoint, "resumes from its checkpoint")
	require.Equal(t, int64(72), r.states[1].Status.Records, "with its counters")
}

func TestTabletResumedJustBeforeContinueAsNewStreamsInTheNextRun(t *testing.T) {
	for _, tt := range []struct {
		name  string
		st    TabletState
		state State
	}{
		// The intents ride in the state: a resume drained just before
		// continuing as new leaves the status Paused, not the intent.
		{"carried", TabletState{Intents: true, Pause: false, Status: TabletStatus{ID: "t-0001", State: Paused}}, Streaming},
		// A state from before the intents were carried: Paused is derived.
		{"from an older worker", TabletState{Status: TabletStatus{ID: "t-0001", State: Paused}}, Paused},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var env *testsuite.TestWorkflowEnvironment
			if tt.state == Paused {
				env = newEnv(t) // no activity runs
				env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
				env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
			} else {
				env = streamingTablet(t)
			}
			var got TabletStatus
			env.RegisterDelayedCallback(func() {
				v, err := env.QueryWorkflow(QueryStatus)
				require.NoError(t, err)
				require.NoError(t, v.Get(&got))
				env.CancelWorkflow()
			}, 30*time.Second)
			st := tt.st
			env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, &st)
			require.Equal(t, tt.state, got.State)
		})
	}
}

func TestStreamKeepsTheNewestReportByItsSequence(t *testing.T) {
	at := time.Date(2026, 12, 1, 4, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		r, prev TabletStatus
		stale   bool
	}{
		// Two reports sent in one workflow task carry the same time; the
		// sequence tells them apart, whatever order they arrive in.
		{"same time, older sequence", TabletStatus{Seq: 4, Updated: at}, TabletStatus{Seq: 5, Updated: at}, true},
		{"same time, newer sequence", TabletStatus{Seq: 6, Updated: at}, TabletStatus{Seq: 5, Updated: at}, false},
		// The same report twice.
		{"same sequence", TabletStatus{Seq: 5, Updated: at}, TabletStatus{Seq: 5, Updated: at}, true},
		// Reports from before the sequence: by time.
		{"unnumbered, older", TabletStatus{Updated: at.Add(-time.Second)}, TabletStatus{Updated: at}, true},
		{"unnumbered, same time", TabletStatus{Updated: at}, TabletStatus{Updated: at}, false},
		// The stream's own row for a new tablet has no sequence yet.
		{"first numbered report", TabletStatus{Seq: 1, Updated: at}, TabletStatus{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.stale, stale(tt.r, tt.prev))
		})
	}
}

func TestTabletsFirstReportSaysStreamingNotStarting(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 2}, nil)
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(activities.GetChangesResult{Checkpoint: cp(10), Stopped: activities.StoppedRunEnded}, nil).After(time.Minute)
	reports := recordReports(env)
	env.RegisterDelayedCallback(env.CancelWorkflow, 30*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	// The stream made the Starting row itself: thousands of tablets
	// starting at once send it one signal each, not two.
	require.Len(t, reports.got, 1)
	require.Equal(t, Streaming, reports.got[0].State)
	require.Equal(t, int64(1), reports.got[0].Seq)
}

func TestStreamSaysWhenATabletsWorkflowTaskKeepsFailing(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{
		lists:  [][]source.Tablet{{{ID: "t-0001"}}},
		closed: [][]activities.ClosedTablet{{{Tablet: "t-0001", Status: activities.TaskFailing, TaskAttempts: 7}}},
	}
	w.mock(env)
	var r tabletRunner
	r.mock(env)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Streaming, Seq: 1, Updated: env.Now()})
	}, 5*time.Second)
	var st, fixed StreamStatus
	env.RegisterDelayedCallback(func() { st = queryStatus[StreamStatus](t, env) }, 15*time.Second)
	env.RegisterDelayedCallback(func() {
		// A fixed worker ran the task: the tablet reports again.
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Streaming, Seq: 2, Updated: env.Now()})
	}, 16*time.Second)
	env.RegisterDelayedCallback(func() { fixed = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 17*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	// A stuck tablet workflow is running: nothing to restart, but its row
	// no longer looks healthy (changeStuckState).
	require.Len(t, r.starts, 1)
	require.Equal(t, Stuck, st.Tablets[0].State)
	require.Contains(t, st.Tablets[0].Reason, "workflow task keeps failing (attempt 7)")
	require.Equal(t, Streaming, fixed.Tablets[0].State, "its next report says how it is again")
}

// The stream keeps its operator exclude list in its memo, from its first
// workflow task and at once when it changes (by signal or by update),
// for the workers' exclusion watchers to read without a query.
func TestStreamKeepsItsExcludeListInItsMemo(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{lists: [][]source.Tablet{
		{{ID: "t-0001", Replicas: []source.Replica{replica("t-0001", "zone1-0000000101"), replica("t-0001", "zone1-0000000102")}}},
	}}
	w.mock(env)
	var started startedTablets
	started.mock(env)
	var memos []config.ExcludeList // each upsert's list, in order
	var at []time.Time             // and when
	env.OnUpsertMemo(mock.Anything).Run(func(args mock.Arguments) {
		fields := args.Get(0).(map[string]any)
		list, ok := fields[activities.MemoExclusions]
		require.True(t, ok, "every memo upsert carries the list: %v", fields)
		memos = append(memos, slices.Clone(list.(config.ExcludeList)))
		at = append(at, env.Now())
	}).Return(nil)
	var includedAt time.Time
	var atExclude, atInclude int
	env.RegisterDelayedCallback(func() {
		atExclude = len(memos)
		env.SignalWorkflow(CmdExclude, json.RawMessage(`{"aliases": ["zone1-0000000102"], "reason": "maintenance"}`))
	}, 15*time.Second)
	env.RegisterDelayedCallback(func() {
		atInclude, includedAt = len(memos), env.Now()
		env.UpdateWorkflow(CmdInclude, "inc", &testsuite.TestUpdateCallback{
			OnReject: func(err error) { t.Errorf("include rejected: %v", err) }, OnAccept: func() {}, OnComplete: func(any, error) {},
		}, json.RawMessage(`{"aliases": ["zone1-0000000102"]}`))
	}, 33*time.Second) // an instant when nothing else wakes the loop
	env.RegisterDelayedCallback(env.CancelWorkflow, 40*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.NotZero(t, atExclude, "the memo has the list before any exclusion")
	require.Empty(t, memos[0])
	require.Greater(t, len(memos), atInclude)
	excluded := memos[atInclude-1]
	require.Len(t, excluded, 1, "the exclusion is in the memo: %v", memos)
	require.Equal(t, "zone1-0000000102", excluded[0].Alias)
	require.Equal(t, "maintenance", excluded[0].Reason)
	require.Empty(t, memos[atInclude], "the update's include is in the memo")
	require.Equal(t, includedAt, at[atInclude], "at once: an update does not wake the stream's loop")
}

// Reports that come together are handled in one workflow task with one
// memo update, not one each (changeMemoPerTask): a memo update is an
// event and a visibility write, and tablets start and move in crowds.
func TestStreamUpdatesItsMemoOncePerWorkflowTask(t *testing.T) {
	env := newEnv(t)
	var tablets []source.Tablet
	for i := 1; i <= 4; i++ {
		id := fmt.Sprintf("t-%04d", i)
		tablets = append(tablets, source.Tablet{ID: id, Replicas: []source.Replica{replica(id, "zone1-0000000101")}})
	}
	w := &streamWith{lists: [][]source.Tablet{tablets}}
	w.mock(env)
	var started startedTablets
	started.mock(env)
	var states []map[string]int // each memo update's tablet-state counts
	env.OnUpsertMemo(mock.Anything).Run(func(args mock.Arguments) {
		states = append(states, maps.Clone(args.Get(0).(map[string]any)["tabletStates"].(map[string]int)))
	}).Return(nil)
	var before int
	env.RegisterDelayedCallback(func() {
		before = len(states)
		for i, tb := range tablets {
			report := TabletStatus{ID: tb.ID, State: Streaming, Replica: "zone1-0000000101", Seq: 1, Updated: env.Now()}
			if i < len(tablets)-1 {
				env.SignalWorkflowSkippingWorkflowTask(SignalTabletReport, report) // waits for the last
			} else {
				env.SignalWorkflow(SignalTabletReport, report)
			}
		}
	}, 5*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.NotZero(t, before, "the memo was set before the reports")
	require.Equal(t, map[string]int{string(Starting): 4}, states[before-1])
	require.Equal(t, []map[string]int{{string(Streaming): 4}}, states[before:],
		"four reports in one workflow task: one memo update, with all four")
}

// The memo holds the final tablet states when the stream stops, even when
// the last Stopped report came in one workflow task with another signal:
// the memo then waited for that one, and the stream ended first.
func TestStreamMemoHoldsTheFinalStatesWhenItStops(t *testing.T) {
	env := newEnv(t)
	tablets := []source.Tablet{
		{ID: "t-0001", Replicas: []source.Replica{replica("t-0001", "zone1-0000000101")}},
		{ID: "t-0002", Replicas: []source.Replica{replica("t-0002", "zone1-0000000101")}},
	}
	w := &streamWith{lists: [][]source.Tablet{tablets}}
	w.mock(env)
	var started startedTablets
	started.mock(env)
	env.OnSignalExternalWorkflow(mock.Anything, mock.Anything, "", SignalTabletCommand, mock.Anything).Return(nil).Maybe()
	var states []map[string]int // each memo update's tablet-state counts
	env.OnUpsertMemo(mock.Anything).Run(func(args mock.Arguments) {
		states = append(states, maps.Clone(args.Get(0).(map[string]any)["tabletStates"].(map[string]int)))
	}).Return(nil)
	report := func(id string, st State, seq int64) TabletStatus {
		return TabletStatus{ID: id, State: st, Replica: "zone1-0000000101", Seq: seq, Updated: env.Now()}
	}
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflowSkippingWorkflowTask(SignalTabletReport, report("t-0001", Streaming, 1))
		env.SignalWorkflow(SignalTabletReport, report("t-0002", Streaming, 1))
	}, 5*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdStop, json.RawMessage(`{}`)) }, 8*time.Second)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflowSkippingWorkflowTask(SignalTabletReport, report("t-0001", Stopped, 2))
		env.SignalWorkflowSkippingWorkflowTask(SignalTabletReport, report("t-0002", Stopped, 2))
		// Another signal in the same task: a report sent again.
		env.SignalWorkflow(SignalTabletReport, report("t-0002", Stopped, 2))
	}, 12*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	require.NotEmpty(t, states)
	require.Equal(t, map[string]int{string(Stopped): 2}, states[len(states)-1], "memo updates: %v", states)
}
