package procs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/testbed"
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

// StartDevServer runs Bin/temporal's dev server in Dir with extra
// arguments beside bed (run at the same time: a test bed takes a while to
// start too), adds the server to the group as "temporal" and dials it.
// The server is returned whenever it started, with any error, so that the
// caller can stop it.
func (g *Group) StartDevServer(extra []string, bed func() error) (*testbed.DevServer, client.Client, error) {
	var wg sync.WaitGroup
	var bedErr, serverErr error
	var server *testbed.DevServer
	wg.Go(func() { bedErr = bed() })
	wg.Go(func() {
		server, serverErr = testbed.StartDevServer(filepath.Join(g.Bin, "temporal"), g.Dir, extra...)
	})
	wg.Wait()
	if server != nil {
		g.Add("temporal", server.Proc)
	}
	if err := errors.Join(bedErr, serverErr); err != nil {
		return server, nil, err
	}
	c, err := client.Dial(client.Options{HostPort: server.Addr, Logger: temporalclient.Quiet{}})
	return server, c, err
}

// StartWorker runs Bin/worker against the dev server at addr on taskQueue
// (log level warn, then args), with env added to this program's
// environment, its output to Dir/worker.log, adds it to the group as
// "worker", and waits up to a minute until it polls the task queue. The
// worker is returned whenever it started, with any error.
func (g *Group) StartWorker(ctx context.Context, c client.Client, addr, taskQueue string, env []string, args ...string) (*Proc, error) {
	cmd := exec.Command(filepath.Join(g.Bin, "worker"), append([]string{"--address", addr, "--task-queue", taskQueue, "--log-level", "warn"}, args...)...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	tp, err := testbed.StartCmd(filepath.Join(g.Dir, "worker.log"), cmd)
	if err != nil {
		return nil, err
	}
	w := g.Add("worker", tp)
	return w, WaitFor(ctx, w, "worker", time.Minute, Polling(ctx, c, taskQueue))
}
