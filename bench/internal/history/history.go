// Package history reads workflow histories from a Temporal server for the
// benchmarks: the events of one run, or of every run of a continue-as-new
// chain. What the events mean is each benchmark's own business.
package history

import (
	"context"
	"fmt"
	"slices"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
)

// Events returns the events of one run of workflow id, in order; runID ""
// is the current run.
func Events(ctx context.Context, c client.Client, id, runID string) ([]*historypb.HistoryEvent, error) {
	it := c.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var events []*historypb.HistoryEvent
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return nil, err
		}
		events = append(events, ev)
	}
	return events, nil
}

// Chain returns every run of workflow id's continue-as-new chain, oldest
// first, each run's events in order. It walks back from the current run by
// each run's first event (the run it continues); a run with no events ends
// the walk, and is in the result.
func Chain(ctx context.Context, c client.Client, id string) ([][]*historypb.HistoryEvent, error) {
	var runs [][]*historypb.HistoryEvent
	for runID := ""; ; {
		events, err := Events(ctx, c, id, runID)
		if err != nil {
			return nil, fmt.Errorf("history of %s: %w", id, err)
		}
		runs = append(runs, events)
		if len(events) == 0 {
			break
		}
		if runID = events[0].GetWorkflowExecutionStartedEventAttributes().GetContinuedExecutionRunId(); runID == "" {
			break
		}
	}
	slices.Reverse(runs)
	return runs, nil
}
