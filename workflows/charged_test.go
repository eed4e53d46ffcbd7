package workflows

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/activities"
)

// An error is charged to the replica its details name, not to the one
// the tablet believes its run reads: a run that moved in place and whose
// progress signal was lost (signals are best effort; a failed run's
// result, which says where it moved, never reaches the workflow) fails
// on the replica it moved to. Before, the tablet excluded the healthy
// replica it had picked and went back to the failing one.
func TestAnErrorIsChargedToTheReplicaItsDetailsName(t *testing.T) {
	const picked, movedTo = "zone1-0000000101", "zone2-0000000201"
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"retry elsewhere", temporal.NewNonRetryableApplicationError("position 1.20 is not held", activities.ErrRetryElsewhere, nil,
			activities.ErrorDetails{Reason: "POSITION_MISMATCH", Replica: movedTo, Checkpoint: cp(20)})},
		// The topology says the replica it moved to is down: another is
		// selected, and no exclusion (the picker skips it anyway); the
		// status names the replica that failed.
		{"replica unhealthy", temporal.NewNonRetryableApplicationError("replica zone2-0000000201 is down", activities.ErrReplicaUnhealthy, nil,
			activities.ErrorDetails{Reason: "REPLICA_DOWN", Replica: movedTo, Checkpoint: cp(20)})},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
			var selected []activities.SelectReplicaInput
			env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
				func(_ context.Context, in activities.SelectReplicaInput) (activities.Selection, error) {
					selected = append(selected, in)
					return activities.Selection{Replica: replica("t-0001", picked), Candidates: 3}, nil
				})
			runs := 0
			env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
				func(context.Context, activities.GetChangesInput) (activities.GetChangesResult, error) {
					runs++
					if runs <= 5 {
						return activities.GetChangesResult{}, tt.err
					}
					return activities.GetChangesResult{}, temporal.NewNonRetryableApplicationError("the end", activities.ErrFatal, nil)
				})
			recordReports(env)
			var mu sync.Mutex
			var retryingOn []string // the replicas the search attributes say a Retrying tablet reads, in order
			env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
				sa := args.Get(0).(temporal.SearchAttributes)
				if st, _ := sa.GetKeyword(SAState); st == string(Retrying) {
					r, _ := sa.GetKeyword(SAReplica)
					mu.Lock()
					retryingOn = append(retryingOn, r)
					mu.Unlock()
				}
			}).Return(nil)
			env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

			require.NoError(t, env.GetWorkflowError())
			require.GreaterOrEqual(t, len(selected), 2)
			if tt.name == "replica unhealthy" {
				require.Empty(t, selected[1].Exclude)
				mu.Lock()
				defer mu.Unlock()
				require.NotEmpty(t, retryingOn)
				require.Equal(t, movedTo, retryingOn[0], "the status names the replica that failed")
				return
			}
			require.Len(t, selected[1].Exclude, 1, "excluded after the first failed run: %+v", selected[1].Exclude)
			require.Equal(t, movedTo, selected[1].Exclude[0].Alias, "the replica the error names")
		})
	}
}

// A run's outcome names the replica its error's details name: a typed
// error's, and a retry-same error's whose retries ran out (the SDK wraps
// it in an ActivityError with the retry state; the e2e tests cover that).
func TestRunOutcomeNamesTheReplicaOfTheErrorsDetails(t *testing.T) {
	d := activities.ErrorDetails{Reason: "UNAVAILABLE", Replica: "zone2-0000000201", Checkpoint: cp(20)}
	for _, err := range []error{
		temporal.NewNonRetryableApplicationError("boom", activities.ErrRetryElsewhere, nil, d),
		temporal.NewApplicationErrorWithOptions("boom", activities.ErrRetrySame, temporal.ApplicationErrorOptions{Details: []any{d}}),
	} {
		require.Equal(t, "zone2-0000000201", runOutcome(activities.GetChangesResult{}, err, false, true).replica, "%v", err)
	}
	require.Empty(t, runOutcome(activities.GetChangesResult{}, errors.New("plain"), false, true).replica)
}

// Records and batches a run committed before it ended in an error are
// counted: the error's details say what it committed (a failed
// activity's result never reaches the workflow), or, when the run timed
// out, its last heartbeat.
func TestRecordsCommittedByARunThatFailedAreCounted(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 3}, nil)
	runs := 0
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.GetChangesInput) (activities.GetChangesResult, error) {
			runs++
			switch runs {
			case 1:
				return activities.GetChangesResult{}, temporal.NewNonRetryableApplicationError("position 1.30 is not held", activities.ErrRetryElsewhere, nil,
					activities.ErrorDetails{Reason: "POSITION_MISMATCH", Replica: "zone1-0000000101", Checkpoint: cp(30), Records: 30, Batches: 3})
			case 2:
				return activities.GetChangesResult{Checkpoint: cp(40), Records: 10, Batches: 1, Stopped: activities.StoppedRunEnded}, nil
			}
			return activities.GetChangesResult{}, temporal.NewNonRetryableApplicationError("auth", activities.ErrFatal, nil,
				activities.ErrorDetails{Reason: "UNAUTHENTICATED", Replica: "zone1-0000000101", Checkpoint: cp(45), Records: 5, Batches: 1})
		})
	recordReports(env)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	require.NoError(t, env.GetWorkflowError())
	st := queryStatus[TabletStatus](t, env)
	require.Equal(t, Failed, st.State)
	require.Equal(t, int64(45), st.Records, "30 before a retry elsewhere, 10 in a run, 5 before a fatal error")
	require.Equal(t, int64(5), st.Batches)
	require.Equal(t, cp(45), st.Checkpoint)
}

// A run that timed out (its worker died; the retries ran out) is counted
// from its last heartbeat.
func TestRunOutcomeOfATimedOutRunCountsItsLastHeartbeat(t *testing.T) {
	err := temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_HEARTBEAT, nil, activities.Heartbeat{Checkpoint: cp(12), Records: 12, Batches: 2})
	o := runOutcome(activities.GetChangesResult{}, err, false, true)
	require.Equal(t, int64(12), o.records)
	require.Equal(t, int64(2), o.batches)
}
