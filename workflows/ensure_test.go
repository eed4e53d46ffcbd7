package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
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

// sourceDown is a source that refuses to create the stream until up (in
// the test environment's time), and records the order of the calls that
// create and drop the source-side stream.
type sourceDown struct {
	mu    sync.Mutex
	up    time.Time
	calls []string
}

func (d *sourceDown) mock(env *testsuite.TestWorkflowEnvironment) {
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.EnsureStreamInput) (source.Stream, error) {
			d.mu.Lock()
			defer d.mu.Unlock()
			if env.Now().Before(d.up) {
				d.calls = append(d.calls, "ensure failed")
				return source.Stream{}, errors.New("UNAVAILABLE: source down")
			}
			d.calls = append(d.calls, "ensured")
			return source.Stream{ID: "orders", Retention: time.Hour}, nil
		})
	env.OnActivity(a.DeleteStream, mock.Anything, mock.Anything).Return(
		func(context.Context, activities.DeleteStreamInput) error {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.calls = append(d.calls, "deleted")
			return nil
		}).Maybe()
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(
		func(context.Context, config.Source) (activities.Topology, error) {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.calls = append(d.calls, "listed")
			return activities.TopologyOf([]source.Tablet{{ID: "t-0001"}, {ID: "t-0002"}}), nil
		}).Maybe()
	env.OnActivity(a.CheckTablets, mock.Anything, mock.Anything).Return(nil, nil).Maybe()
}

func (d *sourceDown) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.calls...)
}

// TestStreamTakesAStopWhileItsSourceStreamCannotBeCreated: a source down
// when the stream starts does not hold the loop (changeEnsureBeside): the
// status says since when the source-side stream cannot be made, and a
// stop ends the stream without waiting for the source.
func TestStreamTakesAStopWhileItsSourceStreamCannotBeCreated(t *testing.T) {
	env := newEnv(t)
	d := &sourceDown{up: env.Now().Add(24 * time.Hour)}
	d.mock(env)
	var during StreamStatus
	env.RegisterDelayedCallback(func() { during = queryStatus[StreamStatus](t, env) }, 90*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdStop, json.RawMessage(`{}`)) }, 100*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError(), "the stop ends the stream")
	require.NotNil(t, during.Topology, "the status says the source-side stream cannot be made")
	require.Contains(t, during.Topology.Error, "create the source-side stream")
	require.Contains(t, during.Topology.Error, "source down")
	require.False(t, during.Topology.Since.IsZero())
	require.Empty(t, during.Tablets)
	require.NotContains(t, d.seen(), "listed", "no listing before the source-side stream exists")
	require.Contains(t, d.seen(), "ensure failed")
}

// TestStreamStartsItsTabletsOnceItsSourceStreamIsCreated: the creation is
// tried again until the source answers; then the trouble is cleared and
// the tablets start with the source's retention. The creation before the
// loop (streams from before changeEnsureBeside) passes it too: it guards
// the new path's start, while the stop test above tells the two apart.
func TestStreamStartsItsTabletsOnceItsSourceStreamIsCreated(t *testing.T) {
	env := newEnv(t)
	d := &sourceDown{up: env.Now().Add(2 * time.Minute)}
	d.mock(env)
	var started startedTablets
	started.mock(env)
	var later StreamStatus
	env.RegisterDelayedCallback(func() { later = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 4*time.Minute)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.Nil(t, later.Topology, "cleared once the source-side stream exists")
	require.Len(t, later.Tablets, 2)
	started.mu.Lock()
	defer started.mu.Unlock()
	require.Len(t, started.in, 2)
	require.Equal(t, time.Hour, started.in["t-0001"].Retention, "the tablets get the retention the creation returned")
	calls := d.seen()
	listed := slices.Index(calls, "listed")
	require.Positive(t, listed, "listed: %v", calls)
	require.Equal(t, "ensured", calls[listed-1], "listed only after the creation: %v", calls)
}

// TestStreamStopThatDropsTheSourceStreamWaitsForACreationUnderWay: a stop
// with dropSourceStream that comes while the creation is retrying drops
// the source-side stream after that creation, never before it.
func TestStreamStopThatDropsTheSourceStreamWaitsForACreationUnderWay(t *testing.T) {
	env := newEnv(t)
	d := &sourceDown{up: env.Now().Add(30 * time.Second)}
	d.mock(env)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(CmdStop, json.RawMessage(`{"dropSourceStream": true}`))
	}, 5*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	calls := d.seen()
	require.Equal(t, "deleted", calls[len(calls)-1], "dropped last: %v", calls)
	require.Contains(t, calls, "ensured")
	require.Less(t, slices.Index(calls, "ensured"), slices.Index(calls, "deleted"), "after the creation: %v", calls)
}

// TestStreamFailsWhenTheSourceRefusesItsStreamForGood: a Fatal error
// creating the source-side stream (no permission, unknown tables) fails
// the stream with it, as it did when the creation came before the loop.
func TestStreamFailsWhenTheSourceRefusesItsStreamForGood(t *testing.T) {
	env := newEnv(t)
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{},
		temporalNonRetryable("permission denied for database", activities.ErrFatal, activities.ErrorDetails{Reason: "PERMISSION_DENIED"}))
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	require.True(t, env.IsWorkflowCompleted())
	require.ErrorContains(t, env.GetWorkflowError(), "permission denied")
}
