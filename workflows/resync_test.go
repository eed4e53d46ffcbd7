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

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/source"
)

// A resync of an Expired tablet makes its fresh start with the Resync
// activity (an id of its own) and starts its new workflow from it, the
// start marked as a resync's; a second resync of it meanwhile is
// rejected and shown; a resync the source refuses puts the tablet back
// as it was, saying why. A resync of a Streaming tablet tells it to stop
// and goes on once its Stopped report comes.
func TestResyncStartsAnExpiredTabletFromItsFreshStart(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"made", nil},
		{"refused", temporal.NewNonRetryableApplicationError("stream orders has no publication on shard s1", activities.ErrFatal, errors.New("stream orders has no publication on shard s1"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			w := &streamWith{lists: [][]source.Tablet{{{ID: "t-0001"}, {ID: "t-0002"}}}}
			w.mock(env)
			var r tabletRunner
			r.mock(env)
			var mu sync.Mutex
			var asked []activities.ResyncInput
			env.OnActivity(a.Resync, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.ResyncInput) (source.Checkpoint, error) {
				mu.Lock()
				defer mu.Unlock()
				asked = append(asked, in)
				return cp(900), tt.err
			})
			env.RegisterDelayedCallback(func() {
				env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Expired, Reason: "history gone",
					Checkpoint: cp(77), Records: 72, Updated: env.Now(), Seq: 1})
				env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0002", State: Streaming, Checkpoint: cp(40), Updated: env.Now(), Seq: 1})
			}, 5*time.Second)
			env.RegisterDelayedCallback(func() {
				env.SignalWorkflow(CmdResync, json.RawMessage(`{"tablets": ["t-0001"], "reason": "slots dropped"}`))
				env.SignalWorkflow(CmdResync, json.RawMessage(`{"tablets": ["t-0001"]}`))
				env.SignalWorkflow(CmdResync, json.RawMessage(`{"tablets": ["t-0002"]}`))
			}, 6*time.Second)
			var stopping StreamStatus
			env.RegisterDelayedCallback(func() { stopping = queryStatus[StreamStatus](t, env) }, 6500*time.Millisecond)
			env.RegisterDelayedCallback(func() {
				env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0002", State: Stopped, Checkpoint: cp(50), Updated: env.Now(), Seq: 2})
			}, 7*time.Second)
			var st StreamStatus
			env.RegisterDelayedCallback(func() { st = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 9*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

			require.Len(t, st.Rejected, 1, "%+v", st.Rejected)
			require.Contains(t, st.Rejected[0].Reason, "t-0001 is being resynced already")
			require.Equal(t, Streaming, tabletStatus(stopping, "t-0002").State, "the running tablet is told to stop first")
			require.Contains(t, tabletStatus(stopping, "t-0002").Reason, "stopping it first")
			require.Len(t, asked, 2)
			require.Equal(t, activities.ResyncInput{Stream: "orders", Source: asked[0].Source, Tablet: "t-0001", ID: "t-0001/1", After: cp(77)}, asked[0],
				"with the tablet's last checkpoint")
			require.Equal(t, activities.ResyncInput{Stream: "orders", Source: asked[1].Source, Tablet: "t-0002", ID: "t-0002/2", After: cp(50)}, asked[1],
				"made once its Stopped report came, after its final commit")
			row := tabletStatus(st, "t-0001")
			if tt.err != nil {
				require.Len(t, r.starts, 2, "no new workflow")
				require.Equal(t, Stopped, tabletStatus(st, "t-0002").State, "back as it was")
				require.Equal(t, Expired, row.State)
				require.Contains(t, row.Reason, "resync failed: stream orders has no publication")
				require.Equal(t, cp(77), row.Checkpoint)
				return
			}
			require.Len(t, r.starts, 4)
			require.Equal(t, "t-0002", r.starts[3].Tablet)
			require.Equal(t, cp(900), r.starts[3].Start)
			in, state := r.starts[2], r.states[2]
			require.Equal(t, "t-0001", in.Tablet)
			require.Equal(t, cp(900), in.Start, "from the fresh start")
			require.True(t, in.Resync, "marked as a resync's")
			require.NotNil(t, state)
			require.Equal(t, cp(900), state.Checkpoint)
			require.Equal(t, 1, row.Resyncs)
			require.Contains(t, row.Reason, "slots dropped")
		})
	}
}

// tabletStatus is a tablet's row of a stream status.
func tabletStatus(st StreamStatus, id string) TabletStatus {
	for _, t := range st.Tablets {
		if t.ID == id {
			return t
		}
	}
	return TabletStatus{}
}

// A tablet being resynced is counted in the memo's tabletStates
// (changeLiveStatus), so that tabletflow_tablets_not_streaming counts it.
func TestMemoCountsAResyncingTablet(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{lists: [][]source.Tablet{{{ID: "t-0001"}}}}
	w.mock(env)
	var r tabletRunner
	r.mock(env)
	env.OnActivity(a.Resync, mock.Anything, mock.Anything).After(10*time.Second).Return(cp(900), nil)
	var counts []map[string]int
	env.OnUpsertMemo(mock.Anything).Run(func(args mock.Arguments) {
		if c, ok := args.Get(0).(map[string]any)[MemoTabletStates]; ok {
			counts = append(counts, c.(map[string]int))
		}
	}).Return(nil)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Expired, Checkpoint: cp(77), Updated: env.Now(), Seq: 1})
	}, 5*time.Second)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(CmdResync, json.RawMessage(`{"tablets": ["t-0001"]}`))
	}, 6*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 12*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.Contains(t, counts, map[string]int{string(Resyncing): 1}, "%v", counts)
}
