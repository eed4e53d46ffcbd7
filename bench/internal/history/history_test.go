package history

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
)

// fakeHistories answers GetWorkflowHistory from runs by run ID ("" is the
// current run); a run ID in fail fails on its second event. Any other
// client method panics (nil embedded interface).
type fakeHistories struct {
	client.Client
	runs map[string][]*historypb.HistoryEvent
	fail map[string]bool
	asks []string
}

func (f *fakeHistories) GetWorkflowHistory(_ context.Context, _, runID string, _ bool, _ enumspb.HistoryEventFilterType) client.HistoryEventIterator {
	f.asks = append(f.asks, runID)
	return &fakeIterator{events: f.runs[runID], fail: f.fail[runID]}
}

type fakeIterator struct {
	events []*historypb.HistoryEvent
	fail   bool
	i      int
}

func (it *fakeIterator) HasNext() bool { return it.i < len(it.events) }

func (it *fakeIterator) Next() (*historypb.HistoryEvent, error) {
	if it.fail && it.i == 1 {
		return nil, errors.New("page lost")
	}
	it.i++
	return it.events[it.i-1], nil
}

// started is a run's first event, continuing prev ("" for the first run).
func started(id int64, prev string) *historypb.HistoryEvent {
	return &historypb.HistoryEvent{EventId: id, EventType: enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
		Attributes: &historypb.HistoryEvent_WorkflowExecutionStartedEventAttributes{
			WorkflowExecutionStartedEventAttributes: &historypb.WorkflowExecutionStartedEventAttributes{ContinuedExecutionRunId: prev}}}
}

func other(id int64) *historypb.HistoryEvent {
	return &historypb.HistoryEvent{EventId: id, EventType: enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED}
}

func TestChainWalksBackToTheFirstRunAndReturnsOldestFirst(t *testing.T) {
	first := []*historypb.HistoryEvent{started(1, ""), other(2)}
	second := []*historypb.HistoryEvent{started(1, "run-1"), other(2), other(3)}
	current := []*historypb.HistoryEvent{started(1, "run-2")}
	f := &fakeHistories{runs: map[string][]*historypb.HistoryEvent{"": current, "run-2": second, "run-1": first}}
	runs, err := Chain(context.Background(), f, "wf")
	require.NoError(t, err)
	require.Equal(t, [][]*historypb.HistoryEvent{first, second, current}, runs)
	require.Equal(t, []string{"", "run-2", "run-1"}, f.asks)
}

func TestChainStopsAtARunWithNoEvents(t *testing.T) {
	current := []*historypb.HistoryEvent{started(1, "gone")}
	f := &fakeHistories{runs: map[string][]*historypb.HistoryEvent{"": current}}
	runs, err := Chain(context.Background(), f, "wf")
	require.NoError(t, err)
	// The empty run is kept, as the oldest.
	require.Equal(t, [][]*historypb.HistoryEvent{nil, current}, runs)
}

func TestChainNamesTheWorkflowWhenAPageFails(t *testing.T) {
	f := &fakeHistories{
		runs: map[string][]*historypb.HistoryEvent{"": {started(1, "run-1")}, "run-1": {started(1, ""), other(2)}},
		fail: map[string]bool{"run-1": true},
	}
	_, err := Chain(context.Background(), f, "wf")
	require.ErrorContains(t, err, "history of wf: page lost")
}

func TestEventsReadsOneRunInOrder(t *testing.T) {
	run := []*historypb.HistoryEvent{started(1, ""), other(2), other(3)}
	f := &fakeHistories{runs: map[string][]*historypb.HistoryEvent{"run-1": run}}
	got, err := Events(context.Background(), f, "wf", "run-1")
	require.NoError(t, err)
	require.Equal(t, run, got)
}
