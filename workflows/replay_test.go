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
	// With changeDurable (versionDurable), from the e2e durability tests.
	"stream-durable-continued-as-new.json": {"dur-a", "e4d3229798870d0e00ddf3a711720f727ebb32b85707048590fb5e0dabd05f79"},
	"tablet-durable-continued-as-new.json": {"dur-a/tablet/t-0001", "6ea6dbb35e9247f6b42468bcfff5c3a65280d6af5339f1f8d4f6fa1db0669b61"},
	"stream-durable-restarted-tablet.json": {"restart", "1af9908432058e029aad078548f38439fda189d31158f264ea1e5c1ac8d58a81"},
	"tablet-durable-restarted.json":        {"restart/tablet/t-0002", "c3e2853d5c58c6b373a91372cb57ce457a0a7748b6dfb0ac58a54df37478a261"},
	"stream-durable-topology-down.json":    {"topodown", "42c8ac0fe20827b9213dd7c407d98821cc66c92664a5fce68c4729cb919c8036"},
	"tablet-durable-topology-down.json":    {"topodown/tablet/t-0001", "7d092a9d55926b97e84af9319a0b752b5345d5edf44a5f49c12b8b0654b8e5e1"},
	// With changeDurable, changeQuietStart and changeSlimTopology.
	"stream-slim-stopped.json":          {"stopme", "95e2fde519a88ce7f0a64c26d086c80f9b5428b60085caf17a06b35c40744684"},
	"tablet-slim-stopped.json":          {"stopme/tablet/t-0001", "f251f1b9c51dc53421962c915b6f04b90f820adda6ecb7b7c44f89aa7d32e399"},
	"stream-slim-restarted-tablet.json": {"restart", "8e816d71eaa174f6aede60401bb134da4cd05cfce501826982671eff37c2f63f"},
	"tablet-slim-restarted.json":        {"restart/tablet/t-0002", "f492d47cfa0bdb2b208bfa0078dc48feb26df3bb8e9b45be1f054cba0c0c88af"},
	"stream-slim-topology-down.json":    {"topodown", "f54e40e615fbaea3ea5b6c283a21325cf170d1496dc8293533aee5c9a88cacef"},
	"tablet-slim-topology-down.json":    {"topodown/tablet/t-0001", "f963256584fb3a33d2752034b2875d0f7c9aa92a6ed23206469cf360034be135"},
	// With changePacedReports: reports go out from the tablet's pacer.
	"stream-paced-stopped.json": {"paced", "8b3ec0be8fb498e998def7ef9327815c6b2ee19c258a4281866a4356047a1fff"},
	"tablet-paced-stopped.json": {"paced/tablet/t-0001", "3797508722e526af32635f0f20feee156786b1db51a28a1cb53f800d3a81fcf6"},
	// With changeInPlaceReroute: a run moved off an excluded replica.
	"tablet-reroute-excluded.json": {"opx/tablet/t-0001", "2f6bb6fe43fddd4fbb7b1360a9b25b13f66b32acddc28abd581ebcf1dc153cba"},
	// With changeExclusionsMemo: the exclude list in the stream's memo.
	"stream-exclusions-memo.json": {"opx", "aec2fbc455e2c574b6e7b9b21b351b0ef461061dfc8c41a4bd4e101cd75aef5f"},
	// changeSignalHandling: signals decoded by the workflows, commands
	// that come while a tablet waits to continue as new applied.
	"stream-signal-handling-stopped.json": {"stopme", "44d41e0133afb1829c4d003e598b4bb0fd34ac90fe5f26267c6dc7c4dc5cc3ee"},
	"tablet-signal-handling-stopped.json": {"stopme/tablet/t-0001", "2f06b6f6478b9fe70d09a969b06072b5ae48a1c9de8be7638c3ff29135d28a50"},
	// changeMemoPerTask: one memo update per workflow task (one task
	// handles three reports with one).
	"stream-memo-per-task-stopped.json": {"stopme", "8ffd3f0895159f3dce0273dd7c11996ee4b8c80ae5963a92c61bfe6244b86097"},
	// changeFinalMemo: a stopped stream whose last reports came with
	// other signals updates its memo before it completes (from
	// e2e.TestStoppedStreamMemoCountsEveryTabletStopped).
	"stream-final-memo-stopped.json": {"memostop", "5a1d2f5fc0069c97a66a4ce0d7c9f36e303eafbd1a7795f6c127515123e09df0"},
	// changeEnsureBeside: the source-side stream made by the first
	// topology read, beside the selector (from
	// e2e.TestStreamStartedWhileTheSourceIsDownTakesAStopAndStartsOnceItIsUp):
	// a stream stopped while it could not be made, and one started once
	// the source came back.
	"stream-ensure-beside-stopped.json": {"srcdown-stop", "b9b7a838e1d6a7ba073af9bb2e4d5d51d93a72590d3fa9dd704c3074ae3a0315"},
	"stream-ensure-beside-started.json": {"srcdown", "19383c9f79907b7510eb9b28ccea913af7b85d582e0f53c2e02130dc5171854b"},
	// changeStuckState: a tablet whose workflow task kept failing shown
	// Stuck, then restarted once terminated (from
	// e2e.TestStuckTabletIsShownStuckAndRestartedOnceTerminated).
	"stream-stuck-state.json": {"stuck", "ed589f8131a6eb97ccc256e9010950cbf936dc22ce6b98ee60a2ceda6ef8be88"},
	// changeTabletBaseline: a tablet that asks one version for every
	// tablet change before it (from e2e.TestStopWithDropSourceStream).
	"tablet-baseline-stopped.json": {"stopme/tablet/t-0001", "ef627e63d28970465d0d152477686cfe6c86fe19ac1eb2930da7188cf9fd523a"},
	// changeFirstPicks: a new stream whose first topology read picked
	// its tablet's first replica, and that tablet, started on it without
	// a picker, a version or a report of its own (from
	// e2e.TestStopWithDropSourceStream).
	"stream-first-picks-stopped.json": {"stopme", "0f8fbf9453dc629c6bfe6c821d4205828906002f55c4514e6563112e01e7a2cd"},
	"tablet-first-pick-stopped.json":  {"stopme/tablet/t-0001", "f774289ecb131987454629182b60591e95451f8f54381db1c1529048302b36a1"},
	// A run that moved in place off a replica that lost the history (its
	// progress signal names the replica it left, which the tablet
	// excludes), then stopped (from
	// e2e.TestPositionMismatchMovesTheTabletToAnotherReplica).
	"tablet-mismatch-in-place.json": {"mismatch/tablet/t-0001", "22dc7eb0f8e70f66d1aa8d727621c8f3bec27cf630cf55580414b7a4455633ca"},
	// changeRetryingState: a single-replica tablet whose first runs ended
	// with POSITION_MISMATCH, Retrying until a run committed, then stopped
	// (from TestRecordScriptedHistories).
	"tablet-retrying-state-stopped.json": {"retrying/tablet/t-0001", "88914f0f6144cc2a0b0359ae0efd1067c0b9df651c0b98b3f7bc3b5f2afe7238"},
	// changeBoundedCommands: a pause and a resume naming the tablet twice,
	// a resume signal over the bound rejected, then a stop (from
	// TestRecordScriptedHistories).
	"stream-bounded-commands-stopped.json": {"bounded", "75d8b09677a334670480d3e59fe97a3771900f8f9c4abac37cc16389f61ae3f7"},
	// changeRetryAfterClose: a retry of a tablet whose workflow had
	// reported Failed but not closed, its new workflow started once the
	// old one closed, then a stop (from TestRecordScriptedHistories).
	"stream-retry-after-close-stopped.json": {"retryclose", "80417b7c7351b487a705de89d0152c1351991328688127d866bdb9ab0b493fbc"},
	// changeResync: a tablet whose history expired, resynced by the
	// operator (the Resync activity, then its new workflow from the
	// fresh start), then a stop (from TestRecordScriptedHistories).
	"stream-resync-stopped.json": {"resyncme", "dd0e79df4e40e1baef9909fa7d00a0c53ceda887d479ed4ed4549e1ad44bd943"},
	// changeResync of a tablet that runs: told to stop, its fresh start
	// made once its Stopped report came, its new workflow streaming,
	// then a stop (from TestRecordScriptedHistories).
	"stream-resync-running-stopped.json": {"resyncrun", "fecc21df9eb8b2582f44cb9ee2c9d555c8cc0201e3b4d46efd5f1139da96288e"},
	// changeOperatorIntents: a stream that heard of its tablet's start in
	// its loop, told a pause again after a report contradicting it, then
	// a resume and a stop (from TestRecordScriptedHistories).
	"stream-operator-intents-stopped.json": {"intents", "2375b5c72e895c49e2a7f67fcfbfde1c6e34d42d997d778d66d0eb698b6b30cc"},
	// changeChargedReplica: a run whose error named another replica than
	// it was started on, charged to that one, then a run that committed
	// and a stop (from TestRecordScriptedHistories).
	"tablet-charged-replica-stopped.json": {"charged/tablet/t-0001", "a3bacb2c177f168044b487a8c026098922b418944497f3538c023e9006939cf3"},
	// changeQuietRewording: a tablet with no eligible replica whose
	// looks reworded their reason, one search-attribute upsert for them,
	// then streaming and a stop (from TestRecordScriptedHistories).
	"tablet-quiet-rewording-stopped.json": {"reworded/tablet/t-0001", "2085247314f4f2ce313eb1edd2f419376c2e93c2c4757a937b7fcd380d3c3364"},
	// changeSnapshot: a snapshot of a table recorded at the source (the
	// Snapshot activity), the tablet told to reopen, its run ended and
	// the next one copying, its report of the copy done at once
	// (changeCopyReports) making the snapshot Done, then a stop; and
	// that tablet (from
	// TestRecordScriptedHistories).
	"stream-snapshot-stopped.json":        {"snapme", "277a6454a91c0fbfabf3c551408a61b1c5a496edf7f7f9e3958c3ce0cfa7793f"},
	"tablet-snapshot-reopen-stopped.json": {"snapme/tablet/t-0001", "9aef074d2c20b7f82cae9fd3e89f64960148012758e83a74125892d1fbf900ac"},
	// changeSourceTables: a table added by configure (published, then
	// backfilled by a snapshot), then removed.
	"stream-source-tables-stopped.json": {"tableme", "caed93f8df62e1aaa26fd8ad7afc481e4cf499f6f792f14a05a74bfe6a37fb4c"},
	// changeLiveStatus: the stream read its running tablet's live
	// figures (ReadLiveFigures) for its status and memo, then stopped
	// (from TestRecordScriptedHistories).
	"stream-live-status-stopped.json": {"liveme", "ce37ec185d78ea8fd9a1b17350101921abd67ccba8e858f21ffc50ccc5bbb58a"},
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
