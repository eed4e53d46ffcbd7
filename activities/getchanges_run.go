package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/metrics"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// changesRun is one GetChanges attempt: what it resumed from, the replica
// it reads, the sink writer it commits to and the progress it reports.
// GetChanges calls its steps in order (startRun, checkReplica, openSink,
// startReading, loop) and release once at the end. Only the activity's
// goroutine uses it.
type changesRun struct {
	a    *Activities
	ctx  context.Context
	in   GetChangesInput
	info activity.Info
	// prevError is why the previous attempt failed (its heartbeat's
	// LastError): this attempt reports it until it commits.
	prevError string

	// res is the run's progress so far, counts carried over from earlier
	// attempts; it is what GetChanges returns.
	res GetChangesResult
	// replica is the replica read now; onFallback, that it was a
	// fallback pick (see Reroute.Fallback).
	replica    source.Replica
	onFallback bool
	base       *zap.Logger // stream, tablet, attempt
	log        *zap.Logger // base and the replica read now
	// lastSuccess is when a poll last succeeded (committed), for the
	// retention headroom.
	lastSuccess time.Time
	// clock: the run in the worker's seconds-since-last-commit gauge.
	clock *metrics.Run

	beat *heartbeater
	sig  *signals

	// Set by the steps, in this order; release undoes what is set.
	src      source.Source
	w        sink.TabletWriter
	cur      *reading  // the replica being read
	slotRead time.Time // when cur's slot statistics were last read
	// copying: a commit saw the reader's copy under way; copyFinished: a
	// later one saw it done (the run ends: why).
	copying, copyFinished bool
	unwatch               func() // ends the watch of the stream's exclude list
	// The run reads until runDeadline; on a fallback replica it looks
	// for a preferred one again at deadline, FallbackRun after it got
	// there.
	runDeadline time.Time
	deadline    time.Time
	runEnds     *time.Timer // fires at deadline
	recheck     *time.Ticker
	stop        <-chan struct{} // the worker is stopping
	// recovered: the tablet workflow knows the tablet streams (the first
	// attempt, or a retry that committed).
	recovered bool
}

// startRun resumes a run from the previous attempt's heartbeat, if any
// (its checkpoint, counts and moves in place), and starts the run's
// heartbeats and progress signals. It does no I/O besides the
// heartbeat; the caller must release the run.
func (a *Activities) startRun(ctx context.Context, in GetChangesInput) *changesRun {
	info := activity.GetInfo(ctx)
	var hb Heartbeat
	if activity.HasHeartbeatDetails(ctx) {
		_ = activity.GetHeartbeatDetails(ctx, &hb)
	}
	r := &changesRun{a: a, ctx: ctx, in: in, info: info, prevError: hb.LastError}
	// Counts carry over from earlier attempts of this run, so records a
	// failed attempt committed are not lost from the tablet's counters;
	// so does a move to another replica.
	r.res = GetChangesResult{Checkpoint: source.Max(in.Checkpoint, hb.Checkpoint), Records: hb.Records, Batches: hb.Batches,
		Switched: hb.Switched, Left: hb.Left}
	r.replica = in.Replica
	r.onFallback = in.Reroute != nil && in.Reroute.Fallback
	if hb.Switched != nil {
		r.replica, r.onFallback = hb.Switched.Replica, hb.Switched.Fallback
	}
	r.base = a.logger().With(zap.String("stream", in.Stream), zap.String("tablet", in.Tablet), zap.Int32("attempt", info.Attempt))
	r.log = r.base.With(zap.String("replica", r.replica.Alias))
	r.lastSuccess = hb.LastSuccess
	if r.lastSuccess.IsZero() {
		r.lastSuccess = a.now()
	}
	r.clock = a.Metrics.RunStarted(in.Stream, r.lastSuccess)
	// Until this attempt commits, its heartbeat says why the last one failed.
	r.beat = startHeartbeats(func(d Heartbeat) { activity.RecordHeartbeat(ctx, d) }, r.progress(r.prevError), a.heartbeatEvery(info.HeartbeatTimeout))
	r.sig = a.startSignals(ctx, info)
	return r
}

// release undoes what the steps set up, in the reverse order: the
// timers, the watch of the exclude list, the reading (its poller sends
// the last ack), the sink writer, then the signals (those queued still
// reach the workflow before the result) and the heartbeats.
func (r *changesRun) release() {
	if r.recheck != nil {
		r.recheck.Stop()
	}
	if r.runEnds != nil {
		r.runEnds.Stop()
	}
	if r.unwatch != nil {
		r.unwatch()
	}
	if r.cur != nil {
		r.cur.close()
	}
	if r.w != nil {
		_ = r.w.Close()
	}
	r.sig.close()
	r.beat.stop()
	r.clock.Ended()
}

// progress is the heartbeat detail of the run's committed progress, with
// lastError as the reason the last attempt failed ("" once one commits).
func (r *changesRun) progress(lastError string) Heartbeat {
	return Heartbeat{Checkpoint: r.res.Checkpoint, Records: r.res.Records, Batches: r.res.Batches, LagSeconds: r.res.LagSeconds,
		LastError: lastError, LastSuccess: r.lastSuccess, Switched: r.res.Switched, Left: r.res.Left, Counted: r.in.Counted}
}

// fail records err in the heartbeat, so the next attempt can report why
// this one failed, and returns it as a retry-same error (ErrRetrySame)
// whose details name the replica it failed on, with reason and the
// committed checkpoint: should the retries run out, the workflow charges
// that replica.
func (r *changesRun) fail(err error, reason string) error {
	r.beat.set(r.progress(err.Error()))
	return retrySame(err, ErrorDetails{Reason: reason, Replica: r.replica.Alias, Checkpoint: r.res.Checkpoint})
}

// counted is err with what the run committed (res's records and
// batches, its earlier attempts' included) in its details: a failed
// activity's result never reaches the workflow, which counts them from
// there. An error without ErrorDetails is returned as it is.
func (r *changesRun) counted(err error) error {
	var app *temporal.ApplicationError
	if err == nil || (r.res.Records == 0 && r.res.Batches == 0) || !errors.As(err, &app) || !app.HasDetails() {
		return err
	}
	var d ErrorDetails
	if app.Details(&d) != nil {
		return err
	}
	d.Records, d.Batches = r.res.Records, r.res.Batches
	return temporal.NewApplicationErrorWithOptions(app.Message(), app.Type(), temporal.ApplicationErrorOptions{
		NonRetryable: app.NonRetryable(), Cause: errors.Unwrap(app), Details: []any{d}})
}

// headroom is how much of the source's retention is left since the last
// successful poll (0: the retention is unknown).
func (r *changesRun) headroom() time.Duration {
	if r.in.Retention <= 0 {
		return 0
	}
	return r.in.Retention - r.a.now().Sub(r.lastSuccess)
}

// checkReplica gets the stream's source (its sections read from the
// stream when the run names them by reference; Fatal if it cannot be
// built) and, on an attempt after the first, tells the tablet workflow it is
// Retrying and retries the same replica as Vitess means it: it first
// asks the topology about the replica and, if it is down, not serving
// or unhealthy, fails with ReplicaUnhealthy so the tablet re-selects now.
func (r *changesRun) checkReplica() error {
	var err error
	if r.in.Source, r.in.Sink, err = r.a.sections(r.ctx, r.in.Source, r.in.Sink, r.in.Sections); err != nil {
		return configUnavailable(err, r.replica.Alias, r.res.Checkpoint)
	}
	src, err := r.a.Resources.Source(r.in.Source)
	if err != nil {
		return fatalf("%v", err)
	}
	r.src = src
	if r.info.Attempt > 1 {
		r.sig.send(Progress{State: "Retrying", Attempt: r.info.Attempt, LastError: r.prevError, Replica: r.replica.Alias})
		if why := r.a.replicaTrouble(r.ctx, src, r.in.Tablet, r.replica.Alias); why != "" {
			return unhealthy(r.replica.Alias, why, r.res.Checkpoint)
		}
	}
	return nil
}

// openSink opens the tablet's sink writer, checks that it holds
// everything committed before, and resumes from its checkpoint if that
// is later. ok is false when the run ends here: with err, or with a nil
// err when it was cancelled before anything was read (res.Stopped says
// so). Sink errors are never the replica's (sinkError).
func (r *changesRun) openSink() (ok bool, err error) {
	snk, err := r.a.Resources.Sink(r.in.Sink, r.in.Stream)
	var bad *config.FieldError
	if errors.Is(err, config.ErrUnknownKind) || errors.As(err, &bad) {
		// A config this worker cannot take: trying again changes nothing.
		return false, fatalf("%v", err)
	}
	if err != nil {
		return false, sinkError(fmt.Errorf("sink of stream %s: %w", r.in.Stream, err), r.replica.Alias, r.res.Checkpoint)
	}
	w, err := snk.Open(r.ctx, r.in.Tablet)
	if err != nil {
		if r.ctx.Err() != nil { // cancelled before anything was read
			r.res.Stopped = "cancelled"
			return false, nil
		}
		return false, sinkError(fmt.Errorf("open sink for tablet %s: %w", r.in.Tablet, err), r.replica.Alias, r.res.Checkpoint)
	}
	r.w = w
	// Everything committed before (the workflow's checkpoint, an earlier
	// attempt's) must still be in the sink. Only a tablet that has read
	// nothing yet may find it empty: a new one, or a split's child still at
	// its hand-off; and one still at a resync's start may find it
	// anywhere below (the resync's markers supersede what it holds).
	atStart := r.res.Checkpoint == r.in.Start
	if stored := w.Checkpoint(); stored.Compare(r.res.Checkpoint) < 0 && !(atStart && (stored.IsZero() || r.in.Resynced)) {
		r.log.Error("sink is behind the checkpoint committed to it", zap.Stringer("sink", stored), zap.Stringer("checkpoint", r.res.Checkpoint))
		return false, sinkBehind(stored, r.res.Checkpoint, r.replica.Alias)
	}
	r.res.Checkpoint = source.Max(r.res.Checkpoint, w.Checkpoint())
	r.beat.update(r.progress(r.prevError))
	return true, nil
}

// startReading opens the replica from the committed checkpoint (a
// failure is the source's error, recorded in the heartbeat), watches the
// stream's exclude list and starts the run's clocks: its deadline, the
// recheck ticker and the worker's stop channel.
func (r *changesRun) startReading() error {
	cur, err := r.open(r.replica, r.log)
	if err != nil {
		return r.fail(err, r.src.Classify(err).Reason)
	}
	r.cur = cur
	r.unwatch = r.a.Watcher.Watch(r.in.Stream)
	r.runDeadline = r.a.now().Add(r.in.RunFor.D())
	r.deadline = r.deadlineOn(r.onFallback)
	r.runEnds = time.NewTimer(r.deadline.Sub(r.a.now()))
	r.recheck = time.NewTicker(r.a.recheckEvery())
	r.recovered = r.info.Attempt == 1
	r.stop = activity.GetWorkerStopChannel(r.ctx)
	return nil
}

// open starts reading replica from the committed checkpoint, its poller
// logging to log.
func (r *changesRun) open(replica source.Replica, log *zap.Logger) (*reading, error) {
	rd, err := r.src.OpenReplica(r.ctx, replica)
	if err != nil {
		return nil, err
	}
	slots, _ := rd.(source.SlotReporter)
	in := r.in
	return &reading{rd: rd, slots: slots, pl: startPoller(r.ctx, rd, source.ChangesRequest{
		Stream: in.Stream, Tablet: in.Tablet, From: r.res.Checkpoint,
		MaxRecords: in.Batch.MaxRecords, MaxWait: in.Batch.MaxWait.D(), StartFrom: source.StartFrom(in.StartFrom),
	}, in.Batch.LingerD(), r.a.now, log, r.a.Metrics, r.a.Busy)}, nil
}

// deadlineOn is when the run reads to on a replica reached now: the
// run's deadline, or FallbackRun from now on a fallback if that is
// sooner.
func (r *changesRun) deadlineOn(fallback bool) time.Time {
	if end := r.a.now().Add(FallbackRun); fallback && end.Before(r.runDeadline) {
		return end
	}
	return r.runDeadline
}

// loop reads, commits and acknowledges batches until the run must end.
// It returns nil when the run ended at a batch boundary after a commit
// (res.Stopped says why), or the error it ends with: a failed commit or
// the classified error of a failed poll.
func (r *changesRun) loop() error {
	for {
		first, ended, err := r.nextPoll()
		if ended {
			return err
		}
		group, failed := gather(r.cur.pl, first, r.in.Batch)
		if len(group) > 0 {
			if err := r.commit(group); err != nil {
				return err
			}
		}
		if failed == nil {
			continue
		}
		// A poll failed; what was read before it is committed.
		if err := r.pollFailed(failed.err); err != nil {
			return err
		}
	}
}

// nextPoll waits for a poll, looking out for the end of the run
// meanwhile. ended is true when the run ends (end): err is then nil or
// the failed commit of the batch read ahead.
func (r *changesRun) nextPoll() (first polled, ended bool, err error) {
	for {
		// Taken before why() looks at the list: a change read after
		// that look closes this channel and wakes the wait below,
		// which a channel taken after it would miss.
		changed := r.a.Watcher.Changed(r.in.Stream)
		if stopping, excluded := r.why(); stopping != "" {
			moved, err := r.end(stopping, excluded)
			if !moved {
				return polled{}, true, err
			}
			continue
		}
		select {
		case first = <-r.cur.pl.out:
			return first, false, nil
		case <-r.ctx.Done():
		case <-r.stop:
		case <-r.runEnds.C:
		case <-changed:
			// The operator's list changed: a worker's tablets may
			// all move at once.
			r.a.busy()
		case <-r.recheck.C:
		}
	}
}

// why returns why the run must end now, or ""; excluded says the
// operator excluded its replica, which it may leave in place instead.
func (r *changesRun) why() (reason string, excluded bool) {
	select {
	case <-r.ctx.Done():
		return "cancelled", false
	case <-r.stop:
		return "worker stopping", false
	default:
	}
	if !r.a.now().Before(r.deadline) {
		return StoppedRunEnded, false
	}
	if r.copyFinished {
		return StoppedCopyFinished, false
	}
	if e, ok := r.a.Watcher.Excluded(r.in.Stream, r.in.Tablet, r.replica.Alias, r.a.now()); ok {
		r.a.Metrics.Excluded(r.in.Stream, r.in.Tablet, "operator")
		r.log.Info("replica excluded by the operator", zap.String("reason", e.Reason))
		return "replica excluded: " + e.Reason, true
	}
	return "", false
}

// end ends the run at a batch boundary for stopping, why's reason. It
// first commits a batch already read (the poller reads one ahead) rather
// than have the next run read it again. Then it leaves an excluded
// replica, or a fallback whose time is up for a preferred one, in place
// if it can (moved: the run goes on), with no round trip through the
// tablet workflow and the server's task queues, which take seconds when
// hundreds of tablets move at once. Otherwise res.Stopped is stopping.
// err is a failed commit.
func (r *changesRun) end(stopping string, excluded bool) (moved bool, err error) {
	select {
	case p := <-r.cur.pl.out:
		if p.err == nil {
			if err := r.commit([]polled{p}); err != nil {
				return false, err
			}
		}
	default:
	}
	var next Selection
	var ok bool
	switch {
	case excluded:
		next, ok = r.a.reroute(r.ctx, r.src, r.in, r.res.Left, r.replica.Alias, r.log)
	case stopping == StoppedRunEnded && r.onFallback && r.a.now().Before(r.runDeadline):
		next, ok = r.a.preferredAgain(r.ctx, r.src, r.in, r.res.Left, r.replica.Alias)
	}
	if ok && r.moveTo(next, nil) {
		return true, nil
	}
	r.res.Stopped = stopping
	return false, nil
}

// pollFailed handles a failed poll's error (never nil) as the source
// classifies it. It returns nil when the run goes on: the run was
// cancelled or is stopping during the long poll (nothing was read; the
// next wait ends the run), or the source said to read elsewhere and the
// run moved in place. Otherwise it returns the error the run ends with:
// retry-same errors plain (recorded in the heartbeat), the others typed
// for the workflow.
func (r *changesRun) pollFailed(err error) error {
	if r.ctx.Err() != nil { // cancelled or stopping during the long poll: nothing was read
		return nil
	}
	c := r.src.Classify(err)
	r.log.Warn("get changes failed", zap.Error(err), zap.String("action", c.Action.String()))
	switch c.Action {
	case source.RetrySame:
		r.a.Metrics.Retry(r.in.Stream, r.in.Tablet, c.Reason, r.headroom())
		return r.fail(err, c.Reason)
	case source.Expired:
		if stored, moved := r.sinkMovedOn(); moved {
			// Another attempt of this tablet committed past this run's
			// checkpoint and acknowledged it: the history asked for is
			// behind the source's barrier, not lost. The next attempt
			// resumes at the sink's checkpoint.
			return r.fail(fmt.Errorf("another attempt committed up to %s, past this run's %s; reading again from the sink's checkpoint: %w",
				stored, r.res.Checkpoint, err), "SINK_MOVED_ON")
		}
	case source.RetryElsewhere:
		r.a.Metrics.Excluded(r.in.Stream, r.in.Tablet, "automatic")
		// Another replica at once, in place: the tablet workflow's
		// round trip (this run's end, a workflow task, a selection, a
		// new run) would add its time to the tablet's lag.
		left := config.Exclusion{Alias: r.replica.Alias, Tablet: r.in.Tablet, Reason: c.Reason}
		if next, ok := r.a.reroute(r.ctx, r.src, r.in, r.res.Left.Add(left), r.replica.Alias, r.log); ok && r.moveTo(next, &left) {
			return nil
		}
	}
	return typed(c, err, r.replica.Alias, r.res.Checkpoint)
}

// sinkMovedOn looks at the tablet's stored checkpoint afresh (this run's
// writer only knows the one of its Open and its own commits): moved is
// true when the sink holds a later checkpoint than this run's, or another
// writer holds the tablet now. The run's writer is closed to look; it
// committed everything it could, and the run ends either way.
func (r *changesRun) sinkMovedOn() (stored source.Checkpoint, moved bool) {
	if r.w != nil {
		_ = r.w.Close()
		r.w = nil
	}
	snk, err := r.a.Resources.Sink(r.in.Sink, r.in.Stream)
	if err != nil {
		return source.Checkpoint{}, false
	}
	w, err := snk.Open(r.ctx, r.in.Tablet)
	if errors.Is(err, sink.ErrLocked) {
		return source.Checkpoint{}, true
	}
	if err != nil {
		return source.Checkpoint{}, false
	}
	defer w.Close()
	stored = w.Checkpoint()
	return stored, stored.Compare(r.res.Checkpoint) > 0
}

// moveTo leaves the replica read for next, in place, from the committed
// checkpoint; false if next cannot be opened (the current one is closed
// by then: the run ends and the tablet selects again). left, if set,
// says the source sent the run elsewhere. On a move the heartbeat and
// the tablet workflow (Progress.Switched) hear of it at once.
func (r *changesRun) moveTo(next Selection, left *config.Exclusion) bool {
	r.a.busy()
	r.cur.close()
	nlog := r.base.With(zap.String("replica", next.Replica.Alias))
	cur, err := r.open(next.Replica, nlog)
	if err != nil {
		r.log.Warn("could not open the replica picked in place; the tablet selects again",
			zap.String("to", next.Replica.Alias), zap.Error(err))
		return false
	}
	r.log.Info("moved to another replica in place", zap.String("to", next.Replica.Alias), zap.Bool("fallback", next.Fallback))
	r.cur, r.replica, r.log, r.res.Switched, r.slotRead, r.onFallback = cur, next.Replica, nlog, &next, time.Time{}, next.Fallback
	if left != nil {
		r.res.Left = r.res.Left.Add(*left)
	}
	r.deadline = r.deadlineOn(next.Fallback)
	r.runEnds.Reset(r.deadline.Sub(r.a.now()))
	r.beat.set(r.progress(""))
	r.sig.send(Progress{State: "Streaming", Attempt: r.info.Attempt, Replica: r.replica.Alias, Switched: &next, Left: left})
	return true
}

// commit takes a commit group into the sink and the run's progress, in
// the data path's order: the sink makes it durable (on a context that
// cancellation does not cut), then its checkpoint is acknowledged to the
// source (ack), then the counters, slot statistics and metrics, then the
// heartbeat and, on a retry's first commit, the Streaming signal. A sink
// error is never the replica's (sinkError).
func (r *changesRun) commit(group []polled) error {
	began := group[0].began
	last := group[len(group)-1].batch
	n, err := r.a.commit(r.ctx, r.w, group)
	if err != nil {
		c := classifySink(err)
		r.log.Warn("sink failed", zap.Error(err), zap.String("type", c.Type), zap.String("reason", c.Reason))
		return sinkError(err, r.replica.Alias, r.res.Checkpoint)
	}
	r.ack(last.Checkpoint)
	r.count(n, last)
	r.copied(group[len(group)-1].copy)
	r.lastSuccess = r.a.now()
	r.readSlot()
	r.observe(group, n, began)
	r.heartbeat()
	r.log.Debug("batch committed", zap.Int("records", n), zap.Int("polls", len(group)),
		zap.Stringer("checkpoint", r.res.Checkpoint), zap.Duration("took", r.a.now().Sub(began)))
	return nil
}

// copied takes the reader's copy as of a commit: the run's result
// reports it, and a copy this run saw under way and now sees done ends
// the run (StoppedCopyFinished), so that the tablet reports it at once
// rather than at the run's end.
func (r *changesRun) copied(c *source.CopyProgress) {
	if c == nil {
		return
	}
	r.res.Copy = c
	// Done now, and this run's reader copied (it had seen the copy under
	// way, or handed rows of it out: a copy of one chunk is done at its
	// first read); not a copy the reader found complete as it opened.
	if c.Done && (r.copying || c.Rows > 0) {
		r.copyFinished = true
	}
	r.copying = !c.Done
}

// ack makes cp the run's checkpoint if it is later, and hands it to the
// poller, which acknowledges it to the source between its reads. Only
// for a checkpoint the sink has made durable.
func (r *changesRun) ack(cp source.Checkpoint) {
	if cp.Compare(r.res.Checkpoint) > 0 {
		r.res.Checkpoint = cp
		r.cur.pl.ack(r.res.Checkpoint)
	}
}

// count adds a commit of n records, last the group's last batch, to the
// run's counters, and sets its caught-up state and lag from last.
func (r *changesRun) count(n int, last source.Batch) {
	r.res.Records += int64(n)
	r.res.Batches++
	r.res.CaughtUp = last.CaughtUp
	r.res.LagSeconds = 0
	if !last.CaughtUp && len(last.Records) > 0 {
		r.res.LagSeconds = r.a.now().Sub(last.Records[len(last.Records)-1].CommitTime).Seconds()
	}
}

// readSlot reads the replica's slot statistics into the result and the
// metrics, at most every slotEvery, on sources that keep slots; a failed
// read is skipped.
func (r *changesRun) readSlot() {
	if r.cur.slots == nil || r.lastSuccess.Sub(r.slotRead) < slotEvery {
		return
	}
	r.slotRead = r.lastSuccess
	sctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	if st, err := r.cur.slots.SlotStats(sctx, r.in.Stream); err == nil {
		r.res.Slot = &st
		r.a.Metrics.SlotStats(r.in.Stream, r.in.Tablet, st.LagBytes, st.SafeWALBytes)
	}
	cancel()
}

// observe records a commit of n records in the metrics: the batch (from
// began, when its first poll was sent) and, if it held records, how long
// after the source's commit they were committed.
func (r *changesRun) observe(group []polled, n int, began time.Time) {
	r.a.Metrics.Batch(r.in.Stream, r.in.Tablet, n, r.lastSuccess.Sub(began), r.res.LagSeconds, r.headroom())
	r.clock.Committed(r.lastSuccess)
	if oldest := oldestCommitTime(group); !oldest.IsZero() {
		r.a.Metrics.Committed(r.in.Stream, r.lastSuccess.Sub(oldest))
	}
}

// heartbeat makes the committed progress the heartbeat's details (it
// clears the last attempt's error) and, on the first commit of a retry,
// tells the tablet workflow it streams again.
func (r *changesRun) heartbeat() {
	r.beat.committed(r.progress(""))
	if !r.recovered {
		r.recovered = true
		r.sig.send(Progress{State: "Streaming", Attempt: r.info.Attempt, Replica: r.replica.Alias})
	}
}
