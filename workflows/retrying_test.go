package workflows

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/tabletflow/tabletflow/activities"
)

// stateAttributes records the TabletflowState search attribute a tablet
// upserts, in order.
type stateAttributes struct {
	mu     sync.Mutex
	states []string
}

func (s *stateAttributes) mock(env *testsuite.TestWorkflowEnvironment) {
	env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
		if v, ok := args.Get(0).(temporal.SearchAttributes).GetKeyword(SAState); ok {
			s.mu.Lock()
			s.states = append(s.states, v)
			s.mu.Unlock()
		}
	}).Return(nil)
}

// since returns the states upserted from the first upsert of from on.
func (s *stateAttributes) since(from State) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, v := range s.states {
		if v == string(from) {
			return append([]string(nil), s.states[i:]...)
		}
	}
	return nil
}

// A single-replica tablet whose every run ends at once with
// POSITION_MISMATCH (retry elsewhere, but there is no elsewhere) cannot
// make progress: from its first failed run on, its status, its reports
// to the stream and its search attribute say Retrying with the error, and
// its attempt counts on across runs; never Streaming, as when each run's
// start said so.
func TestATabletThatCannotMakeProgressNeverShowsStreaming(t *testing.T) {
	const alias = "zone1-0000000101"
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", alias), Candidates: 1}, nil)
	var mu sync.Mutex
	var runs []activities.GetChangesInput
	var failedAt time.Time
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			mu.Lock()
			defer mu.Unlock()
			runs = append(runs, in)
			if failedAt.IsZero() {
				failedAt = env.Now()
			}
			return activities.GetChangesResult{}, temporal.NewNonRetryableApplicationError("position 1.7 is not held by this replica", activities.ErrRetryElsewhere, nil,
				activities.ErrorDetails{Reason: "POSITION_MISMATCH", Replica: in.Replica.Alias})
		})
	reports := recordReports(env)
	var attrs stateAttributes
	attrs.mock(env)
	var seen []TabletStatus // the tablet's status every 5 s
	for i := 1; i <= 60; i++ {
		env.RegisterDelayedCallback(func() { seen = append(seen, queryStatus[TabletStatus](t, env)) }, time.Duration(i)*5*time.Second)
	}
	env.RegisterDelayedCallback(env.CancelWorkflow, 5*time.Minute+time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, len(runs), 5, "the tablet kept retrying its last replica")
	for i, st := range seen {
		require.Equal(t, Retrying, st.State, "status %ds after its first failed run: %+v", 5*(i+1), st)
		require.Equal(t, alias, st.Replica)
		require.Contains(t, st.LastError, "position 1.7 is not held by this replica", "status %ds after", 5*(i+1))
		require.Contains(t, st.Reason, "POSITION_MISMATCH")
	}
	require.Greater(t, seen[len(seen)-1].Attempt, int32(5), "the attempt counts on across the runs that made no progress")
	retrying := attrs.since(Retrying)
	require.NotEmpty(t, retrying, "the search attribute says Retrying")
	require.NotContains(t, retrying, string(Streaming), "the search attribute never says Streaming again: %v", attrs.states)
	var after []State
	for _, r := range reports.got {
		if len(after) > 0 || r.State == Retrying {
			after = append(after, r.State)
		}
	}
	require.NotEmpty(t, after, "the stream heard it is Retrying")
	require.NotContains(t, after, Streaming, "no report says Streaming after the first failure")
	for _, in := range runs[1:] {
		require.True(t, in.Recovering, "a run after a failed one says its first commit is news")
	}
}

// A tablet Retrying after runs that made no progress stays Retrying
// while a new run has not committed yet, and shows Streaming (its search
// attribute too) at the signal its run sends at its first commit (the
// run was told the tablet is recovering); its attempt starts over.
func TestARetryingTabletShowsStreamingOnceARunCommits(t *testing.T) {
	const alias = "zone1-0000000101"
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", alias), Candidates: 1}, nil)
	// Each run takes two minutes: the first two fail (at 2m and about
	// 4m); the third reads well and is still running at 5m10s, when its
	// first commit's signal comes.
	var mu sync.Mutex
	runs := 0
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			mu.Lock()
			defer mu.Unlock()
			runs++
			if runs <= 2 {
				return activities.GetChangesResult{}, temporal.NewNonRetryableApplicationError("position 1.7 is not held by this replica", activities.ErrRetryElsewhere, nil,
					activities.ErrorDetails{Reason: "POSITION_MISMATCH", Replica: in.Replica.Alias})
			}
			return activities.GetChangesResult{Checkpoint: cp(in.Checkpoint.Index + 10), Records: 10, Batches: 1, Stopped: activities.StoppedRunEnded}, nil
		}).After(2 * time.Minute)
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
	var attrs stateAttributes
	attrs.mock(env)
	var before, after TabletStatus
	env.RegisterDelayedCallback(func() { before = queryStatus[TabletStatus](t, env) }, 5*time.Minute)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(activities.SignalProgress, activities.Progress{State: "Streaming", Attempt: 1, Replica: alias})
	}, 5*time.Minute+10*time.Second)
	var upserted []string // the search attribute's states until then
	env.RegisterDelayedCallback(func() {
		after, upserted = queryStatus[TabletStatus](t, env), attrs.since(Streaming)
		env.CancelWorkflow()
	}, 5*time.Minute+11*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	mu.Lock()
	require.Equal(t, 2, runs, "two runs failed; the third was running")
	mu.Unlock()
	require.Equal(t, Retrying, before.State, "a run that has not committed yet is no proof: %+v", before)
	require.Greater(t, before.Attempt, int32(1))
	require.Equal(t, Streaming, after.State, "%+v", after)
	require.Equal(t, int32(1), after.Attempt)
	require.Equal(t, []string{string(Streaming), string(Retrying), string(Streaming)}, upserted,
		"the search attribute: Streaming at the first run's start, Retrying at its failure, Streaming at the commit")
}
