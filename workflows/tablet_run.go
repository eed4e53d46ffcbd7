package workflows

import (
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// selectReplica runs the tablet picker; with no eligible replica it moves
// to NoEligibleReplica and returns an error so the loop backs off. The
// picker is a local activity: a topology read of milliseconds that needs
// no trip through the server's task queues, so that when an exclusion moves
// many tablets at once each re-selects within one workflow task.
func (t *tablet) selectReplica(ctx workflow.Context) (activities.Selection, error) {
	var a *activities.Activities
	actx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second, MaximumAttempts: 5,
			NonRetryableErrorTypes: activities.NonRetryable,
		},
		Summary: "select a replica of " + t.in.Tablet,
	})
	var sel activities.Selection
	in := activities.SelectReplicaInput{
		Stream: t.in.Stream, Tablet: t.in.Tablet, Source: t.in.Config.Source,
		Selection: t.in.Config.Selection, Exclude: t.liveExclusions(ctx), Sections: t.in.Sections,
	}
	// The operator's list the stream started the tablet with is current
	// for its first selection only (the stream, busy starting every
	// tablet, is not asked). Every later one reads the stream's current
	// list, so an include or an exclusion made since counts, also for a
	// tablet that has never selected a replica; the start-time list, less
	// what includes lifted since, is only the fallback of a stream that
	// does not answer.
	first := !t.st.Selected && t.st.Status.State == Starting
	in.Operator, in.OperatorKnown, in.OperatorFallback = t.in.Exclude, first, !first
	err := workflow.ExecuteLocalActivity(actx, a.SelectReplica, in).Get(ctx, &sel)
	if err == nil {
		t.st.Selected = true
		return sel, nil
	}
	state := Retrying
	if isType(err, activities.ErrNoEligibleReplica) {
		state = NoEligibleReplica
	}
	t.st.Status.LastError = clip(errorMessage(err, t.signalHandling))
	if rerr := t.setState(ctx, state, "", t.st.Status.LastError); rerr != nil {
		return sel, rerr
	}
	return sel, err
}

// getChanges runs one GetChanges activity on the selected replica and
// reacts to how it ended. done means the tablet workflow is finished.
func (t *tablet) getChanges(ctx workflow.Context, sel activities.Selection) (done bool, err error) {
	cfg := t.in.Config
	if t.st.Failing > 0 {
		// The last run failed (changeRetryingState): this one is no proof
		// of progress until it commits, which its first commit's signal
		// (in.Recovering) or its result says. Until then the tablet stays
		// Retrying, its attempt counting on and its last error kept.
		t.st.Status.Attempt = t.st.Failing + 1
		reason := t.st.Status.Reason
		if t.st.Status.State != Retrying {
			reason = "the last run failed: this one has not committed yet"
		}
		if err := t.setState(ctx, Retrying, sel.Replica.Alias, reason); err != nil {
			return false, err
		}
	} else {
		t.st.Status.Attempt = 1
		t.st.Status.LastError = ""
		if err := t.setState(ctx, Streaming, sel.Replica.Alias, ""); err != nil {
			return false, err
		}
	}
	var a *activities.Activities
	runCtx, cancel := workflow.WithCancel(ctx)
	actx := workflow.WithActivityOptions(runCtx, workflow.ActivityOptions{
		// Generous: a run ends by itself after run.duration.
		StartToCloseTimeout: cfg.Run.Duration.D() + cfg.Batch.MaxWait.D() + 2*time.Minute,
		HeartbeatTimeout:    cfg.Run.HeartbeatTimeout.D(),
		WaitForCancellation: true,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        cfg.Retry.InitialInterval.D(),
			BackoffCoefficient:     cfg.Retry.BackoffCoefficient,
			MaximumInterval:        cfg.Retry.MaximumInterval.D(),
			MaximumAttempts:        cfg.Retry.Attempts(),
			NonRetryableErrorTypes: activities.NonRetryable,
		},
		Summary: fmt.Sprintf("read %s from %s after %s", t.in.Tablet, sel.Replica.Alias, orDash(t.st.Checkpoint.String())),
	})
	in := activities.GetChangesInput{
		Stream: t.in.Stream, Tablet: t.in.Tablet, Source: cfg.Source, Sink: cfg.Sink,
		Replica: sel.Replica, Checkpoint: t.st.Checkpoint, Start: t.in.Start, Resynced: t.in.Resync, StartFrom: cfg.StartFrom, Batch: cfg.Batch, RunFor: runFor(cfg.Run.Duration, sel),
		Retention: t.in.Retention, Recovering: t.st.Failing > 0, Sections: t.in.Sections,
		Counted: &activities.Counted{Records: t.st.Status.Records, Batches: t.st.Status.Batches},
	}
	if t.reroute {
		// The run itself bounds its time on a fallback (see
		// activities.FallbackRun) and moves back in place when it can,
		// so it gets the whole run.duration.
		in.RunFor = cfg.Run.Duration
		in.Reroute = &activities.Reroute{Selection: cfg.Selection, Exclude: t.liveExclusions(ctx), Fallback: sel.Fallback}
	}
	fut := workflow.ExecuteActivity(actx, a.GetChanges, in)
	// moved takes the replica the run moved to in place as the tablet's
	// selection: what an error is counted against, and what the next run
	// reads; and the replicas it left because the source sent it
	// elsewhere onto the tablet's own exclude list, as if a run on each
	// had failed so (once: a signal and the result may both say it).
	heard := map[string]bool{}
	moved := func(to *activities.Selection, left ...config.Exclusion) {
		if to == nil || !t.reroute {
			return
		}
		sel = *to
		t.current = &sel
		for _, e := range left {
			if !heard[e.Alias] {
				heard[e.Alias] = true
				t.exclude(ctx, e.Alias, e.Reason, workflow.Now(ctx))
			}
		}
	}
	// While it runs: the activity says when it retries and recovers; an
	// operator's pause or stop cancels it (it returns at a batch boundary,
	// after its commit).
	cancelled := false
	for !fut.IsReady() {
		s := workflow.NewSelector(ctx)
		s.AddFuture(fut, func(workflow.Future) {})
		s.AddReceive(t.progress, func(c workflow.ReceiveChannel, _ bool) {
			var p activities.Progress
			if err := receive(ctx, c, &p, t.signalHandling); err != nil {
				t.badSignal(ctx, activities.SignalProgress, err)
				return
			}
			if p.Left != nil {
				moved(p.Switched, *p.Left)
			} else {
				moved(p.Switched)
			}
			state, reason := Streaming, ""
			switch {
			case p.State == string(Retrying):
				state = Retrying
				t.st.Status.LastError = clip(p.LastError)
			case t.st.Failing > 0 && p.Switched != nil:
				// Moved in place during a run after a failed one: still
				// no commit (changeRetryingState).
				state = Retrying
			default:
				// Streaming: a retry's, or a recovering run's, first
				// commit (changeRetryingState).
				t.st.Failing = 0
			}
			if state == Retrying && t.st.Failing > 0 {
				reason = t.st.Status.Reason
			}
			t.st.Status.Attempt = t.st.Failing + p.Attempt
			err = t.setState(ctx, state, p.Replica, reason)
		})
		s.AddReceive(t.commands, func(c workflow.ReceiveChannel, _ bool) {
			var cmd TabletCommand
			if err := receive(ctx, c, &cmd, t.signalHandling); err != nil {
				t.badSignal(ctx, SignalTabletCommand, err)
				return
			}
			if t.handle(ctx, cmd) && !cancelled {
				cancelled = true
				cancel()
			}
		})
		s.Select(ctx)
		if err != nil {
			cancel()
			return false, err
		}
	}
	var res activities.GetChangesResult
	runErr := fut.Get(ctx, &res)
	moved(res.Switched, res.Left...)
	if runErr != nil {
		t.log.Warn("tablet run failed", "error", runErr)
	}
	o := runOutcome(res, runErr, cancelled, t.signalHandling)
	var copied bool
	charged := o.replica != "" && o.replica != sel.Replica.Alias && t.chargesNamedReplica(ctx)
	if charged {
		// The error names another replica than the tablet believes the
		// run read (a move in place whose signal was lost): that one is
		// charged, and, known by its alias only, not read again without
		// a selection.
		sel = activities.Selection{Replica: source.Replica{Tablet: t.in.Tablet, Alias: o.replica}, Candidates: sel.Candidates}
	}
	if o.end == runOK {
		t.st.Status.Records += res.Records
		t.st.Status.Batches += res.Batches
		t.st.Status.LagSeconds = res.LagSeconds
		if res.Slot != nil {
			t.st.Status.Slot = res.Slot
		}
		prev := t.st.Status.Copy
		t.st.Status.Copy = mergeCopy(prev, res.Copy)
		copied = copyFinished(prev, t.st.Status.Copy)
	} else {
		// What a failed run committed before: its error says (a failed
		// activity's result never reaches the workflow).
		t.st.Status.Records += o.records
		t.st.Status.Batches += o.batches
	}
	d := decide(o, sel)
	d.report = copied && t.reportsCopies(ctx)
	if charged {
		d.keepReplica = false
	}
	return t.apply(ctx, sel, o, d)
}

// apply carries out the decision core's decision on a run's outcome.
func (t *tablet) apply(ctx workflow.Context, sel activities.Selection, o outcome, d decision) (done bool, err error) {
	if d.failed && (!t.retryingState(ctx) || ctx.Err() != nil) {
		// A tablet from before changeRetryingState; or the tablet
		// workflow itself is cancelled, which is what ended the run.
		d = d.beforeRetryingState()
	}
	if !d.keepReplica {
		t.current = nil
	}
	t.advance(o.checkpoint)
	if d.resetBackoff {
		t.backoff = 0
	}
	if o.end == runOK {
		if o.committed {
			t.st.Failing = 0
		}
		return false, t.report(ctx, d.report)
	}
	t.st.Status.LastError = o.message
	if o.split != nil {
		t.advance(o.split.Handoff)
		t.st.Status.Children = o.split.Children
		t.st.Status.Handoff = o.split.Handoff
	}
	if d.state != "" {
		if err := t.setState(ctx, d.state, sel.Replica.Alias, d.reason); err != nil || d.done {
			return d.done, err
		}
	}
	if d.failed {
		// Every attempt since the last commit failed: the next run's
		// attempt counts on from here.
		t.st.Failing = max(t.st.Status.Attempt, 1)
	}
	if d.exclude != "" {
		t.exclude(ctx, sel.Replica.Alias, d.exclude, workflow.Now(ctx))
	}
	if d.wait {
		return false, t.wait(ctx, d.byPolicy)
	}
	return false, nil
}

// exclude adds the replica to the tablet's own exclude list for
// autoExcludeTTL (decide never asks for the last eligible replica, nor
// does a run move in place from it).
func (t *tablet) exclude(ctx workflow.Context, alias, reason string, now time.Time) {
	t.st.Exclude = t.st.Exclude.Add(config.Exclusion{
		Alias: alias, Tablet: t.in.Tablet, Reason: reason,
		Expires: now.Add(t.in.Config.AutoExcludeTTL.D()),
	})
	t.st.Status.Excluded = t.liveExclusions(ctx)
}

// liveExclusions drops expired automatic entries and returns the rest.
func (t *tablet) liveExclusions(ctx workflow.Context) config.ExcludeList {
	t.st.Exclude = t.st.Exclude.Live(workflow.Now(ctx))
	return slices.Clone(t.st.Exclude)
}

func (t *tablet) advance(cp source.Checkpoint) {
	if cp.Compare(t.st.Checkpoint) > 0 {
		t.st.Checkpoint = cp
		t.st.Status.Checkpoint = cp
	}
}

// runFor is how long a run on sel reads when it cannot move in place:
// run.duration, but at most activities.FallbackRun on a fallback replica,
// so that the next pick brings the tablet back to its preferred one.
func runFor(d config.Duration, sel activities.Selection) config.Duration {
	if sel.Fallback && d.D() > activities.FallbackRun {
		return config.Duration(activities.FallbackRun)
	}
	return d
}

// chargesNamedReplica reports whether a failed run is charged to the
// replica its error's details name (changeChargedReplica). Asked for only
// when those name another replica than the tablet believes the run read.
func (t *tablet) chargesNamedReplica(ctx workflow.Context) bool {
	if t.charged == nil {
		v := workflow.GetVersion(ctx, changeChargedReplica, workflow.DefaultVersion, 1) >= 1
		t.charged = &v
	}
	return *t.charged
}

// reportsCopies reports whether a run that finished a copy of rows
// reports at once (changeCopyReports), so that a snapshot is seen Done
// without waiting for the tablet's next periodic report. Asked for at
// the first copy a tablet finishes.
func (t *tablet) reportsCopies(ctx workflow.Context) bool {
	if t.copies == nil {
		v := workflow.GetVersion(ctx, changeCopyReports, workflow.DefaultVersion, 1) >= 1
		t.copies = &v
	}
	return *t.copies
}

// retryingState reports whether the tablet shows a failed run as
// Retrying until a run commits (changeRetryingState). Asked for at the
// first failed run only: a tablet that never fails records no marker.
func (t *tablet) retryingState(ctx workflow.Context) bool {
	if t.retrying == nil {
		v := workflow.GetVersion(ctx, changeRetryingState, workflow.DefaultVersion, 1) >= 1
		t.retrying = &v
	}
	return *t.retrying
}
