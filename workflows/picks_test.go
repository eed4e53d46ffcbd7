package workflows

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// A new stream's first topology read picks its tablets' first replicas
// (changeFirstPicks): each tablet picked for starts on its replica, its
// row already Streaming there; one the picker found nothing for starts
// as before (Starting, selecting itself). Later reads only list.
func TestStreamStartsItsTabletsOnTheReplicasItPicked(t *testing.T) {
	env := newPicksEnv(t)
	tablets := []source.Tablet{
		{ID: "t-0001", Replicas: []source.Replica{replica("t-0001", "zone1-0000000101")}},
		{ID: "t-0002", Replicas: []source.Replica{replica("t-0002", "zone1-0000000102")}},
	}
	pick := activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 1}
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil)
	var mu sync.Mutex
	var asked []activities.PickInput
	env.OnActivity(a.ReadTopologyAndPick, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.PickInput) (activities.Topology, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, in)
			topo := activities.TopologyOf(tablets)
			topo.Picks = map[string]activities.Selection{"t-0001": pick}
			return topo, nil
		})
	listed := 0
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(
		func(context.Context, config.Source) (activities.Topology, error) {
			mu.Lock()
			defer mu.Unlock()
			listed++
			return activities.TopologyOf(tablets), nil
		})
	env.OnActivity(a.CheckTablets, mock.Anything, mock.Anything).Return(nil, nil).Maybe()
	var started startedTablets
	started.mock(env)
	var memo map[string]int
	env.OnUpsertMemo(mock.Anything).Run(func(args mock.Arguments) {
		if s, ok := args.Get(0).(map[string]any)["tabletStates"].(map[string]int); ok {
			memo = s
		}
	}).Return(nil)
	var st StreamStatus
	env.RegisterDelayedCallback(func() { st = queryStatus[StreamStatus](t, env) }, 25*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 26*time.Second)
	cfg := map[string]any{}
	require.NoError(t, json.Unmarshal(streamConfig(t), &cfg))
	cfg["exclude"] = []map[string]any{{"alias": "zone2-0000000201", "reason": "maintenance"}}
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)
	env.ExecuteWorkflow(StreamWorkflow, json.RawMessage(raw), (*StreamState)(nil))

	require.Len(t, asked, 1, "only the first read picks")
	require.Positive(t, listed, "later reads list the topology as before")
	require.Equal(t, maxChildrenPerRun, asked[0].Max)
	require.Equal(t, []string{"zone1", "zone2"}, asked[0].Selection.Cells)
	require.Len(t, asked[0].Operator, 1)
	require.Equal(t, "zone2-0000000201", asked[0].Operator[0].Alias, "the picks skip the operator's exclusions")

	require.NotNil(t, started.in["t-0001"].First)
	require.Equal(t, pick, *started.in["t-0001"].First)
	require.Nil(t, started.in["t-0002"].First, "no pick: the tablet selects itself")
	rows := map[string]TabletStatus{}
	for _, r := range st.Tablets {
		rows[r.ID] = r
	}
	require.Equal(t, Streaming, rows["t-0001"].State)
	require.Equal(t, "zone1-0000000101", rows["t-0001"].Replica)
	require.Equal(t, Starting, rows["t-0002"].State)
	require.Equal(t, map[string]int{string(Streaming): 1, string(Starting): 1}, memo)
}

// A tablet started with its first replica picked reads it at once: no
// picker of its own, and no report at its start (the stream made its row
// Streaming on that replica); its first report is the next news.
func TestTabletStartsOnTheReplicaTheStreamPicked(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	selected := 0
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.SelectReplicaInput) (activities.Selection, error) {
			selected++
			return activities.Selection{Replica: replica("t-0001", "zone1-0000000199"), Candidates: 2}, nil
		}).Maybe()
	var runs []activities.GetChangesInput
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			runs = append(runs, in)
			return activities.GetChangesResult{Checkpoint: cp(10), Records: 10, Stopped: activities.StoppedRunEnded}, nil
		}).After(time.Minute)
	reports := recordReports(env)
	var st TabletStatus
	early := -1
	env.RegisterDelayedCallback(func() { st, early = queryStatus[TabletStatus](t, env), len(reports.got) }, 30*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 90*time.Second)
	first := activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 2}
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1, First: &first},
		(*TabletState)(nil))

	require.Zero(t, selected, "the stream picked: no picker of the tablet's own")
	require.NotEmpty(t, runs)
	require.Equal(t, "zone1-0000000101", runs[0].Replica.Alias)
	require.Zero(t, early, "no report at the start: the stream's row says it already")
	require.Equal(t, Streaming, st.State)
	require.Equal(t, "zone1-0000000101", st.Replica)
}
