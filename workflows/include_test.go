package workflows

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// operatorPicker is a SelectReplica that picks the tablet's one replica
// unless it is excluded: by the tablet's own list, or by the operator's
// as the selection reads it — the list the tablet passed when it says
// the list is known (OperatorKnown), else the stream's current one (what
// the workers' watchers and the exclusions query read).
type operatorPicker struct {
	mu      sync.Mutex
	current config.ExcludeList // the stream's operator list now
	picks   []activities.SelectReplicaInput
}

func (p *operatorPicker) setCurrent(l config.ExcludeList) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = l
}

// A tablet that started with its only replica excluded by the operator
// never selected a replica; an include lifts the exclusion for it too:
// it selects with the stream's current list, not the one it was started
// with, and streams at once.
func TestIncludeLiftsAnOperatorExclusionForATabletThatNeverSelected(t *testing.T) {
	const alias = "zone1-0000000101"
	env := newEnv(t)
	w := &streamWith{lists: [][]source.Tablet{{{ID: "t-0001", Replicas: []source.Replica{replica("t-0001", alias)}}}}}
	w.mock(env)
	p := &operatorPicker{current: config.ExcludeList{{Alias: alias, Reason: "maintenance"}}}
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.SelectReplicaInput) (activities.Selection, error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.picks = append(p.picks, in)
			operator := in.Operator
			if !in.OperatorKnown {
				operator = p.current
			}
			if e, ok := append(in.Exclude, operator...).Excludes(alias, in.Tablet, env.Now()); ok {
				return activities.Selection{}, nonRetryable(activities.ErrNoEligibleReplica, alias+": excluded: "+e.Reason)
			}
			return activities.Selection{Replica: replica(in.Tablet, alias), Candidates: 1}, nil
		})
	var mu sync.Mutex
	var streamedAt time.Time // when the first GetChanges started
	env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		mu.Lock()
		defer mu.Unlock()
		if info.ActivityType.Name == "GetChanges" && streamedAt.IsZero() {
			streamedAt = env.Now()
		}
	})
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			return activities.GetChangesResult{Checkpoint: cp(in.Checkpoint.Index + 1), Records: 1, Batches: 1, Stopped: activities.StoppedRunEnded}, nil
		}).After(time.Minute)

	var cfg map[string]any
	require.NoError(t, json.Unmarshal(streamConfig(t), &cfg))
	cfg["exclude"] = []map[string]any{{"alias": alias, "reason": "maintenance"}}
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)

	var before StreamStatus
	var includedAt time.Time
	env.RegisterDelayedCallback(func() {
		before = queryStatus[StreamStatus](t, env)
		includedAt = env.Now()
		p.setCurrent(nil)
		env.SignalWorkflow(CmdInclude, json.RawMessage(`{"aliases": ["`+alias+`"]}`))
	}, 20*time.Second)
	var after StreamStatus
	env.RegisterDelayedCallback(func() { after = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 3*time.Minute)
	env.ExecuteWorkflow(StreamWorkflow, json.RawMessage(raw), (*StreamState)(nil))

	require.Len(t, before.Tablets, 1)
	require.Equal(t, NoEligibleReplica, before.Tablets[0].State, "the tablet waits for a replica before the include: %+v", before.Tablets[0])
	mu.Lock()
	defer mu.Unlock()
	last := p.picks[len(p.picks)-1]
	require.False(t, streamedAt.IsZero(), "the tablet never streamed after the include: %d selections, the last with operator list %v (known: %v); state %s",
		len(p.picks), last.Operator, last.OperatorKnown, after.Tablets[0].State)
	require.Less(t, streamedAt.Sub(includedAt), 5*time.Second, "the tablet streams at once after the include")
	require.Equal(t, Streaming, after.Tablets[0].State)
}
