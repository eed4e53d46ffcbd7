package activities

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/metrics"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// SignalProgress is the signal GetChanges sends its own TabletWorkflow when
// an attempt after the first starts (Retrying) and when it recovers.
const SignalProgress = "tablet-progress"

// WorkflowClient signals and queries workflows; client.Client is one.
type WorkflowClient interface {
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
	QueryWorkflow(ctx context.Context, workflowID, runID, queryType string, args ...any) (converter.EncodedValue, error)
}

// Activities holds what the activities need: shared sources and sinks, and
// a Temporal client to signal and query workflows.
type Activities struct {
	Resources *Resources
	Client    WorkflowClient
	Logger    *zap.Logger
	// Watcher stops a GetChanges whose replica the operator excluded.
	Watcher *Watcher
	// Metrics, if set, records what the activities do.
	Metrics *metrics.Metrics
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// RecheckEvery: see recheckEvery (0: DefaultRecheck).
	RecheckEvery time.Duration
	// PickerWait: see PickerQueryWait (0: PickerQueryWait).
	PickerWait time.Duration
	// LiveEvery, if set, is how often at most a run records its
	// heartbeat, whose details (checkpoint, records, lag) are the live
	// status (the stream's status query and starter status): the
	// worker's MaxHeartbeatThrottleInterval sends them to the server as
	// often (docs/operating.md#live-status).
	LiveEvery time.Duration
	// DataConverter decodes the heartbeats ReadLiveFigures reads (the
	// client's; nil: the default).
	DataConverter converter.DataConverter
	// Busy, if set, is told when a read finds a backlog, the operator's
	// exclude list changes or a run moves in place: work that will keep
	// the worker busy (the worker's gomaxprocs.Governor).
	Busy func()
}

// heartbeatEvery is how often a run records its heartbeat: a third of its
// heartbeat timeout (0: none), or LiveEvery if that is sooner.
func (a *Activities) heartbeatEvery(timeout time.Duration) time.Duration {
	every := timeout / 3
	if a.LiveEvery > 0 && every > a.LiveEvery {
		every = a.LiveEvery
	}
	return every
}

// busy tells a.Busy, if set.
func (a *Activities) busy() {
	if a.Busy != nil {
		a.Busy()
	}
}

func (a *Activities) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// GetChangesInput is one bounded run of a tablet's change stream.
type GetChangesInput struct {
	Stream     string            `json:"stream"`
	Tablet     string            `json:"tablet"`
	Source     config.Source     `json:"source"`
	Sink       config.Sink       `json:"sink"`
	Replica    source.Replica    `json:"replica"`
	Checkpoint source.Checkpoint `json:"checkpoint"`
	// Start is where the tablet started (a split's hand-off, or zero): a
	// sink that holds nothing for the tablet is expected only while the
	// workflow's checkpoint is still Start.
	Start source.Checkpoint `json:"start,omitzero"`
	// Resynced: Start is a resync's fresh start (source.Resyncer): the
	// sink may hold anything below it, since the resync's markers
	// supersede it.
	Resynced bool `json:"resynced,omitempty"`
	// StartFrom is the stream's startFrom, which a zero Checkpoint means
	// to a source that keeps no stream on its servers (vitess).
	StartFrom string       `json:"startFrom,omitempty"`
	Batch     config.Batch `json:"batch"`
	// RunFor bounds the run; it returns after about this long.
	RunFor config.Duration `json:"runFor"`
	// Retention is the source's retention, for the headroom metric (0:
	// unknown).
	Retention time.Duration `json:"retention,omitempty"`
	// Reroute, when set, lets the run leave a replica the operator
	// excludes by itself (see GetChanges); the tablet workflow sets it
	// from changeInPlaceReroute on.
	Reroute *Reroute `json:"reroute,omitempty"`
	// Recovering: the tablet's last run failed and it shows Retrying, so
	// this run's first commit is news to it: the run signals Streaming
	// then (SignalProgress), as a retry's first commit does.
	Recovering bool `json:"recovering,omitempty"`
	// Counted is what the tablet had counted before this run; the run's
	// heartbeat carries it, so that a live status shows the tablet's
	// totals even when its last run ended unreported.
	Counted *Counted `json:"counted,omitempty"`
	// Sections, when set, names the stream's config, whose source and
	// sink sections are read instead of Source's and Sink's (see
	// ConfigRef).
	Sections *ConfigRef `json:"sections,omitempty"`
}

// Reroute is what GetChanges needs to pick another replica in place: the
// tablet picker's settings and the tablet's own (automatic) exclude list
// as the run started (the operator's list is the watcher's copy).
type Reroute struct {
	Selection config.Selection   `json:"selection"`
	Exclude   config.ExcludeList `json:"exclude,omitempty"`
	// Fallback: in.Replica was a fallback pick (a better-ranked replica
	// was down, lagging or excluded). FallbackRun after it, the run picks
	// again and moves back in place if that brings a preferred replica;
	// if not, the run ends and the tablet selects.
	Fallback bool `json:"fallback,omitempty"`
}

// GetChangesResult is where a run got to. Records never travel here.
type GetChangesResult struct {
	Checkpoint source.Checkpoint `json:"checkpoint"`
	Records    int64             `json:"records"`
	Batches    int64             `json:"batches"`
	CaughtUp   bool              `json:"caughtUp"`
	LagSeconds float64           `json:"lagSeconds"`
	// Slot: the replica's slot for the stream, on sources that keep
	// history in slots (PostgreSQL); read every slotEvery.
	Slot *source.SlotStats `json:"slot,omitempty"`
	// Stopped says why the run ended: "run ended", "cancelled",
	// "worker stopping", "replica excluded: …", "copy finished".
	Stopped string `json:"stopped"`
	// Switched is the replica the run moved to in place, last (nil: it
	// read in.Replica throughout).
	Switched *Selection `json:"switched,omitempty"`
	// Left: the replicas the run left in place because the source said
	// to read elsewhere (POSITION_MISMATCH), with the reason: the
	// tablet's automatic exclusions, which the workflow dates.
	Left config.ExcludeList `json:"left,omitempty"`
	// Copy: the copy of rows the run's reader had open or finished (a
	// stream's start, a resync, an ad-hoc snapshot), on sources whose
	// readers report it (source.CopyReporter).
	Copy *source.CopyProgress `json:"copy,omitempty"`
}

// slotEvery: how often GetChanges reads its replica's slot statistics.
const slotEvery = 10 * time.Second

// StoppedRunEnded is GetChangesResult.Stopped for a run that used up its
// time: the replica is fine to keep reading.
const StoppedRunEnded = "run ended"

// StoppedCopyFinished is GetChangesResult.Stopped for a run that ended
// because its reader's copy of rows finished (Copy): the tablet reports
// it at once, and the next run starts at once.
const StoppedCopyFinished = "copy finished"

// Heartbeat is GetChanges' heartbeat detail: enough for the next attempt
// to resume and to say why the previous one failed.
type Heartbeat struct {
	Checkpoint source.Checkpoint `json:"checkpoint"`
	Records    int64             `json:"records"`
	Batches    int64             `json:"batches"`
	// LagSeconds is the run's lag at its last commit (live status).
	LagSeconds float64 `json:"lagSeconds,omitempty"`
	LastError  string  `json:"lastError,omitempty"`
	// LastSuccess is when a poll last succeeded, for retention headroom.
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
	// Switched: the replica an earlier attempt moved to in place, which
	// the next attempt reads instead of in.Replica; Left, the replicas
	// earlier attempts left in place, which it does not pick again.
	Switched *Selection         `json:"switched,omitempty"`
	Left     config.ExcludeList `json:"left,omitempty"`
	// Counted is the run's input's (GetChangesInput.Counted).
	Counted *Counted `json:"counted,omitempty"`
}

// Counted is a tablet's records and batches.
type Counted struct {
	Records int64 `json:"records"`
	Batches int64 `json:"batches"`
}

// Progress is the SignalProgress payload.
type Progress struct {
	// State is "Retrying" or "Streaming".
	State     string `json:"state"`
	Attempt   int32  `json:"attempt"`
	LastError string `json:"lastError,omitempty"`
	Replica   string `json:"replica"`
	// Switched is set when the run moved to Replica in place, because the
	// operator excluded the one it read or the source said to read
	// elsewhere: the tablet's selection now. Left is set in the second
	// case: the replica left and why, for the tablet's own exclude list.
	Switched *Selection        `json:"switched,omitempty"`
	Left     *config.Exclusion `json:"left,omitempty"`
}

// commitTimeout bounds a commit or an ack, which run on a context that
// cancellation does not cut.
const commitTimeout = 30 * time.Second

// GetChanges reads a tablet from one replica and writes it to the sink, in
// a loop: long-polled batch → sink write → durable commit, the
// poller reading the next batch meanwhile (and pacing small reads by
// in.Batch.Linger: the group commit) and acknowledging committed
// checkpoints to the source between its reads. It returns after in.RunFor,
// on cancellation, when the worker stops or when the operator excludes its
// replica, always at a batch boundary after a commit. With in.Reroute it
// leaves an excluded replica in place instead: the picker chooses another
// (reroute), which is read on from the committed checkpoint, and the
// tablet workflow hears of it (Progress.Switched, then the result's
// Switched); the run ends only when there is none. So it does with a
// replica the source says to read elsewhere (POSITION_MISMATCH), which
// the tablet then excludes for a while as if the run had failed
// (Progress.Left, the result's Left). On a retry it
// resumes (on the replica it moved to, if it did) from the later of the
// heartbeat, the sink's stored checkpoint and in.Checkpoint; a sink that
// is behind a checkpoint committed to it (lost data) is SinkFailed, except
// a sink that holds nothing yet for a tablet still at in.Start. Heartbeats carry the latest committed progress
// and are recorded at least every third of the heartbeat timeout, through
// slow polls, commits and start-up checks (after every batch when no
// timeout is set). Source errors are classified by the source: retry-same
// ones are plain (the activity's RetryPolicy retries them and counts them
// against the replica); the others are non-retryable ApplicationErrors
// typed for the workflow. Sink errors are never the replica's: they are
// Fenced, SinkUnavailable or SinkFailed (classifySink).
func (a *Activities) GetChanges(ctx context.Context, in GetChangesInput) (GetChangesResult, error) {
	r := a.startRun(ctx, in)
	defer r.release()
	if err := r.checkReplica(); err != nil {
		return r.res, r.counted(err)
	}
	if ok, err := r.openSink(); !ok {
		return r.res, r.counted(err)
	}
	if err := r.startReading(); err != nil {
		return r.res, r.counted(err)
	}
	if in.Recovering {
		r.recovered = false // the first commit signals Streaming
	}
	err := r.loop()
	if err == nil && r.res.Copy == nil {
		// No commit saw a copy: the reader's own word (one that found
		// its copy complete as it opened). Rows it handed out were in a
		// batch the run ended before committing: the copy is not done
		// until a run commits them (the next reader copies them again).
		r.res.Copy = r.cur.copied()
		if c := r.res.Copy; c != nil && c.Rows > 0 {
			c.Done = false
		}
	}
	return r.res, r.counted(err)
}

// reading is one replica being read: its reader and the poller that owns
// it until close.
type reading struct {
	rd     source.ReplicaReader
	slots  source.SlotReporter // nil: the source keeps no slots
	pl     *poller
	closed bool
}

// close stops the poller, which sends the last ack, then closes a reader
// that holds a connection (postgres). Closing twice is a no-op.
func (r *reading) close() {
	if r.closed {
		return
	}
	r.closed = true
	r.pl.stop()
	if c, ok := r.rd.(io.Closer); ok {
		_ = c.Close()
	}
}

// copied closes the reading (the poller's last ack sent) and returns its
// reader's copy, if the source reports one.
func (r *reading) copied() *source.CopyProgress {
	r.close()
	if c, ok := r.rd.(source.CopyReporter); ok {
		return c.Copy()
	}
	return nil
}

// FallbackRun is how long a run reads a fallback replica (a better-ranked
// one was down, lagging or excluded when it was picked), whether picked at
// the run's start or in place, before it picks again: it moves back to a
// preferred replica in place if there is one (the run goes on), else it
// ends and the tablet selects. A tablet returns to its preferred replica
// within about this long of it recovering, however long run.duration is.
const FallbackRun = time.Minute

// rerouteTimeout bounds the topology read of a move in place.
const rerouteTimeout = 5 * time.Second

// reroute picks the replica a run moves to in place when the operator
// excludes the one it reads or the source sends it elsewhere: the tablet
// picker over the topology as it is now, skipping the tablet's own
// exclusions (as at the run's start, and left, the replicas the run
// left) and the operator's list as this worker's watcher read it. ok is
// false when the run was not asked to (in.Reroute nil), the list or the
// topology cannot be read, or no other replica is eligible: the run then
// ends and the tablet workflow selects, as it always did.
func (a *Activities) reroute(ctx context.Context, src source.Source, in GetChangesInput, left config.ExcludeList, from string,
	log *zap.Logger) (Selection, bool) {
	sel, asked, err := a.pickInPlace(ctx, src, in, left)
	if !asked {
		return Selection{}, false
	}
	if err != nil || sel.Replica.Alias == from {
		log.Info("no replica to move to in place; the run ends and the tablet selects", zap.Error(err))
		return Selection{}, false
	}
	return sel, true
}

// preferredAgain is the pick of a run whose time on a fallback replica is
// up: a preferred replica other than from, if the picker finds one now
// (ok false: the run ends and the tablet selects, as after a run).
func (a *Activities) preferredAgain(ctx context.Context, src source.Source, in GetChangesInput, left config.ExcludeList,
	from string) (Selection, bool) {
	sel, asked, err := a.pickInPlace(ctx, src, in, left)
	if !asked || err != nil || sel.Fallback || sel.Replica.Alias == from {
		return Selection{}, false
	}
	return sel, true
}

// pickInPlace runs the tablet picker for a move in place: over the
// topology as it is now, skipping the tablet's own exclusions (as at the
// run's start, and the replicas the run left) and the operator's list as
// this worker's watcher read it.
// asked is false when the run may not move in place (not asked to, or the
// list not read here, and not within pickerWait when asked).
func (a *Activities) pickInPlace(ctx context.Context, src source.Source, in GetChangesInput, left config.ExcludeList) (sel Selection, asked bool, err error) {
	if in.Reroute == nil {
		return Selection{}, false, nil
	}
	operator, ok := a.Watcher.Watched(in.Stream)
	if !ok && a.Watcher != nil {
		// Not read yet (the run just started): wait for the watcher's
		// first answer as the picker does (pickerWait).
		wctx, cancel := context.WithTimeout(ctx, a.pickerWait())
		var err error
		operator, err = a.Watcher.Exclusions(wctx, in.Stream)
		cancel()
		ok = err == nil
	}
	if !ok {
		return Selection{}, false, nil
	}
	pctx, cancel := context.WithTimeout(ctx, rerouteTimeout)
	defer cancel()
	exclude := append(append(slices.Clone(in.Reroute.Exclude), left...), operator...)
	sel, err = a.pick(pctx, src, in.Stream, in.Tablet, in.Reroute.Selection, exclude)
	return sel, true, err
}

// oldestCommitTime is the source commit time of a group's first record
// (zero: no records).
func oldestCommitTime(group []polled) time.Time {
	for _, p := range group {
		if len(p.batch.Records) > 0 {
			return p.batch.Records[0].CommitTime
		}
	}
	return time.Time{}
}

// recheckEvery is how often a GetChanges waiting for a read looks again
// whether its run must end, besides being woken by every read (one at
// least each batch.maxWait), the end of its run, a change of the exclude
// list, cancellation or the worker stopping: a safety net, and the only
// wake-up of a run on a fake clock (tests set it short). Time alone never
// excludes a replica (an exclusion only expires). It was 1 s: 16 wake-ups
// a second on 16 caught-up tablets were a third of the worker's idle CPU.
func (a *Activities) recheckEvery() time.Duration {
	if a.RecheckEvery > 0 {
		return a.RecheckEvery
	}
	return DefaultRecheck
}

// DefaultRecheck is recheckEvery when Activities.RecheckEvery is unset.
const DefaultRecheck = 30 * time.Second

// gather makes a commit group from a poll and the polls already read
// after it (the poller reads ahead), up to batch.maxRecords records; it
// does not wait for more (the poller's linger paces a trickle of records
// into fuller reads). It returns the successful polls in order, and the
// failed poll that ended the group, if any.
func gather(pl *poller, first polled, b config.Batch) ([]polled, *polled) {
	if first.err != nil {
		return nil, &first
	}
	group := []polled{first}
	for n := len(first.batch.Records); n > 0 && n < b.MaxRecords; {
		select {
		case p := <-pl.out:
			if p.err != nil {
				return group, &p
			}
			group = append(group, p)
			n += len(p.batch.Records)
		default:
			return group, nil
		}
	}
	return group, nil
}

// commit writes a group of polled batches to the sink and makes them
// durable in one commit at the last one's checkpoint, on a context that
// cancellation does not cut; it returns the number of records. The
// poller acknowledges the checkpoint to the source afterwards: sink
// durable → checkpoint acknowledged.
func (a *Activities) commit(ctx context.Context, w sink.TabletWriter, group []polled) (int, error) {
	last := group[len(group)-1].batch.Checkpoint
	if last.Compare(w.Checkpoint()) <= 0 {
		return 0, nil // nothing new (empty polls)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	n := 0
	for _, p := range group {
		if len(p.batch.Records) == 0 {
			continue
		}
		if err := w.Write(cctx, p.batch.Records); err != nil {
			return 0, fmt.Errorf("sink write: %w", err)
		}
		n += len(p.batch.Records)
	}
	if err := w.Commit(cctx, last); err != nil {
		return 0, fmt.Errorf("sink commit at %s: %w", last, err)
	}
	return n, nil
}

// signal tells the tablet's own workflow about progress; best effort.
func (a *Activities) signal(ctx context.Context, info activity.Info, p Progress) {
	if a.Client == nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.Client.SignalWorkflow(sctx, info.WorkflowExecution.ID, "", SignalProgress, p); err != nil {
		a.logger().Warn("progress signal failed", zap.String("workflow", info.WorkflowExecution.ID), zap.Error(err))
	}
}

func (a *Activities) logger() *zap.Logger {
	if a.Logger == nil {
		return zap.NewNop()
	}
	return a.Logger
}

// replicaTrouble asks the topology about a replica and returns why it
// should not be retried ("down", "not serving", "unhealthy"), or "" if it
// looks fine or the topology cannot tell. It reads the listing the tablet
// pickers share (Resources.Tablets): a replica that fails every tablet it
// serves has all their retries ask at once, and one listing of the
// keyspace answers them all.
func (a *Activities) replicaTrouble(ctx context.Context, src source.Source, tablet, alias string) string {
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tablets, err := a.Resources.Tablets(tctx, src)
	if err != nil {
		return ""
	}
	for _, t := range tablets {
		if t.ID != tablet {
			continue
		}
		for _, r := range t.Replicas {
			if r.Alias != alias {
				continue
			}
			switch {
			case !r.Healthy:
				return "unhealthy"
			case !r.Serving:
				return "not serving"
			}
			return ""
		}
		return "no longer a replica of the tablet"
	}
	return ""
}
