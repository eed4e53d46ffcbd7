package procs

import (
	"context"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
)

// Polling returns a readiness check for WaitFor: nil once taskQueue has
// a workflow poller and an activity poller, that is once a worker started
// on it takes tasks, so that its start-up is not timed with what follows.
func Polling(ctx context.Context, c client.Client, taskQueue string) func() error {
	return func() error {
		for _, typ := range []enumspb.TaskQueueType{enumspb.TASK_QUEUE_TYPE_WORKFLOW, enumspb.TASK_QUEUE_TYPE_ACTIVITY} {
			d, err := c.DescribeTaskQueue(ctx, taskQueue, typ)
			if err != nil {
				return err
			}
			if len(d.GetPollers()) == 0 {
				return fmt.Errorf("no %s poller yet", typ)
			}
		}
		return nil
	}
}
