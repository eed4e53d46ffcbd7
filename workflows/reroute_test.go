package workflows

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
)

// A run that moved to another replica in place (the operator excluded
// its own) hands the tablet its new selection: the next run reads that
// replica without selecting, the status names it, and an error after a
// move is counted against the replica moved to, not the excluded one.
func TestTabletTakesTheReplicaARunMovedToInPlace(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	first := activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 3}
	movedByResult := activities.Selection{Replica: replica("t-0001", "zone2-0000000201"), Candidates: 2}
	movedBySignal := activities.Selection{Replica: replica("t-0001", "zone3-0000000301"), Candidates: 2}
	selections := 0
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.SelectReplicaInput) (activities.Selection, error) {
			selections++
			return first, nil
		})
	var calls []activities.GetChangesInput
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			calls = append(calls, in)
			switch len(calls) {
			case 1: // moved, and the progress signal was lost: the result says so
				return activities.GetChangesResult{Checkpoint: cp(10), Stopped: activities.StoppedRunEnded, Switched: &movedByResult}, nil
			case 2: // moved again (the signal below), then the new replica failed
				return activities.GetChangesResult{}, temporal.NewNonRetryableApplicationError("lost history", activities.ErrRetryElsewhere, nil,
					activities.ErrorDetails{Reason: "POSITION_MISMATCH", Checkpoint: cp(20)})
			}
			return activities.GetChangesResult{Checkpoint: cp(30), Stopped: activities.StoppedRunEnded}, nil
		}).After(time.Minute)
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
	var moved TabletStatus
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(activities.SignalProgress, activities.Progress{State: "Streaming", Attempt: 1,
			Replica: movedBySignal.Replica.Alias, Switched: &movedBySignal})
	}, 90*time.Second)
	env.RegisterDelayedCallback(func() { moved = queryStatus[TabletStatus](t, env) }, 100*time.Second)
	var status TabletStatus
	env.RegisterDelayedCallback(func() { status = queryStatus[TabletStatus](t, env); env.CancelWorkflow() }, 150*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	require.GreaterOrEqual(t, len(calls), 2)
	require.NotNil(t, calls[0].Reroute, "the run may move in place")
	require.Equal(t, movedByResult.Replica.Alias, calls[1].Replica.Alias, "the next run reads the replica moved to")
	require.Equal(t, cp(10), calls[1].Checkpoint)
	require.Equal(t, movedBySignal.Replica.Alias, moved.Replica, "the status names the replica moved to")
	require.Len(t, status.Excluded, 1)
	require.Equal(t, movedBySignal.Replica.Alias, status.Excluded[0].Alias, "the error counts against the replica moved to")
	require.Equal(t, "POSITION_MISMATCH", status.Excluded[0].Reason)
	require.Equal(t, 2, selections, "one selection at the start, one after the failure; none after a move")
}

// A run that left a replica in place because the source said to read
// elsewhere (POSITION_MISMATCH) puts it on the tablet's own exclude list,
// as a run that failed so would have: the status shows it with its reason
// and expiry at once (the progress signal), once though the result says
// it again, and the tablet's next runs and selections skip it.
func TestTabletExcludesTheReplicaARunLeftInPlace(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	cfg := mustConfig(t)
	first := activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 3}
	moved := activities.Selection{Replica: replica("t-0001", "zone2-0000000201"), Candidates: 2}
	left := config.Exclusion{Alias: first.Replica.Alias, Tablet: "t-0001", Reason: "POSITION_MISMATCH"}
	var selects []activities.SelectReplicaInput
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.SelectReplicaInput) (activities.Selection, error) {
			selects = append(selects, in)
			if len(selects) == 1 {
				return first, nil
			}
			return moved, nil
		})
	var calls []activities.GetChangesInput
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			calls = append(calls, in)
			switch len(calls) {
			case 1:
				return activities.GetChangesResult{Checkpoint: cp(10), Stopped: activities.StoppedRunEnded,
					Switched: &moved, Left: config.ExcludeList{left}}, nil
			case 2: // the operator's pause ends it; the tablet selects when resumed
				return activities.GetChangesResult{Checkpoint: cp(20), Stopped: "cancelled"}, nil
			}
			return activities.GetChangesResult{Checkpoint: cp(30), Stopped: activities.StoppedRunEnded}, nil
		}).After(time.Minute)
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil)
	var signalled time.Time
	env.RegisterDelayedCallback(func() {
		signalled = env.Now()
		env.SignalWorkflow(activities.SignalProgress, activities.Progress{State: "Streaming", Attempt: 1,
			Replica: moved.Replica.Alias, Switched: &moved, Left: &left})
	}, 30*time.Second)
	var during TabletStatus
	env.RegisterDelayedCallback(func() { during = queryStatus[TabletStatus](t, env) }, 40*time.Second)
	var status TabletStatus
	env.RegisterDelayedCallback(func() { status = queryStatus[TabletStatus](t, env); env.CancelWorkflow() }, 150*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: cfg, Tablets: 1}, (*TabletState)(nil))

	want := left
	want.Expires = signalled.Add(cfg.AutoExcludeTTL.D()).UTC()
	utc := func(l config.ExcludeList) config.ExcludeList {
		for i := range l {
			l[i].Expires = l[i].Expires.UTC()
		}
		return l
	}
	require.Equal(t, config.ExcludeList{want}, utc(during.Excluded), "the signal put the replica on the tablet's list")
	require.Equal(t, moved.Replica.Alias, during.Replica)
	require.Equal(t, config.ExcludeList{want}, utc(status.Excluded), "the result's word for it changed nothing")
	require.GreaterOrEqual(t, len(calls), 2)
	require.Equal(t, moved.Replica.Alias, calls[1].Replica.Alias, "the next run reads the replica moved to")
	require.Equal(t, config.ExcludeList{want}, utc(calls[1].Reroute.Exclude), "the next run does not move back to it")
	require.GreaterOrEqual(t, len(selects), 2, "the cancelled run's tablet selects again")
	for _, in := range selects[1:] {
		require.Equal(t, config.ExcludeList{want}, utc(in.Exclude), "a selection skips it")
	}
}
