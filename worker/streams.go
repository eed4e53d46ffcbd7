package main

import (
	"context"
	"fmt"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/metrics"
	"github.com/tabletflow/tabletflow/workflows"
)

// runningStreams is the visibility query of the namespace's running
// streams.
const runningStreams = `WorkflowType = 'StreamWorkflow' AND ExecutionStatus = 'Running'`

// streamStates lists the running streams of namespace ns with their
// tablets counted by state, from each stream's memo (dc decodes it: the
// worker's converter, which decrypts a memo the payload codec encrypted).
// A stream whose memo has no counts yet is listed with none.
func streamStates(c client.Client, ns string, dc converter.DataConverter) metrics.StreamStates {
	if dc == nil {
		dc = converter.GetDefaultDataConverter()
	}
	return func(ctx context.Context) (map[string]map[string]int, error) {
		out := map[string]map[string]int{}
		var token []byte
		for {
			resp, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: ns, Query: runningStreams, NextPageToken: token})
			if err != nil {
				return nil, fmt.Errorf("list the running streams: %w", err)
			}
			for _, ex := range resp.GetExecutions() {
				states := map[string]int{}
				if p, ok := ex.GetMemo().GetFields()[workflows.MemoTabletStates]; ok {
					if err := dc.FromPayload(p, &states); err != nil {
						return nil, fmt.Errorf("stream %s: memo %s: %w", ex.GetExecution().GetWorkflowId(), workflows.MemoTabletStates, err)
					}
				}
				out[ex.GetExecution().GetWorkflowId()] = states
			}
			if token = resp.GetNextPageToken(); len(token) == 0 {
				return out, nil
			}
		}
	}
}
