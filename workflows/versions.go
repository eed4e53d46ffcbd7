package workflows

import "go.temporal.io/sdk/workflow"

// Workflow versions. Every change to the sequence of commands a workflow
// issues goes behind workflow.GetVersion with a change ID listed here, so
// that workflows already running when a worker is upgraded replay the
// shape they were recorded with (testdata holds a recorded history of
// each shape; recordings are append-only).
const (
	// changeDurable: the stop is checked before continue-as-new and the
	// operator's intents ride in the state; report failures other than
	// "stream gone" are sent again; the stream reads its topology beside
	// its selector with a bound, reconciles closed tablets, starts split
	// children only after the parent's split, and fans commands out in
	// waves.
	changeDurable = "durable-workflows"
	// versionDurable is changeDurable's version.
	versionDurable workflow.Version = 1

	// changeQuietStart: a tablet run does not report at its start (the
	// stream made the row of a new or restarted tablet itself, and a run
	// continued-as-new changed nothing): one signal less per tablet and
	// per run, which matters when thousands start at once.
	changeQuietStart = "quiet-start"

	// changeSlimTopology: the stream reads its topology with ReadTopology
	// (tablet IDs, parents and aliases) instead of ListTablets (every
	// replica's health), which passes the 2 MB payload limit at a few
	// thousand tablets.
	changeSlimTopology = "slim-topology"

	// changePacedReports: a tablet's reports go out from a pacer of its
	// own, at most one per tablets/reportRate and, in a stream of more
	// tablets than reportRate, in a slot of the tablet's own within that
	// window: the stream receives at most about reportRate reports a
	// second however many tablets change state at once.
	changePacedReports = "paced-reports"

	// changeInPlaceReroute: a tablet's GetChanges leaves a replica the
	// operator excludes by itself, picking another in place
	// (GetChangesInput.Reroute), and the tablet takes the replica it
	// moved to from its progress signal and its result: no workflow task
	// and no new activity task per tablet, which queue up on the server
	// when hundreds of tablets move at once (make bench's reaction case,
	// bench/reaction, measures an exclusion's reroute at 64 and 256
	// tablets; see docs/benchmarks.md).
	changeInPlaceReroute = "in-place-reroute"

	// changeExclusionsMemo: the stream keeps its operator exclude list in
	// its memo (activities.MemoExclusions) from its first workflow task
	// and whenever the list changes, so that workers' exclusion watchers
	// read it with a describe, which a stream busy with hundreds of
	// tablets' reports answers at once where a query waits.
	changeExclusionsMemo = "exclusions-memo"

	// changeSignalHandling: the workflows receive signals raw and decode
	// them themselves, so an undecodable one is rejected (shown in the
	// stream's status) instead of dropped by the SDK while it blocks for
	// the next signal of that name; a tablet about to continue as new
	// applies a command that came while it waited for its reports instead
	// of leaving it behind; an error in a reason keeps its context
	// (rootMessage, not innermostMessage); and a stream's first run
	// decodes its config with config.DecodeForStart, which refuses a size
	// given as 0. Each changes which commands follow such input.
	changeSignalHandling = "signal-handling"

	// changeMemoPerTask: the stream updates its details and memo once the
	// reports and commands already waiting are handled, instead of after
	// each one: a memo update is a command (an event, a visibility write),
	// and tablets that start or move together reported into one workflow
	// task with one memo update each.
	changeMemoPerTask = "memo-per-task"

	// changeFinalMemo: a stream run that ends (stopped, or continuing as
	// new) with its memo behind its state updates the memo first. With
	// changeMemoPerTask the last update could wait for a report or
	// command that the run then handled on its way out, and a stopped
	// stream's memo showed its tablets as they were before the stop.
	changeFinalMemo = "final-memo"

	// changeEnsureBeside: a stream's first run creates its source-side
	// stream beside its selector, as the first step of its first topology
	// read (bounded by ensureBound, then tried again), instead of before
	// its loop: a source unreachable when the stream starts no longer
	// holds back stop, exclude or continue-as-new, and the status says
	// since when the source-side stream cannot be created.
	changeEnsureBeside = "ensure-beside"

	// changeStuckState: a tablet whose workflow task keeps failing is
	// Stuck in the stream's status and memo, not left in the state it
	// last reported (Streaming, most often): a filter on the state finds
	// it. Asked for only when such a tablet is found.
	changeStuckState = "stuck-state"

	// changeTabletBaseline: a tablet workflow that gets this version has
	// every tablet change before it (changeDurable at versionDurable,
	// changeQuietStart, changePacedReports, changeInPlaceReroute,
	// changeSignalHandling) without asking for each. The SDK records a
	// marker and upserts the TemporalChangeVersion search attribute (a
	// visibility write on the server) for every version a new workflow
	// asks for: one instead of five per tablet start (make bench's scale
	// case, bench/scale, measures the dev server's CPU while tablets start;
	// see docs/benchmarks.md). Tablet changes after it are asked for as
	// before.
	changeTabletBaseline = "tablet-baseline"

	// changeFirstPicks: a new stream's first topology read also runs the
	// tablet picker for its tablets (ReadTopologyAndPick); the stream
	// starts each tablet it picked for with that replica
	// (TabletInput.First), its search attributes Streaming on it and its
	// row Streaming once its workflow has started. Such a tablet runs no
	// picker and sends no report at its start: one workflow task, no
	// signal, and no task of the stream's for its report (make bench's
	// scale case, bench/scale, measures the dev server's CPU while tablets
	// start; see docs/benchmarks.md). Asked for only by a stream's first
	// topology read. A tablet needs no version
	// of its own for it: only a stream with this version passes First,
	// and a tablet given none runs as before. A tablet given First asks
	// for no version at all: it was started after every tablet change up
	// to changeTabletBaseline, whose shape it runs (a tablet change after
	// this one is asked for as usual).
	changeFirstPicks = "first-picks"

	// changeRetryingState: a tablet run that fails and is tried again
	// (fenced, retry elsewhere, the replica unhealthy, retries
	// exhausted, any other error) makes the tablet Retrying at once, with
	// a reason saying what it does about it and the error as lastError;
	// the next run's start keeps it Retrying, its attempt counting on
	// across runs (TabletState.Failing), until the run commits: its
	// first commit's progress signal (GetChangesInput.Recovering) or its
	// result. Before, every run's start said Streaming and a failure on
	// the last eligible replica changed no state, so a tablet that could
	// not make progress showed Streaming until its retention ran out.
	// Asked for at a tablet run's first failed GetChanges only.
	changeRetryingState = "retrying-state"

	// changeBoundedCommands: what one operator command costs the stream
	// is bounded by its own size. A tablet named twice in a pause,
	// resume or retry is told (or restarted) once, where each name was
	// carried out (a pause signal naming one tablet 30,000 times grew the
	// stream's history by 48,000 events); a signal over maxUpdateBytes is
	// rejected as an update over it is refused. Asked for only by such a
	// command. (An include now tells each tablet only the aliases that
	// concern it, and exclude and include drop repeated aliases; those
	// change no command, only a signal's payload.)
	changeBoundedCommands = "bounded-commands"

	// changeRetryAfterClose: a retry of a Failed tablet whose workflow
	// has not closed yet (its terminal report came first) no longer
	// adopts that closing workflow, which left the row Starting with no
	// workflow behind it for good; the stream checks every retryCheck
	// until it has closed (StreamState.Retried) and then starts the
	// tablet's new workflow. Asked for only when a retry finds the
	// tablet's previous workflow still running.
	changeRetryAfterClose = "retry-after-close"

	// changeOperatorIntents: the stream keeps what the operator asked of
	// each tablet (stop, pause, resume) in its state and sees it carried
	// out. It asks for its tablet workflows' starts without waiting for
	// them, taking commands and reports meanwhile, and tells a tablet
	// what it was asked since its input was made once its workflow runs
	// (a signal to one not started yet failed, and the command was lost;
	// a stop signal waited for the whole fan-out); it tells a tablet
	// again when a report contradicts its intent; it sends no command to
	// a tablet whose start it has not heard of; and a stopping stream
	// starts no tablet workflow (a tablet that closed without a terminal
	// report is Stopped where it was). Asked for at the first tablet start, the
	// first contradicting report or the first closed tablet found while
	// stopping, whichever comes first.
	changeOperatorIntents = "operator-intents"

	// changeChargedReplica: a failed run is charged to the replica its
	// error's details name (activities.ErrorDetails.Replica; a retry-same
	// error's too, activities.ErrRetrySame), not to the one the tablet
	// believed the run read: a run that moved in place and whose
	// progress signal was lost failed on the replica it moved to, and the
	// tablet excluded the healthy one it had picked and went back to the
	// failing one. The charged replica, known by its alias only, is not
	// read again without a selection. Asked for only when the details
	// name another replica than the tablet's.
	changeChargedReplica = "charged-replica"

	// changeQuietRewording: a tablet upserts its search attributes (a
	// visibility write on the server each) when its state or its replica
	// changes, not when only its reason's wording does: a tablet waiting
	// for an eligible replica said why at every look, in other words as
	// the replicas' lag moved, and upserted each time. It still reports
	// the new reason to the stream. Asked for at a tablet's first such
	// rewording only.
	changeQuietRewording = "quiet-rewording"

	// changeResync: the resync command (stream_resync.go) runs the Resync
	// activity and starts the tablet's new workflow from its fresh
	// start. Asked for at the first resync a stream applies.
	changeResync = "resync"

	// changeSnapshot: the snapshot and snapshot-cancel commands
	// (stream_snapshot.go) run the Snapshot activity and tell tablets to
	// reopen. Asked for at the first such command a stream applies.
	changeSnapshot = "snapshot"

	// changeCopyReports: a tablet run that finished a copy of rows (an
	// ad-hoc snapshot's) reports at once rather than at the tablet's
	// next periodic report. Asked for at the first copy a tablet
	// finishes.
	changeCopyReports = "copy-reports"

	// changeSourceTables: configure's source.tables (stream_tables.go)
	// runs the SetTables activity and then a snapshot of the tables
	// added. Asked for at the first change of tables a stream applies.
	changeSourceTables = "source-tables"

	// changeLiveStatus: the stream reads its running tablets' live
	// figures (the ReadLiveFigures activity) every statusRefresh, beside
	// its loop, for its status query and its memo (MemoLive). Asked for
	// as the loop begins.
	changeLiveStatus = "live-status"
)
