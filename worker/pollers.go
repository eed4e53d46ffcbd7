package main

import (
	"context"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"google.golang.org/grpc"
)

// workerOptions are the worker's options: activities run at once, the
// stop timeout, pollers, and how often at most a heartbeat reaches the
// server (liveEvery; 0: the SDK's 80% of the heartbeat timeout).
func workerOptions(pollers, maxActivities int, stopTimeout, liveEvery time.Duration) worker.Options {
	return worker.Options{
		MaxConcurrentActivityExecutionSize: maxActivities,
		WorkerStopTimeout:                  stopTimeout,
		MaxHeartbeatThrottleInterval:       liveEvery,
		// More pollers than the default two: when an exclusion moves many
		// tablets at once, their workflow and activity tasks queue up. A
		// fixed number, half of them on each of the workflow task queue's
		// normal and sticky queues (with withBalancedWorkflowPolls; the
		// SDK's autoscaling behaviour would do that too, at the cost of
		// two tickers waking the worker ten times a second each).
		WorkflowTaskPollerBehavior: worker.NewPollerBehaviorSimpleMaximum(worker.PollerBehaviorSimpleMaximumOptions{
			MaximumNumberOfPollers: 2 * pollers}),
		MaxConcurrentActivityTaskPollers: pollers,
	}
}

// withBalancedWorkflowPolls installs balancedWorkflowPolls on the
// client's connection to the server: the fixed workflow task pollers of
// workerOptions need it.
func withBalancedWorkflowPolls(opts *client.Options) {
	opts.ConnectionOptions.DialOptions = append(opts.ConnectionOptions.DialOptions, grpc.WithChainUnaryInterceptor(balancedWorkflowPolls))
}

// balancedWorkflowPolls keeps a fixed set of workflow task pollers polling
// both of a worker's queues: the task queue's normal queue (a new run's
// first task: a tablet after continue-as-new, a new stream) and the
// worker's sticky queue (the next task of a run whose history it holds).
//
// The Go SDK's fixed poller behaviour sends every poll to the sticky queue
// while the server says that queue has a backlog (the backlog count hint
// in a sticky poll's answer), so on a server that cannot keep up a new run
// waited minutes for its first task. Its autoscaling behaviour keeps a poll
// on each queue, but runs two 100 ms tickers all the time, which wake an
// idle or live worker again and again (make bench's live case and idle
// window measure the worker's CPU; see docs/benchmarks.md). With the hint
// cleared from sticky answers, the fixed pollers
// take the queue with fewer polls waiting: half on each. The hint steers
// nothing else in the SDK; a sticky backlog is still drained, by half the
// pollers instead of all of them.
func balancedWorkflowPolls(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if method != workflowservice.WorkflowService_PollWorkflowTaskQueue_FullMethodName {
		return err
	}
	in, ok := req.(*workflowservice.PollWorkflowTaskQueueRequest)
	if !ok || in.GetTaskQueue().GetKind() != enumspb.TASK_QUEUE_KIND_STICKY {
		return err
	}
	if out, ok := reply.(*workflowservice.PollWorkflowTaskQueueResponse); ok && out != nil {
		out.BacklogCountHint = 0
	}
	return err
}
