package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/source"
)

var a *activities.Activities

const goodConfig = `{
  "source": {"kind": "tabletd", "address": "127.0.0.1:15991", "keyspace": "commerce"},
  "sink": {"kind": "jsonl", "path": "/tmp/out"},
  "run": {"duration": "1m"}
}`

func newEnv(t *testing.T) *testsuite.TestWorkflowEnvironment {
	env := newPicksEnv(t)
	// Streams read their first topology without picks unless a test asks
	// for them (newPicksEnv): the tests of the stream's other behaviour
	// mock ReadTopology.
	env.OnGetVersion(changeFirstPicks, workflow.DefaultVersion, 1).Return(workflow.DefaultVersion).Maybe()
	return env
}

// newPicksEnv is a test environment whose streams' first topology read
// picks their tablets' first replicas (changeFirstPicks).
func newPicksEnv(t *testing.T) *testsuite.TestWorkflowEnvironment {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterActivity(a)
	env.RegisterWorkflow(StreamWorkflow)
	env.RegisterWorkflow(TabletWorkflow)
	env.SetStartWorkflowOptions(clientOptions("orders"))
	t.Cleanup(func() { env.AssertExpectations(t) })
	return env
}

func replica(tablet, alias string) source.Replica {
	return source.Replica{Tablet: tablet, Alias: alias, Cell: "zone1", Type: source.TypeReplica, Serving: true, Healthy: true}
}

func cp(i uint64) source.Checkpoint { return source.Checkpoint{Term: 1, Index: i} }

func TestStreamWorkflowFailsAtOnceOnABadConfigNamingTheField(t *testing.T) {
	tests := []struct {
		name, config, field string
	}{
		// A typo in a field name is an error, not a silently empty field.
		{"unknown field", `{"source":{"kind":"tabletd","address":"a:1","keyspace":"k"},"sink":{"kind":"jsonl","path":"/x"},"batch":{"maxRecord":5}}`, "batch.maxRecord"},
		// A number where a duration string belongs.
		{"wrong type", `{"source":{"kind":"tabletd","address":"a:1","keyspace":"k"},"sink":{"kind":"jsonl","path":"/x"},"retry":{"maximumInterval":30}}`, "retry.maximumInterval"},
		// A value out of range.
		{"bad value", `{"source":{"kind":"tabletd","address":"a:1","keyspace":"k"},"sink":{"kind":"jsonl","path":"/x"},"batch":{"maxRecords":-5}}`, "batch.maxRecords"},
		// A required field missing.
		{"missing sink", `{"source":{"kind":"tabletd","address":"a:1","keyspace":"k"}}`, "sink.kind"},
		// A size given as 0 is not taken for the default at a start.
		{"zero size", `{"source":{"kind":"tabletd","address":"a:1","keyspace":"k"},"sink":{"kind":"jsonl","path":"/x"},"batch":{"maxRecords":0}}`, "batch.maxRecords: 0 not in"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			env.ExecuteWorkflow(StreamWorkflow, json.RawMessage(tt.config), (*StreamState)(nil))
			require.True(t, env.IsWorkflowCompleted())
			err := env.GetWorkflowError()
			var app *temporal.ApplicationError
			require.True(t, errors.As(err, &app), "%v", err)
			require.Equal(t, ErrBadConfig, app.Type())
			require.True(t, app.NonRetryable())
			require.Contains(t, app.Error(), tt.field)
		})
	}
}

// startedTablets records the TabletWorkflows a stream starts.
type startedTablets struct {
	mu  sync.Mutex
	ids []string
	in  map[string]TabletInput
}

func (s *startedTablets) mock(env *testsuite.TestWorkflowEnvironment) {
	s.in = map[string]TabletInput{}
	env.OnWorkflow(TabletWorkflow, mock.Anything, mock.Anything, mock.Anything).Return(
		func(ctx workflow.Context, in TabletInput, _ *TabletState) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.ids = append(s.ids, workflow.GetInfo(ctx).WorkflowExecution.ID)
			s.in[in.Tablet] = in
			return nil
		})
}

func TestStreamStartsOneTabletWorkflowPerTabletAndChildrenAfterASplit(t *testing.T) {
	env := newEnv(t)
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil).Once()
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(activities.TopologyOf([]source.Tablet{
		{ID: "t-0001"}, {ID: "t-0002"},
		// A split parent whose children must wait for its split report.
		{ID: "t-0003", Split: true, Children: []string{"t-0004", "t-0005"}, SplitAt: cp(40)},
		{ID: "t-0004", Parent: "t-0003"}, {ID: "t-0005", Parent: "t-0003"},
	}), nil)
	var started startedTablets
	started.mock(env)

	var status StreamStatus
	env.RegisterDelayedCallback(func() {
		started.mu.Lock()
		require.ElementsMatch(t, []string{"orders/tablet/t-0001", "orders/tablet/t-0002", "orders/tablet/t-0003"}, started.ids)
		started.mu.Unlock()
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0003", State: Split, Children: []string{"t-0004", "t-0005"}, Handoff: cp(40)})
	}, time.Second)
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(QueryStatus)
		require.NoError(t, err)
		require.NoError(t, v.Get(&status))
		env.CancelWorkflow()
	}, 2*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, json.RawMessage(goodConfig), (*StreamState)(nil))

	require.Len(t, started.ids, 5)
	require.Equal(t, cp(40), started.in["t-0004"].Start, "children start from the hand-off")
	require.Equal(t, cp(40), started.in["t-0005"].Start)
	require.True(t, started.in["t-0001"].Start.IsZero(), "first-generation tablets start from the stream's start")
	require.Equal(t, "orders", status.Stream)
	require.Len(t, status.Tablets, 5)
	require.Equal(t, Split, status.Tablets[2].State)
}

func TestStreamContinuesAsNewCarryingItsState(t *testing.T) {
	env := newEnv(t)
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil)
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(activities.TopologyOf([]source.Tablet{{ID: "t-0001"}}), nil)
	var started startedTablets
	started.mock(env)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Streaming, Replica: "zone1-0000000101", Checkpoint: cp(77), Records: 77})
	}, time.Second)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Streaming, Replica: "zone1-0000000101", Checkpoint: cp(99), Records: 99})
	}, 2*time.Second)
	env.RegisterDelayedCallback(func() {
		env.SetContinueAsNewSuggested(true)
		// The next event lets the stream notice the suggestion.
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0002", State: Starting})
	}, 3*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, json.RawMessage(goodConfig), (*StreamState)(nil))

	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "%v", env.GetWorkflowError())
	require.Equal(t, "StreamWorkflow", can.WorkflowType.Name)
	var raw json.RawMessage
	var st *StreamState
	require.NoError(t, decodeArgs(can, &raw, &st))
	require.JSONEq(t, goodConfig, string(raw), "the config rides along unchanged")
	require.True(t, st.SourceStream, "the source-side stream is not created again")
	require.Equal(t, int64(99), st.Tablets["t-0001"].Records, "every report received before continuing is kept")
	require.Equal(t, cp(99), st.Tablets["t-0001"].Checkpoint)
	require.Contains(t, st.Tablets, "t-0002")
}

func TestTabletKeepsItsCheckpointAndReplicaAcrossRunsAndReportsIt(t *testing.T) {
	env := newEnv(t)
	// A run that simply ended keeps its replica: one selection for all runs.
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 2}, nil).Once()
	var calls []activities.GetChangesInput
	next := uint64(0)
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			calls = append(calls, in)
			next += 10
			return activities.GetChangesResult{Checkpoint: cp(next), Records: 10, Batches: 1, Stopped: activities.StoppedRunEnded}, nil
		}).After(time.Minute)
	reports := recordReports(env)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	var status TabletStatus
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(QueryStatus)
		require.NoError(t, err)
		require.NoError(t, v.Get(&status))
		env.CancelWorkflow()
	}, 5*time.Minute+time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	require.GreaterOrEqual(t, len(calls), 5)
	require.True(t, calls[0].Checkpoint.IsZero())
	for i := 1; i < len(calls); i++ {
		require.Equal(t, cp(uint64(10*i)), calls[i].Checkpoint, "run %d resumes where run %d ended", i, i-1)
	}
	require.Equal(t, Streaming, status.State)
	require.Equal(t, "zone1-0000000101", status.Replica)
	require.Equal(t, int64(50), status.Records)
	require.NotEmpty(t, reports.got)
	require.Equal(t, Streaming, reports.got[len(reports.got)-1].State)
}

func TestOneTabletsFailuresDoNotDelayAnothersActivities(t *testing.T) {
	env := newEnv(t)
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil)
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(activities.TopologyOf([]source.Tablet{{ID: "t-bad"}, {ID: "t-good"}}), nil)
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.SelectReplicaInput) (activities.Selection, error) {
			return activities.Selection{Replica: replica(in.Tablet, "zone1-0000000101"), Candidates: 1}, nil
		})
	var mu sync.Mutex
	runs := map[string]int{}
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			mu.Lock()
			defer mu.Unlock()
			runs[in.Tablet]++
			if in.Tablet == "t-bad" {
				return activities.GetChangesResult{}, errors.New("UNAVAILABLE: replica gone")
			}
			return activities.GetChangesResult{Checkpoint: cp(uint64(runs[in.Tablet])), Records: 1, Batches: 1}, nil
		}).After(time.Minute)
	env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Minute)
	env.ExecuteWorkflow(StreamWorkflow, json.RawMessage(goodConfig), (*StreamState)(nil))

	mu.Lock()
	defer mu.Unlock()
	// Every good run takes a minute; 10 minutes hold ~10 of them whatever
	// the bad tablet does.
	require.GreaterOrEqual(t, runs["t-good"], 9, "the healthy tablet kept its pace: %v", runs)
	require.Greater(t, runs["t-bad"], 1, "the failing tablet kept retrying: %v", runs)
}

func clientOptions(id string) (o startOptions) {
	o.ID = id
	return o
}

func TestLastEligibleReplicaIsRetriedWithBackoffNotExcluded(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 1}, nil)
	runs := 0
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			runs++
			return activities.GetChangesResult{}, temporal.NewNonRetryableApplicationError("lost history", activities.ErrRetryElsewhere, nil,
				activities.ErrorDetails{Reason: "POSITION_MISMATCH", Replica: in.Replica.Alias})
		})
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
	var status TabletStatus
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(QueryStatus)
		require.NoError(t, err)
		require.NoError(t, v.Get(&status))
		env.CancelWorkflow()
	}, 10*time.Minute)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	// Backoff doubles to 30 s: ten minutes hold about 25 runs, not thousands.
	require.Greater(t, runs, 5)
	require.Less(t, runs, 40, "a single-replica tablet backs off")
	require.Empty(t, status.Excluded, "the last eligible replica is never excluded automatically")
}
