package workflows

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// An ad-hoc snapshot copies named tables of a running stream again, on
// every tablet (or the ones named), while the tablets stream
// (source.Snapshotter): the operator's snapshot command. The stream
// records the job at the source (the Snapshot activity, beside its loop;
// tablets whose job is not recorded yet are carried across
// continue-as-new in Snapshot.Todo, and the source answers the job's id
// idempotently), then tells each running tablet to reopen its reader (a
// run ends at its next batch boundary, after its commit, and the next one
// starts at once): the reader copies the tables in chunks by primary key,
// woven into the tablet's changes by watermarks, as Read records. A
// tablet not running (paused, retrying) copies when it next reads. Each
// tablet's report carries its copy's progress (TabletStatus.Copy); the
// snapshot is Done once every tablet's copy is. snapshot-cancel ends it:
// the source is told, and the tablets reopen without it.
//
// One snapshot runs at a time; a new one may be asked once the last one
// is Done or Cancelled.

// Operator commands of ad-hoc snapshots.
const (
	CmdSnapshot       = "snapshot"
	CmdSnapshotCancel = "snapshot-cancel"
	// CmdReopen is a stream-to-tablet command only: end the run at its
	// next batch boundary, so that the next one opens the source again
	// (and takes the snapshot just recorded).
	CmdReopen = "reopen"
)

// SnapshotRequest is the snapshot command's payload.
type SnapshotRequest struct {
	// Tables to copy, each one the stream reads (source.tables).
	Tables []string `json:"tables"`
	// Tablets to copy them on (default: every tablet whose workflow runs).
	Tablets []string `json:"tablets,omitempty"`
	Reason  string   `json:"reason,omitempty"`
}

// SnapshotCancelRequest is the snapshot-cancel command's payload.
type SnapshotCancelRequest struct {
	Reason string `json:"reason,omitempty"`
}

// Snapshot states.
const (
	SnapshotRunning   = "Running"
	SnapshotDone      = "Done"
	SnapshotCancelled = "Cancelled"
)

// Snapshot is the stream's last ad-hoc snapshot.
type Snapshot struct {
	ID string `json:"id"`
	// Key is the job's id at the source: ID and the stream's first run,
	// so that a stream started again under its id (whose source-side
	// record may keep an earlier stream's jobs) never meets a job of its
	// own id there.
	Key     string    `json:"key"`
	Tables  []string  `json:"tables"`
	Tablets []string  `json:"tablets"` // sorted
	Reason  string    `json:"reason,omitempty"`
	State   string    `json:"state"`
	Asked   time.Time `json:"asked"`
	Ended   time.Time `json:"ended,omitzero"`
	// Todo are the tablets the source has not been told yet: of the job
	// while Running, of its cancel once Cancelled.
	Todo []string `json:"todo,omitempty"`
	// Done are the tablets whose copy is complete (sorted); Failed, the
	// tablets the source refused the job for, or that ended first, with
	// why.
	Done   []string          `json:"done,omitempty"`
	Failed map[string]string `json:"failed,omitempty"`
}

// snapshotted is what a Snapshot activity came back with.
type snapshotted struct {
	ID     string                    `json:"id"`
	Cancel bool                      `json:"cancel"`
	Res    activities.SnapshotResult `json:"res"`
	Err    string                    `json:"err,omitempty"`
	// Fatal: Err is one that telling the source again cannot mend (the
	// source's config, a kind that cannot snapshot).
	Fatal bool `json:"fatal,omitempty"`
}

func (s *stream) snapshot(ctx workflow.Context, raw json.RawMessage, apply bool) error {
	var req SnapshotRequest
	if err := decodeCommand(raw, &req); err != nil {
		return err
	}
	if err := s.snapshotAllowed(); err != nil {
		return err
	}
	if tc := s.st.TablesChange; tc != nil && tc.State == TablesPublishing {
		return fmt.Errorf("the tables the stream reads are changing (%s); ask again once the change is done", tc.ID)
	}
	if len(req.Tables) == 0 {
		return fmt.Errorf("tables: name the tables to copy (from source.tables %v)", s.cfg.Source.Tables)
	}
	for i, t := range req.Tables {
		if !slices.Contains(s.cfg.Source.Tables, t) {
			return fmt.Errorf("tables[%d]: %q is not a table the stream reads (source.tables %v)", i, t, s.cfg.Source.Tables)
		}
		if slices.Index(req.Tables, t) != i {
			return fmt.Errorf("tables[%d]: %q is named twice", i, t)
		}
	}
	if len(req.Reason) > maxReasonBytes {
		return fmt.Errorf("reason: %d bytes, at most %d", len(req.Reason), maxReasonBytes)
	}
	if err := validateTablets(req.Tablets, s.st.Tablets); err != nil {
		return err
	}
	for i, id := range req.Tablets {
		switch st := s.st.Tablets[id].State; {
		case st == Split:
			return fmt.Errorf("tablets[%d]: %s has split; its children hold its rows", i, id)
		case terminal(st):
			return fmt.Errorf("tablets[%d]: %s is %s; a snapshot copies on a tablet that runs (a resync copies every table)", i, id, st)
		}
	}
	switch sn := s.st.Snapshot; {
	case sn != nil && sn.State == SnapshotRunning:
		return fmt.Errorf("snapshot %s of %v is running; wait for it or cancel it (snapshot-cancel)", sn.ID, sn.Tables)
	case sn != nil && len(sn.Todo) > 0:
		return fmt.Errorf("snapshot %s is being cancelled at the source; ask again once it is", sn.ID)
	}
	tablets := slices.Sorted(slices.Values(unique(req.Tablets)))
	if len(tablets) == 0 {
		tablets = s.live()
		if len(tablets) == 0 {
			return fmt.Errorf("no tablet of the stream runs: a snapshot copies on running tablets (a resync copies every table)")
		}
	}
	if !apply {
		return nil
	}
	if err := s.snapshotsVersioned(ctx); err != nil {
		return err
	}
	s.beginSnapshot(ctx, req.Tables, tablets, req.Reason)
	return nil
}

// beginSnapshot starts a snapshot of tables on tablets (sorted): the
// operator's, or the backfill of tables added to the stream.
func (s *stream) beginSnapshot(ctx workflow.Context, tables, tablets []string, reason string) *Snapshot {
	s.st.SnapshotSeq++
	id := fmt.Sprintf("snapshot-%d", s.st.SnapshotSeq)
	key := id
	if run := workflow.GetInfo(ctx).FirstRunID; run != "" {
		key += "@" + run
	}
	s.st.Snapshot = &Snapshot{
		ID: id, Key: key, Tables: slices.Clone(tables), Tablets: tablets,
		Reason: reason, State: SnapshotRunning, Asked: workflow.Now(ctx), Todo: slices.Clone(tablets),
	}
	s.driveSnapshot(false)
	return s.st.Snapshot
}

// snapshotsVersioned asks for changeSnapshot. A run replayed from before
// it (a snapshot signal an older worker left unread) refuses the command
// rather than issue commands its history does not have.
func (s *stream) snapshotsVersioned(ctx workflow.Context) error {
	if workflow.GetVersion(ctx, changeSnapshot, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return fmt.Errorf("this stream's run predates snapshots: ask again")
	}
	return nil
}

func (s *stream) snapshotCancel(ctx workflow.Context, raw json.RawMessage, apply bool) error {
	var req SnapshotCancelRequest
	if err := decodeCommand(raw, &req); err != nil {
		return err
	}
	if err := s.snapshotAllowed(); err != nil {
		return err
	}
	sn := s.st.Snapshot
	if sn == nil || sn.State != SnapshotRunning {
		return fmt.Errorf("no snapshot is running")
	}
	if !apply {
		return nil
	}
	if err := s.snapshotsVersioned(ctx); err != nil {
		return err
	}
	sn.State, sn.Ended = SnapshotCancelled, workflow.Now(ctx)
	if req.Reason != "" {
		sn.Reason = truncate(req.Reason, maxReasonBytes)
	}
	// Every tablet whose copy may still run is told: also one whose job
	// a Snapshot activity under way is recording now, and one listed
	// failed (an earlier attempt may have recorded its job); the source
	// takes the cancel of a tablet without the job as done.
	sn.Todo = slices.DeleteFunc(slices.Clone(sn.Tablets), sn.copied)
	s.driveSnapshot(false)
	return nil
}

// snapshotAllowed refuses a snapshot command the stream cannot carry out.
func (s *stream) snapshotAllowed() error {
	switch {
	case !config.SourceKinds()[s.cfg.Source.Kind].AdhocSnapshot:
		return fmt.Errorf("source kind %q cannot snapshot tables of a running stream", s.cfg.Source.Kind)
	case s.st.Stop != nil:
		return fmt.Errorf("the stream is stopping")
	case !s.durable():
		return fmt.Errorf("this stream's run predates snapshots: it takes one after its next continue-as-new")
	}
	return nil
}

// snapshotRetry is the wait before the Snapshot activity tells the
// source again of tablets it could not reach.
const snapshotRetry = 30 * time.Second

// driveSnapshot runs the Snapshot activity for the tablets the source
// has not been told of yet, one activity at a time, beside the loop;
// later, after snapshotRetry, for tablets the last one could not reach.
func (s *stream) driveSnapshot(later bool) {
	sn := s.st.Snapshot
	if s.snapshots == nil || s.snapshotBusy || sn == nil || len(sn.Todo) == 0 {
		return // the loop's start drives it (or nothing to tell)
	}
	s.snapshotBusy = true
	in := activities.SnapshotInput{Stream: s.id, Source: s.cfg.Source, Tablets: slices.Clone(sn.Todo),
		Job: sn.job(), Cancel: sn.State == SnapshotCancelled}
	what := "record snapshot " + sn.ID + " at the source"
	if in.Cancel {
		what = "cancel snapshot " + sn.ID + " at the source"
	}
	var a *activities.Activities
	r := snapshotted{ID: sn.ID, Cancel: in.Cancel}
	s.besideLoop(s.loopCtx, retryWait(later), workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Minute, HeartbeatTimeout: time.Minute, Summary: what,
		RetryPolicy: &temporal.RetryPolicy{MaximumInterval: 30 * time.Second, MaximumAttempts: 20, NonRetryableErrorTypes: activities.NonRetryable},
	}, a.Snapshot, in, &r.Res, func(ctx workflow.Context, err error) {
		if err != nil {
			r.Err, r.Fatal = rootMessage(err), verdict(err) != nil
		}
		s.snapshots.Send(ctx, r)
	})
}

// retryWait is the wait before an activity beside the loop tells the
// source again: snapshotRetry when later, else none.
func retryWait(later bool) time.Duration {
	if later {
		return snapshotRetry
	}
	return 0
}

// verdict is an activity's error when it is one its retry policy does not
// retry (a verdict, not a passing failure), else nil.
func verdict(err error) *temporal.ApplicationError {
	var app *temporal.ApplicationError
	if errors.As(err, &app) && app.NonRetryable() {
		return app
	}
	return nil
}

// besideLoop runs an activity of the stream beside its loop, in a
// goroutine of its own: after wait (none when 0), under ctx (the loop's,
// or one cancelled when the activity is no longer wanted), its result
// into out; then done, in that goroutine, takes the activity's error and
// sends the outcome to the loop's channel. A run that ends during the
// wait sends nothing.
func (s *stream) besideLoop(ctx workflow.Context, wait time.Duration, opts workflow.ActivityOptions, activity, in, out any, done func(ctx workflow.Context, err error)) {
	workflow.Go(s.loopCtx, func(gctx workflow.Context) {
		if wait > 0 {
			if err := workflow.Sleep(gctx, wait); err != nil {
				return
			}
		}
		done(gctx, workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, opts), activity, in).Get(gctx, out))
	})
}

// onSnapshotted takes a Snapshot activity's answer: the tablets that took
// the job (or its cancel) reopen their readers; the ones refused are
// Failed; the ones not reached (the source down, or the activity failed)
// are told again after snapshotRetry.
func (s *stream) onSnapshotted(ctx workflow.Context, r snapshotted) {
	s.snapshotBusy = false
	sn := s.st.Snapshot
	if sn == nil || sn.ID != r.ID || r.Cancel != (sn.State == SnapshotCancelled) {
		s.driveSnapshot(false) // a newer job, or the cancel came meanwhile
		return
	}
	if r.Err != "" {
		s.log.Warn("snapshot: the source was not told", "snapshot", sn.ID, "cancel", r.Cancel, "error", r.Err, "fatal", r.Fatal)
	}
	if r.Fatal {
		r.Res.Failed = map[string]string{}
		for _, id := range sn.Todo {
			r.Res.Failed[id] = r.Err
		}
	}
	for _, id := range slices.Sorted(maps.Keys(r.Res.Later)) {
		s.log.Warn("snapshot: the source could not be told of a tablet; telling it again later", "snapshot", sn.ID, "tablet", id, "error", r.Res.Later[id])
	}
	told := r.Res.Done
	sn.Todo = slices.DeleteFunc(sn.Todo, func(id string) bool { return slices.Contains(told, id) || r.Res.Failed[id] != "" })
	if sn.State == SnapshotRunning {
		for _, id := range slices.Sorted(maps.Keys(r.Res.Failed)) {
			if sn.Failed == nil {
				sn.Failed = map[string]string{}
			}
			sn.Failed[id] = clip(r.Res.Failed[id])
		}
		s.snapshotEnded(ctx)
	}
	s.tell(ctx, slices.DeleteFunc(slices.Clone(told), func(id string) bool {
		row := s.st.Tablets[id]
		return row == nil || terminal(row.State)
	}), TabletCommand{Kind: CmdReopen})
	s.driveSnapshot(true)
}

// job is the snapshot's job as the source records it.
func (sn *Snapshot) job() source.SnapshotJob {
	key := sn.Key
	if key == "" {
		key = sn.ID
	}
	return source.SnapshotJob{ID: key, Tables: sn.Tables}
}

// snapshotReported notes a tablet's report: its copy of the running
// snapshot may be done, or the tablet may have ended without it (a split,
// an expiry, a failure, a stop: it is Failed in the snapshot, saying so).
func (s *stream) snapshotReported(ctx workflow.Context, r TabletStatus) {
	sn := s.st.Snapshot
	if sn == nil || sn.State != SnapshotRunning || !sn.takes(r.ID) || sn.ended(r.ID) {
		return
	}
	switch {
	case r.Copy != nil && r.Copy.Kind == source.CopySnapshot && r.Copy.ID == sn.job().ID && r.Copy.Done:
		i, _ := slices.BinarySearch(sn.Done, r.ID)
		sn.Done = slices.Insert(sn.Done, i, r.ID)
	case terminal(r.State):
		if sn.Failed == nil {
			sn.Failed = map[string]string{}
		}
		sn.Failed[r.ID] = clip(fmt.Sprintf("the tablet ended %s before its copy was complete: %s", r.State, r.Reason))
	default:
		return
	}
	s.snapshotEnded(ctx)
}

// snapshotSweep lists failed the running snapshot's tablets that ended
// without a report saying so (the stream made their rows terminal
// itself: a stop before their workflow started, a restart that failed).
func (s *stream) snapshotSweep(ctx workflow.Context) {
	sn := s.st.Snapshot
	if sn == nil || sn.State != SnapshotRunning {
		return
	}
	for _, id := range sn.Tablets {
		if row := s.st.Tablets[id]; row != nil && terminal(row.State) {
			s.snapshotReported(ctx, *row)
		}
	}
}

// takes reports whether tablet id is one of the snapshot's (Tablets is
// sorted).
func (sn *Snapshot) takes(id string) bool {
	_, ok := slices.BinarySearch(sn.Tablets, id)
	return ok
}

// copied reports whether tablet id's copy is done (Done is sorted).
func (sn *Snapshot) copied(id string) bool {
	_, ok := slices.BinarySearch(sn.Done, id)
	return ok
}

// ended reports whether tablet id's copy is done or was refused.
func (sn *Snapshot) ended(id string) bool { return sn.copied(id) || sn.Failed[id] != "" }

// snapshotEnded makes the snapshot Done once every tablet's copy is done
// or was refused.
func (s *stream) snapshotEnded(ctx workflow.Context) {
	sn := s.st.Snapshot
	for _, id := range sn.Tablets {
		if !sn.ended(id) {
			return
		}
	}
	sn.State, sn.Ended = SnapshotDone, workflow.Now(ctx)
	s.log.Info("snapshot done", "snapshot", sn.ID, "tables", sn.Tables, "failed", len(sn.Failed))
}

// mergeCopy is a tablet's copy after a run that reported now: rows add
// up over the runs of one copy.
func mergeCopy(prev, now *source.CopyProgress) *source.CopyProgress {
	if now == nil {
		return prev
	}
	out := *now
	if prev != nil && prev.Kind == now.Kind && prev.ID == now.ID {
		if prev.Done {
			return prev // a reader that found it complete at its start
		}
		out.Rows += prev.Rows
		out.Estimate = max(out.Estimate, prev.Estimate)
	}
	return &out
}

// copyFinished reports whether a run's copy is one that finished now:
// done, and not the copy the tablet already had done.
func copyFinished(prev, now *source.CopyProgress) bool {
	return now != nil && now.Done && (prev == nil || !prev.Done || prev.Kind != now.Kind || prev.ID != now.ID)
}
