package activities

import (
	"context"
	"errors"
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
	// Busy, if set, is told when a read finds a backlog, the operator's
	// exclude list changes or a run moves in place: work that will keep
	// the worker busy (the worker's gomaxprocs.Governor).
	Busy func()
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
	Batch config.Batch      `json:"batch"`
	// RunFor bounds the run; it returns after about this long.
	RunFor config.Duration `json:"runFor"`
	// Retention is the source's retention, for the headroom metric (0:
	// unknown).
	Retention time.Duration `json:"retention,omitempty"`
	// Reroute, when set, lets the run leave a replica the operator
	// excludes by itself (see GetChanges); the tablet workflow sets it
	// from changeInPlaceReroute on.
	Reroute *Reroute `json:"reroute,omitempty"`
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
	// "worker stopping", "replica excluded: …".
	Stopped string `json:"stopped"`
	// Switched is the replica the run moved to in place, last (nil: it
	// read in.Replica throughout).
	Switched *Selection `json:"switched,omitempty"`
	// Left: the replicas the run left in place because the source said
	// to read elsewhere (POSITION_MISMATCH), with the reason: the
	// tablet's automatic exclusions, which the workflow dates.
	Left config.ExcludeList `json:"left,omitempty"`
}

// slotEvery: how often GetChanges reads its replica's slot statistics.
const slotEvery = 10 * time.Second

// StoppedRunEnded is GetChangesResult.Stopped for a run that used up its
// time: the replica is fine to keep reading.
const StoppedRunEnded = "run ended"

// Heartbeat is GetChanges' heartbeat detail: enough for the next attempt
// to resume and to say why the previous one failed.
type Heartbeat struct {
	Checkpoint source.Checkpoint `json:"checkpoint"`
	Records    int64             `json:"records"`
	Batches    int64             `json:"batches"`
	LastError  string            `json:"lastError,omitempty"`
	// LastSuccess is when a poll last succeeded, for retention headroom.
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
	// Switched: the replica an earlier attempt moved to in place, which
	// the next attempt reads instead of in.Replica; Left, the replicas
	// earlier attempts left in place, which it does not pick again.
	Switched *Selection         `json:"switched,omitempty"`
	Left     config.ExcludeList `json:"left,omitempty"`
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
	info := activity.GetInfo(ctx)
	var hb Heartbeat
	if activity.HasHeartbeatDetails(ctx) {
		_ = activity.GetHeartbeatDetails(ctx, &hb)
	}
	// Counts carry over from earlier attempts of this run, so records a
	// failed attempt committed are not lost from the tablet's counters;
	// so does a move to another replica.
	res := GetChangesResult{Checkpoint: source.Max(in.Checkpoint, hb.Checkpoint), Records: hb.Records, Batches: hb.Batches,
		Switched: hb.Switched, Left: hb.Left}
	replica := in.Replica
	onFallback := in.Reroute != nil && in.Reroute.Fallback
	if hb.Switched != nil {
		replica, onFallback = hb.Switched.Replica, hb.Switched.Fallback
	}
	base := a.logger().With(zap.String("stream", in.Stream), zap.String("tablet", in.Tablet), zap.Int32("attempt", info.Attempt))
	log := base.With(zap.String("replica", replica.Alias))
	lastSuccess := hb.LastSuccess
	if lastSuccess.IsZero() {
		lastSuccess = a.now()
	}
	progress := func(lastError string) Heartbeat {
		return Heartbeat{Checkpoint: res.Checkpoint, Records: res.Records, Batches: res.Batches,
			LastError: lastError, LastSuccess: lastSuccess, Switched: res.Switched, Left: res.Left}
	}
	// Until this attempt commits, its heartbeat says why the last one failed.
	beat := startHeartbeats(func(d Heartbeat) { activity.RecordHeartbeat(ctx, d) }, progress(hb.LastError), info.HeartbeatTimeout/3)
	defer beat.stop()
	sig := a.startSignals(ctx, info)
	defer sig.close()
	fail := func(err error) (GetChangesResult, error) {
		// Recorded so the next attempt can report why this one failed.
		beat.set(progress(err.Error()))
		return res, err
	}
	headroom := func() time.Duration {
		if in.Retention <= 0 {
			return 0
		}
		return in.Retention - a.now().Sub(lastSuccess)
	}

	src, err := a.Resources.Source(in.Source)
	if err != nil {
		return res, fatalf("%v", err)
	}
	if info.Attempt > 1 {
		sig.send(Progress{State: "Retrying", Attempt: info.Attempt, LastError: hb.LastError, Replica: replica.Alias})
		// Retry same, as Vitess means it: first ask the topology about the
		// replica; if it is down, not serving or unhealthy, re-select now.
		if why := replicaTrouble(ctx, src, in.Tablet, replica.Alias); why != "" {
			return res, unhealthy(replica.Alias, why, res.Checkpoint)
		}
	}
	snk, err := a.Resources.Sink(in.Sink, in.Stream)
	if errors.Is(err, errUnknownKind) {
		return res, fatalf("%v", err)
	}
	if err != nil {
		return res, sinkError(fmt.Errorf("sink of stream %s: %w", in.Stream, err), replica.Alias, res.Checkpoint)
	}
	w, err := snk.Open(ctx, in.Tablet)
	if err != nil {
		if ctx.Err() != nil { // cancelled before anything was read
			res.Stopped = "cancelled"
			return res, nil
		}
		return res, sinkError(fmt.Errorf("open sink for tablet %s: %w", in.Tablet, err), replica.Alias, res.Checkpoint)
	}
	defer w.Close()
	// Everything committed before (the workflow's checkpoint, an earlier
	// attempt's) must still be in the sink. Only a tablet that has read
	// nothing yet may find it empty: a new one, or a split's child still at
	// its hand-off.
	if stored := w.Checkpoint(); stored.Compare(res.Checkpoint) < 0 && !(stored.IsZero() && res.Checkpoint == in.Start) {
		log.Error("sink is behind the checkpoint committed to it", zap.Stringer("sink", stored), zap.Stringer("checkpoint", res.Checkpoint))
		return res, sinkBehind(stored, res.Checkpoint, replica.Alias)
	}
	res.Checkpoint = source.Max(res.Checkpoint, w.Checkpoint())
	beat.update(progress(hb.LastError))
	// open starts reading a replica from the committed checkpoint.
	open := func(r source.Replica, log *zap.Logger) (*reading, error) {
		rd, err := src.OpenReplica(ctx, r)
		if err != nil {
			return nil, err
		}
		slots, _ := rd.(source.SlotReporter)
		return &reading{rd: rd, slots: slots, pl: startPoller(ctx, rd, source.ChangesRequest{
			Stream: in.Stream, Tablet: in.Tablet, From: res.Checkpoint,
			MaxRecords: in.Batch.MaxRecords, MaxWait: in.Batch.MaxWait.D(),
		}, in.Batch.LingerD(), a.now, log, a.Metrics, a.Busy)}, nil
	}
	cur, err := open(replica, log)
	if err != nil {
		return fail(err)
	}
	defer func() { cur.close() }()
	var slotRead time.Time
	defer a.Watcher.Watch(in.Stream)()
	// The run reads until runDeadline; on a fallback replica it looks for
	// a preferred one again at deadline, FallbackRun after it got there.
	runDeadline := a.now().Add(in.RunFor.D())
	deadlineOn := func(fallback bool) time.Time {
		if end := a.now().Add(FallbackRun); fallback && end.Before(runDeadline) {
			return end
		}
		return runDeadline
	}
	deadline := deadlineOn(onFallback)
	runEnds := time.NewTimer(deadline.Sub(a.now()))
	defer runEnds.Stop()
	recheck := time.NewTicker(a.recheckEvery())
	defer recheck.Stop()
	recovered := info.Attempt == 1
	stop := activity.GetWorkerStopChannel(ctx)
	// why returns why the run must end now, or ""; excluded says the
	// operator excluded its replica, which it may leave in place instead.
	why := func() (reason string, excluded bool) {
		select {
		case <-ctx.Done():
			return "cancelled", false
		case <-stop:
			return "worker stopping", false
		default:
		}
		if !a.now().Before(deadline) {
			return StoppedRunEnded, false
		}
		if e, ok := a.Watcher.Excluded(in.Stream, in.Tablet, replica.Alias, a.now()); ok {
			a.Metrics.Excluded(in.Stream, in.Tablet, "operator")
			log.Info("replica excluded by the operator", zap.String("reason", e.Reason))
			return "replica excluded: " + e.Reason, true
		}
		return "", false
	}
	// committed takes a commit group into the sink and the run's progress.
	committed := func(group []polled) error {
		began := group[0].began
		last := group[len(group)-1].batch
		n, err := a.commit(ctx, w, group)
		if err != nil {
			c := classifySink(err)
			log.Warn("sink failed", zap.Error(err), zap.String("type", c.Type), zap.String("reason", c.Reason))
			return sinkError(err, replica.Alias, res.Checkpoint)
		}
		if last.Checkpoint.Compare(res.Checkpoint) > 0 {
			res.Checkpoint = last.Checkpoint
			cur.pl.ack(res.Checkpoint)
		}
		res.Records += int64(n)
		res.Batches++
		res.CaughtUp = last.CaughtUp
		res.LagSeconds = 0
		if !last.CaughtUp && len(last.Records) > 0 {
			res.LagSeconds = a.now().Sub(last.Records[len(last.Records)-1].CommitTime).Seconds()
		}
		lastSuccess = a.now()
		if cur.slots != nil && lastSuccess.Sub(slotRead) >= slotEvery {
			slotRead = lastSuccess
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if st, err := cur.slots.SlotStats(sctx, in.Stream); err == nil {
				res.Slot = &st
				a.Metrics.SlotStats(in.Stream, in.Tablet, st.LagBytes, st.SafeWALBytes)
			}
			cancel()
		}
		a.Metrics.Batch(in.Stream, in.Tablet, n, lastSuccess.Sub(began), res.LagSeconds, headroom())
		if oldest := oldestCommitTime(group); !oldest.IsZero() {
			a.Metrics.Committed(in.Stream, lastSuccess.Sub(oldest))
		}
		beat.committed(progress(""))
		if !recovered {
			recovered = true
			sig.send(Progress{State: "Streaming", Attempt: info.Attempt, Replica: replica.Alias})
		}
		log.Debug("batch committed", zap.Int("records", n), zap.Int("polls", len(group)),
			zap.Stringer("checkpoint", res.Checkpoint), zap.Duration("took", a.now().Sub(began)))
		return nil
	}
	// moveTo leaves the replica read for next, in place, from the
	// committed checkpoint; false if next cannot be opened (the current
	// one is closed by then: the run ends and the tablet selects again).
	// left, if set, says the source sent the run elsewhere.
	moveTo := func(next Selection, left *config.Exclusion) bool {
		a.busy()
		cur.close()
		nlog := base.With(zap.String("replica", next.Replica.Alias))
		r, err := open(next.Replica, nlog)
		if err != nil {
			log.Warn("could not open the replica picked in place; the tablet selects again",
				zap.String("to", next.Replica.Alias), zap.Error(err))
			return false
		}
		log.Info("moved to another replica in place", zap.String("to", next.Replica.Alias), zap.Bool("fallback", next.Fallback))
		cur, replica, log, res.Switched, slotRead, onFallback = r, next.Replica, nlog, &next, time.Time{}, next.Fallback
		if left != nil {
			res.Left = res.Left.Add(*left)
		}
		deadline = deadlineOn(next.Fallback)
		runEnds.Reset(deadline.Sub(a.now()))
		beat.set(progress(""))
		sig.send(Progress{State: "Streaming", Attempt: info.Attempt, Replica: replica.Alias, Switched: &next, Left: left})
		return true
	}
	for {
		// Wait for a poll, looking out for the end of the run meanwhile.
		var first polled
		for waiting := true; waiting; {
			// Taken before why() looks at the list: a change read after
			// that look closes this channel and wakes the wait below,
			// which a channel taken after it would miss.
			changed := a.Watcher.Changed(in.Stream)
			stopping, excluded := why()
			if stopping != "" {
				// A batch already read (the poller reads one ahead) is
				// committed rather than read again by the next run.
				select {
				case p := <-cur.pl.out:
					if p.err == nil {
						if err := committed([]polled{p}); err != nil {
							return res, err
						}
					}
				default:
				}
				// Leave an excluded replica, or a fallback whose time is
				// up for a preferred one, in place: no round trip
				// through the tablet workflow and the server's task
				// queues, which take seconds when hundreds of tablets
				// move at once.
				var next Selection
				var ok bool
				switch {
				case excluded:
					next, ok = a.reroute(ctx, src, in, res.Left, replica.Alias, log)
				case stopping == StoppedRunEnded && onFallback && a.now().Before(runDeadline):
					next, ok = a.preferredAgain(ctx, src, in, res.Left, replica.Alias)
				}
				if ok && moveTo(next, nil) {
					continue
				}
				res.Stopped = stopping
				return res, nil
			}
			select {
			case first = <-cur.pl.out:
				waiting = false
			case <-ctx.Done():
			case <-stop:
			case <-runEnds.C:
			case <-changed:
				// The operator's list changed: a worker's tablets may
				// all move at once.
				a.busy()
			case <-recheck.C:
			}
		}
		group, failed := gather(cur.pl, first, in.Batch)
		if len(group) > 0 {
			if err := committed(group); err != nil {
				return res, err
			}
		}
		if failed == nil {
			continue
		}
		// A poll failed; what was read before it is committed.
		err := failed.err
		if ctx.Err() != nil { // cancelled or stopping during the long poll: nothing was read
			continue
		}
		c := src.Classify(err)
		log.Warn("get changes failed", zap.Error(err), zap.String("action", c.Action.String()))
		switch c.Action {
		case source.RetrySame:
			a.Metrics.Retry(in.Stream, in.Tablet, c.Reason, headroom())
			return fail(err)
		case source.RetryElsewhere:
			a.Metrics.Excluded(in.Stream, in.Tablet, "automatic")
			// Another replica at once, in place: the tablet workflow's
			// round trip (this run's end, a workflow task, a selection, a
			// new run) would add its time to the tablet's lag.
			left := config.Exclusion{Alias: replica.Alias, Tablet: in.Tablet, Reason: c.Reason}
			if next, ok := a.reroute(ctx, src, in, res.Left.Add(left), replica.Alias, log); ok && moveTo(next, &left) {
				continue
			}
		}
		return res, typed(c, err, replica.Alias, res.Checkpoint)
	}
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
// looks fine or the topology cannot tell.
func replicaTrouble(ctx context.Context, src source.Source, tablet, alias string) string {
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tablets, err := src.ListTablets(tctx)
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
