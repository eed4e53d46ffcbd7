package workflows

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/activities"
)

// A tablet upserts its search attributes (a visibility write on the
// server each) when its state or its replica changes, not when only its
// reason's wording does: a tablet without an eligible replica looks again
// with backoff, and each look said why in other words (a replica's lag,
// seconds later), an upsert each time, for as long as it waited. The
// stream still hears the new reason.
func TestSearchAttributesAreUpsertedOnlyWhenStateOrReplicaChange(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	var attrs stateAttributes
	attrs.mock(env)
	looks := 0
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.SelectReplicaInput) (activities.Selection, error) {
			looks++
			if looks <= 6 {
				return activities.Selection{}, temporal.NewNonRetryableApplicationError(
					fmt.Sprintf("no eligible replica: zone1-0000000101 lagging %ds (maxLag 30s)", 30+looks), activities.ErrNoEligibleReplica, nil)
			}
			return activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 1}, nil
		})
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(activities.GetChangesResult{},
		temporal.NewNonRetryableApplicationError("the end", activities.ErrFatal, nil))
	reports := recordReports(env)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	require.NoError(t, env.GetWorkflowError())
	require.Equal(t, []string{string(NoEligibleReplica), string(Streaming), string(Failed)}, attrs.since(NoEligibleReplica),
		"one upsert for the six looks without an eligible replica")
	var last TabletStatus
	for _, r := range reports.got {
		if r.State == NoEligibleReplica {
			last = r
		}
	}
	require.Contains(t, last.LastError, "lagging 36s", "the stream heard the last wording")
}
