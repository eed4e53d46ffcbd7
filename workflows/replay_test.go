package workflows

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// recorded maps each history in testdata to the workflow ID it ran under
// (the stream derives its tablets' IDs from its own).
var recorded = map[string]string{
	"stream-continued-as-new.json": "can",
	"stream-stopped.json":          "stopme",
	"tablet-stopped.json":          "stopme/tablet/t-0001",
	"tablet-retry-elsewhere.json":  "mismatch/tablet/t-0001",
	"tablet-retry-same.json":       "mismatch/tablet/t-0002",
}

// TestReplayRecordedHistories replays histories recorded from real runs
// (the e2e tests write them with TABLETFLOW_RECORD_HISTORIES=workflows/testdata):
// a change of workflow shape that is not behind workflow.GetVersion fails
// here with a non-determinism error instead of in a running stream.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob("testdata/*.json")
	require.NoError(t, err)
	require.Len(t, files, len(recorded), "every recorded history is listed in recorded")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			id, ok := recorded[filepath.Base(f)]
			require.True(t, ok, "add %s to recorded with its workflow ID", f)
			data, err := os.Open(f)
			require.NoError(t, err)
			defer data.Close()
			h, err := client.HistoryFromJSON(data, client.HistoryJSONOptions{})
			require.NoError(t, err)
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(StreamWorkflow)
			r.RegisterWorkflow(TabletWorkflow)
			require.NoError(t, r.ReplayWorkflowHistoryWithOptions(nil, h, worker.ReplayWorkflowHistoryOptions{
				OriginalExecution: workflow.Execution{ID: id, RunID: "replay"},
			}))
		})
	}
}
