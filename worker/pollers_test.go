package main

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
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

// The client the worker dials carries balancedWorkflowPolls: over real
// gRPC on loopback, a server's sticky answer arrives without its backlog
// hint and a normal one with it. Without it the fixed workflow task
// pollers of workerOptions would all turn to a sticky queue with a
// backlog (the starvation TestStopPauseResumeUnderFrequentContinueAsNew
// was about), and no other test sees that on an unloaded machine.
func TestTheWorkersClientClearsTheStickyBacklogHint(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	workflowservice.RegisterWorkflowServiceServer(srv, hintingServer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	opts := client.Options{HostPort: lis.Addr().String()}
	withBalancedWorkflowPolls(&opts)
	c, err := client.Dial(opts)
	require.NoError(t, err)
	t.Cleanup(c.Close)

	poll := func(kind enumspb.TaskQueueKind) int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.WorkflowService().PollWorkflowTaskQueue(ctx, &workflowservice.PollWorkflowTaskQueueRequest{
			Namespace: "default", TaskQueue: &taskqueuepb.TaskQueue{Name: "q", Kind: kind}})
		require.NoError(t, err)
		return resp.GetBacklogCountHint()
	}
	require.Zero(t, poll(enumspb.TASK_QUEUE_KIND_STICKY), "a sticky poll's backlog hint reached the SDK")
	require.EqualValues(t, 7, poll(enumspb.TASK_QUEUE_KIND_NORMAL), "a normal poll's hint is the server's")
}

// hintingServer answers every workflow task poll at once with a backlog
// hint of 7, and the SDK's capabilities question with none.
type hintingServer struct {
	workflowservice.UnimplementedWorkflowServiceServer
}

func (hintingServer) GetSystemInfo(context.Context, *workflowservice.GetSystemInfoRequest) (*workflowservice.GetSystemInfoResponse, error) {
	return &workflowservice.GetSystemInfoResponse{}, nil
}

func (hintingServer) PollWorkflowTaskQueue(context.Context, *workflowservice.PollWorkflowTaskQueueRequest) (*workflowservice.PollWorkflowTaskQueueResponse, error) {
	return &workflowservice.PollWorkflowTaskQueueResponse{BacklogCountHint: 7}, nil
}

// The worker keeps a fixed number of workflow task polls, twice
// --pollers (half on each queue), not the SDK's autoscaling pollers,
// whose two 100 ms tickers wake an idle worker again and again.
func TestWorkerOptionsKeepFixedWorkflowTaskPollers(t *testing.T) {
	opts := workerOptions(8, 1000, 30*time.Second, 2*time.Second)
	require.Equal(t, worker.NewPollerBehaviorSimpleMaximum(worker.PollerBehaviorSimpleMaximumOptions{MaximumNumberOfPollers: 16}),
		opts.WorkflowTaskPollerBehavior)
	require.Equal(t, 8, opts.MaxConcurrentActivityTaskPollers)
	require.Equal(t, 1000, opts.MaxConcurrentActivityExecutionSize)
	require.Equal(t, 30*time.Second, opts.WorkerStopTimeout)
}
