package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/workflows"
)

// TestStuckTabletIsShownStuckAndRestartedOnceTerminated: a tablet
// workflow whose workflow task keeps failing (here a TabletWorkflow that
// panics, run by a worker of the test's on a task queue of its own, put in
// the tablet's place) still runs, so the stream cannot restart it; its row
// says Stuck with the reason, the other tablets stream on, and once the
// operator terminates it the stream restarts it from its checkpoint and
// the data stays exact.
func TestStuckTabletIsShownStuckAndRestartedOnceTerminated(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "200")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	const stream = "stuck"
	e.startStream(stream, e.config(out, map[string]any{"topologyRefresh": "2s"}))
	e.waitStatus(stream, "every tablet streaming", time.Minute, allStreaming(4))

	// The bad worker: a workflow type of the tablet's name whose code
	// panics, which the SDK's default policy answers by failing the
	// workflow task again and again (BlockWorkflow), as a bug in workflow
	// code would.
	const badQueue = "stuck-tablets"
	bad := worker.New(e.temporal, badQueue, worker.Options{})
	bad.RegisterWorkflowWithOptions(func(workflow.Context, json.RawMessage, json.RawMessage) error {
		panic("a bug in workflow code (the test's)")
	}, workflow.RegisterOptions{Name: "TabletWorkflow"})
	require.NoError(t, bad.Start())
	defer bad.Stop()
	wid := workflows.TabletWorkflowID(stream, "t-0002")
	_, err := e.temporal.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{
		ID: wid, TaskQueue: badQueue, WorkflowIDConflictPolicy: enums.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING,
	}, "TabletWorkflow", json.RawMessage(`{}`), json.RawMessage(`null`))
	require.NoError(t, err)

	st := e.waitStatus(stream, "t-0002 Stuck", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0002")
		return b.State == workflows.Stuck, summary(st) + fmt.Sprintf(" t-0002 %s %q", b.State, b.Reason)
	})
	require.Contains(t, tabletStatus(st, "t-0002").Reason, "workflow task keeps failing")
	require.Zero(t, tabletStatus(st, "t-0002").Restarts, "a running workflow is not restarted")
	for _, tab := range st.Tablets {
		if tab.ID != "t-0002" {
			require.Equal(t, workflows.Streaming, tab.State, tab.ID)
		}
	}
	e.eventually("the memo counts it Stuck", 30*time.Second, func() (bool, string) {
		fields := e.describe(stream, "").WorkflowExecutionInfo.GetMemo().GetFields()
		b := fields["tabletStates"].GetData()
		return strings.Contains(string(b), `"Stuck":1`), string(b)
	})

	// What the reason tells the operator to do: terminate it.
	bad.Stop()
	require.NoError(t, e.temporal.TerminateWorkflow(context.Background(), wid, "", "a stuck tablet terminated in a test"))
	e.waitStatus(stream, "t-0002 restarted and streaming", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0002")
		return b.Restarts == 1 && b.State == workflows.Streaming, summary(st) + fmt.Sprintf(" t-0002 %s restarts=%d", b.State, b.Restarts)
	})
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact(stream, out, 2*time.Minute)
	e.signal(stream, "stop", `{}`)
	require.NoError(t, e.temporal.GetWorkflow(context.Background(), stream, "").Get(context.Background(), nil), "the stream completes")
	e.recordHistory(stream, "", "stream-stuck-state")
}
