package main

import (
	"context"
	"fmt"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/metrics"
	"github.com/tabletflow/tabletflow/workflows"
)

// runningStreams is the visibility query of the namespace's running
// streams.
const runningStreams = `WorkflowType = 'StreamWorkflow' AND ExecutionStatus = 'Running'`

// streamStates counts, for each running stream of namespace ns, its
// tablets that are not streaming: every state in its memo's count
// (workflows.MemoTabletStates) but Streaming and Split (a split tablet's
// children stream in its place). dc decodes the memo: the worker's
// converter, which decrypts a memo the payload codec encrypted. A stream
// whose memo has no counts yet counts 0; one whose memo cannot be read is
// left out (and logged). A failed list is logged.
func streamStates(c client.Client, ns string, dc converter.DataConverter, log *zap.Logger) metrics.StreamStates {
	if dc == nil {
		dc = converter.GetDefaultDataConverter()
	}
	return func(ctx context.Context) (map[string]int, error) {
		out := map[string]int{}
		var token []byte
		for {
			resp, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: ns, Query: runningStreams, NextPageToken: token})
			if err != nil {
				log.Warn("metrics: the running streams could not be listed", zap.Error(err))
				return nil, fmt.Errorf("list the running streams: %w", err)
			}
			for _, ex := range resp.GetExecutions() {
				id := ex.GetExecution().GetWorkflowId()
				states := map[string]int{}
				if p, ok := ex.GetMemo().GetFields()[workflows.MemoTabletStates]; ok {
					if err := dc.FromPayload(p, &states); err != nil {
						log.Warn("metrics: a stream's memo could not be read", zap.String("stream", id), zap.Error(err))
						continue
					}
				}
				out[id] = notStreaming(states)
			}
			if token = resp.GetNextPageToken(); len(token) == 0 {
				return out, nil
			}
		}
	}
}

// notStreaming counts the tablets of a stream's memo count by state that
// are not streaming: every state but Streaming and Split.
func notStreaming(states map[string]int) int {
	n := 0
	for state, count := range states {
		if st := workflows.State(state); st != workflows.Streaming && st != workflows.Split {
			n += count
		}
	}
	return n
}
