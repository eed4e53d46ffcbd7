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
// start marked as a resync's; a resync of a tablet that runs is rejected
// and shown; a resync the source refuses puts the tablet back as it was,
// saying why.
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
					Checkpoint: cp(77), Records: 72, Updated: env.Now()})
			}, 5*time.Second)
			env.RegisterDelayedCallback(func() {
				env.SignalWorkflow(CmdResync, json.RawMessage(`{"tablets": ["t-0002"]}`))
				env.SignalWorkflow(CmdResync, json.RawMessage(`{"tablets": ["t-0001"], "reason": "slots dropped"}`))
			}, 6*time.Second)
			var st StreamStatus
			env.RegisterDelayedCallback(func() { st = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 9*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

			require.Len(t, st.Rejected, 1, "%+v", st.Rejected)
			require.Contains(t, st.Rejected[0].Reason, "t-0002 is Starting")
			require.Len(t, asked, 1)
			require.Equal(t, activities.ResyncInput{Stream: "orders", Source: asked[0].Source, Tablet: "t-0001", ID: "t-0001/1"}, asked[0])
			var row TabletStatus
			for _, tr := range st.Tablets {
				if tr.ID == "t-0001" {
					row = tr
				}
			}
			if tt.err != nil {
				require.Len(t, r.starts, 2, "no new workflow")
				require.Equal(t, Expired, row.State)
				require.Contains(t, row.Reason, "resync failed: stream orders has no publication")
				require.Equal(t, cp(77), row.Checkpoint)
				return
			}
			require.Len(t, r.starts, 3)
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
