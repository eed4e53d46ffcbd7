package main

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/grpc"
)

// The server's backlog hint is cleared from sticky polls' answers only:
// with it the SDK's fixed pollers would all go to the sticky queue and
// leave new runs' first tasks on the normal queue unpolled.
func TestBalancedWorkflowPollsClearsOnlyTheStickyBacklogHint(t *testing.T) {
	answer := func(method string, kind enumspb.TaskQueueKind, err error) *workflowservice.PollWorkflowTaskQueueResponse {
		req := &workflowservice.PollWorkflowTaskQueueRequest{TaskQueue: &taskqueuepb.TaskQueue{Name: "q", Kind: kind}}
		reply := &workflowservice.PollWorkflowTaskQueueResponse{}
		invoker := func(_ context.Context, _ string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			reply.(*workflowservice.PollWorkflowTaskQueueResponse).BacklogCountHint = 7
			return err
		}
		got := balancedWorkflowPolls(context.Background(), method, req, reply, nil, invoker)
		require.ErrorIs(t, got, err)
		return reply
	}
	require.Zero(t, answer(workflowservice.WorkflowService_PollWorkflowTaskQueue_FullMethodName, enumspb.TASK_QUEUE_KIND_STICKY, nil).BacklogCountHint, "a sticky poll's hint")
	require.Zero(t, answer(workflowservice.WorkflowService_PollWorkflowTaskQueue_FullMethodName, enumspb.TASK_QUEUE_KIND_STICKY, errors.New("unavailable")).BacklogCountHint, "a failed sticky poll's")
	require.EqualValues(t, 7, answer(workflowservice.WorkflowService_PollWorkflowTaskQueue_FullMethodName, enumspb.TASK_QUEUE_KIND_NORMAL, nil).BacklogCountHint, "a normal poll's hint is the server's")
	require.EqualValues(t, 7, answer(workflowservice.WorkflowService_PollActivityTaskQueue_FullMethodName, enumspb.TASK_QUEUE_KIND_STICKY, nil).BacklogCountHint, "another method's answer is untouched")

	// Any other request or reply passes through as it came.
	called := false
	err := balancedWorkflowPolls(context.Background(), workflowservice.WorkflowService_PollWorkflowTaskQueue_FullMethodName, &workflowservice.PollActivityTaskQueueRequest{}, &workflowservice.PollActivityTaskQueueResponse{}, nil,
		func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			called = true
			return nil
		})
	require.NoError(t, err)
	require.True(t, called)
}
