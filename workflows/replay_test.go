package workflows

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// recording is a history in testdata: the workflow ID it ran under (the
// stream derives its tablets' IDs from its own) and the SHA-256 of the
// file as committed.
type recording struct {
	id, sha256 string
}

// recorded lists every history in testdata. Recordings are append-only:
// each stands for workflows already running when a worker is upgraded, so
// a new shape gets a new file (and a new row), never an edit of an old one.
var recorded = map[string]recording{
	// Before changeDurable (workflow.DefaultVersion).
	"stream-continued-as-new.json": {"can", "57550c55ae85bd72606437ff84ee893133ab4ff8fc39e15a46769f75ac45825b"},
	"stream-stopped.json":          {"stopme", "03e35074932f6a0ef343ba0c82baca2ce62cbbbfec8750101e4b4791b4b7c91a"},
	"tablet-stopped.json":          {"stopme/tablet/t-0001", "02c42ee7f87ca06a74084a3b3e8e243ce3172980b85f186eff90005aaa5e6833"},
	"tablet-retry-elsewhere.json":  {"mismatch/tablet/t-0001", "559ccd54c88f7a5fa5d3d0b89c3cf14825c4f07ee3b16c4752cb0fcf03ba4825"},
	"tablet-retry-same.json":       {"mismatch/tablet/t-0002", "325952606ddaac848642ab4538553bb24354cbee04700b13b046c30638c65815"},
}

// TestRecordedHistoriesAreAppendOnly fails when a committed history file
// changed or went missing: restore it, put the new command sequence
// behind workflow.GetVersion, and record a new history beside it.
func TestRecordedHistoriesAreAppendOnly(t *testing.T) {
	for name, rec := range recorded {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(t, err, "%s was recorded and must stay", name)
		sum := sha256.Sum256(b)
		require.Equal(t, rec.sha256, hex.EncodeToString(sum[:]),
			"%s changed: recorded histories are append-only (record a new one for a new shape)", name)
	}
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
			rec, ok := recorded[filepath.Base(f)]
			require.True(t, ok, "add %s to recorded with its workflow ID and hash", f)
			data, err := os.Open(f)
			require.NoError(t, err)
			defer data.Close()
			h, err := client.HistoryFromJSON(data, client.HistoryJSONOptions{})
			require.NoError(t, err)
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(StreamWorkflow)
			r.RegisterWorkflow(TabletWorkflow)
			require.NoError(t, r.ReplayWorkflowHistoryWithOptions(nil, h, worker.ReplayWorkflowHistoryOptions{
				OriginalExecution: workflow.Execution{ID: rec.id, RunID: "replay"},
			}))
		})
	}
}
