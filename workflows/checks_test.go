package workflows

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// A stream that cannot check its tablet workflows (CheckTablets fails:
// the server refuses the describes) says so in its status, with since
// when, as it does for a topology it cannot read: a tablet that closed
// meanwhile is not restarted, and nothing else would show it. Once a
// check succeeds again, the status drops it.
func TestAFailedCheckOfTheTabletWorkflowsShowsInTheStatus(t *testing.T) {
	env := newEnv(t)
	st := &StreamState{Tablets: map[string]*TabletStatus{
		"t-0001": {ID: "t-0001", State: Streaming, Replica: "zone1-0000000101", Checkpoint: cp(7), Seq: 1},
	}, Aliases: []string{"zone1-0000000101"}}
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil)
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(
		func(context.Context, config.Source) (activities.Topology, error) {
			return activities.TopologyOf([]source.Tablet{{ID: "t-0001"}}), nil
		})
	var mu sync.Mutex
	failing := true
	env.OnActivity(a.CheckTablets, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.CheckTabletsInput) ([]activities.ClosedTablet, error) {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return nil, errors.New("describe orders/tablet/t-0001: PermissionDenied: namespace access denied")
			}
			return nil, nil
		})
	var during, after map[string]any
	env.RegisterDelayedCallback(func() {
		during = queryRaw(t, env)
		mu.Lock()
		failing = false
		mu.Unlock()
	}, 5*time.Minute)
	env.RegisterDelayedCallback(func() { after = queryRaw(t, env); env.CancelWorkflow() }, 8*time.Minute)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), st)

	checks, ok := during["checks"].(map[string]any)
	require.True(t, ok, "the status says the checks fail: %v", during)
	require.Contains(t, checks["error"], "PermissionDenied")
	require.NotEmpty(t, checks["since"])
	require.NotContains(t, after, "checks", "gone once a check succeeded")
	require.NotContains(t, during, "topology", "the topology itself is read fine")
}

// queryRaw is the status query's answer as JSON fields.
func queryRaw(t *testing.T, env *testsuite.TestWorkflowEnvironment) map[string]any {
	t.Helper()
	v, err := env.QueryWorkflow(QueryStatus)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, v.Get(&m))
	return m
}
