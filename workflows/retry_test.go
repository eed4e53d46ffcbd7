package workflows

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// A retry of a Failed tablet whose workflow has reported Failed but not
// closed yet (its terminal report just arrived) cannot start a new
// workflow under the tablet's ID while the old one runs. The stream does
// not take the closing one for the retried tablet: it starts the new
// workflow once the old one has closed, from the tablet's checkpoint,
// and its row never stays Starting with no workflow behind it.
func TestRetryOfATabletWhoseWorkflowIsStillClosingStartsItOnceItClosed(t *testing.T) {
	// The tablet workflows are a fake registered under TabletWorkflow's
	// name (a mocked child's start is seen only when it has ended).
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.RegisterActivity(a)
	env.RegisterWorkflow(StreamWorkflow)
	env.SetStartWorkflowOptions(clientOptions("orders"))
	failed := TabletStatus{ID: "t-0001", State: Failed, Reason: "sink: SINK_CORRUPT", Checkpoint: cp(77), Records: 77, Seq: 3}
	var mu sync.Mutex
	var starts []*TabletState
	var startedAt []time.Time
	var oldClosedAt time.Time
	// The first workflow reports Failed at 5s (below) and closes at 20s
	// (its report's confirmation was slow); the retried one runs on.
	env.RegisterWorkflowWithOptions(
		func(ctx workflow.Context, in TabletInput, st *TabletState) error {
			mu.Lock()
			starts, startedAt = append(starts, st), append(startedAt, workflow.Now(ctx))
			n := len(starts)
			mu.Unlock()
			if n > 1 {
				return workflow.Sleep(ctx, time.Hour)
			}
			err := workflow.Sleep(ctx, 20*time.Second)
			mu.Lock()
			oldClosedAt = workflow.Now(ctx)
			mu.Unlock()
			return err
		}, workflow.RegisterOptions{Name: "TabletWorkflow"})
	env.OnGetVersion(changeFirstPicks, workflow.DefaultVersion, 1).Return(workflow.DefaultVersion).Maybe()
	t.Cleanup(func() { env.AssertExpectations(t) })
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil)
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(
		func(context.Context, config.Source) (activities.Topology, error) {
			return activities.TopologyOf([]source.Tablet{{ID: "t-0001"}}), nil
		})
	// CheckTablets sees the first workflow closed (Completed, its final
	// status Failed) once it has, and the second one running.
	env.OnActivity(a.CheckTablets, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.CheckTabletsInput) ([]activities.ClosedTablet, error) {
			mu.Lock()
			defer mu.Unlock()
			if len(starts) != 1 || oldClosedAt.IsZero() {
				return nil, nil
			}
			final, _ := json.Marshal(failed)
			return []activities.ClosedTablet{{Tablet: "t-0001", Status: "Completed", Final: final}}, nil
		})
	var during StreamStatus
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalTabletReport, failed) }, 5*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdRetry, json.RawMessage(`{"tablets": ["t-0001"]}`)) }, 6*time.Second)
	env.RegisterDelayedCallback(func() { during = queryStatus[StreamStatus](t, env) }, 7*time.Second)
	var after StreamStatus
	env.RegisterDelayedCallback(func() { after = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 2*time.Minute)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	mu.Lock()
	defer mu.Unlock()
	t.Logf("starts at %v, the old one closed at %v", startedAt, oldClosedAt)
	require.Len(t, during.Tablets, 1)
	require.Equal(t, Starting, during.Tablets[0].State, "retried: %+v", during.Tablets[0])
	require.Contains(t, during.Tablets[0].Reason, "previous workflow", "the row says what it waits for")
	require.Len(t, starts, 2, "the retry started a new workflow once the old one closed; status %+v", after.Tablets)
	require.Less(t, startedAt[1].Sub(oldClosedAt), 15*time.Second, "soon after the old one closed")
	require.Equal(t, cp(77), starts[1].Checkpoint, "from the tablet's checkpoint")
	require.Equal(t, int64(77), starts[1].Status.Records, "with its counters")
	require.Equal(t, Starting, after.Tablets[0].State)
	require.Equal(t, "retried by the operator", after.Tablets[0].Reason)
}
