package workflows

import (
	"errors"
	"fmt"
	"slices"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/picker"
	"github.com/tabletflow/tabletflow/source"
)

// Backoff between attempts that are not the activity's own retries
// (re-selection when no replica is eligible, a replica that keeps failing).
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
)

// errStreamGone: the stream workflow is closed; the tablet stops itself.
var errStreamGone = errors.New("stream workflow is closed")

// TabletWorkflow streams one tablet: select a replica → GetChanges (a
// bounded run with its own retry policy) → keep the checkpoint, and react
// to what GetChanges reports. It reports its status to the stream on every
// state change and its counters at a bounded rate, and continues-as-new
// when Temporal suggests it.
func TabletWorkflow(ctx workflow.Context, in TabletInput, st *TabletState) error {
	t := &tablet{in: in, st: st, log: workflow.GetLogger(ctx)}
	if t.st == nil {
		t.st = &TabletState{Checkpoint: in.Start, Status: TabletStatus{ID: in.Tablet, State: Starting, Checkpoint: in.Start.String()}}
	}
	t.log = log.With(t.log, "stream", in.Stream, "tablet", in.Tablet)
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (TabletStatus, error) { return t.st.Status, nil }); err != nil {
		return err
	}
	err := t.run(ctx)
	if errors.Is(err, errStreamGone) {
		t.log.Info("stream is closed; tablet workflow stops")
		return nil
	}
	return err
}

type tablet struct {
	in       TabletInput
	st       *TabletState
	log      log.Logger
	progress workflow.ReceiveChannel
	commands workflow.ReceiveChannel
	backoff  time.Duration
	// What the operator asked, applied at the next batch boundary.
	pause, stop bool
	// reports are the report signals sent and not yet checked.
	reports []workflow.Future
	// current is the replica being read. A run that simply ended keeps it
	// (no selection between runs) unless it was a fallback pick; any error,
	// an exclusion, a pause or a stop clears it so the next run selects
	// again.
	current *activities.Selection
}

func (t *tablet) run(ctx workflow.Context) error {
	t.progress = workflow.GetSignalChannel(ctx, activities.SignalProgress)
	t.commands = workflow.GetSignalChannel(ctx, SignalTabletCommand)
	t.pause = t.st.Status.State == Paused
	if err := t.report(ctx, true); err != nil {
		return err
	}
	for {
		if workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			t.drain(ctx)
			if err := t.checkReports(ctx, true); err != nil {
				return err
			}
			return workflow.NewContinueAsNewError(ctx, TabletWorkflow, t.in, t.st)
		}
		if t.stop {
			return t.setState(ctx, Stopped, t.st.Status.Replica, "stopped by the operator after a final commit")
		}
		if t.pause {
			done, err := t.paused(ctx)
			if err != nil || done {
				return err
			}
			continue
		}
		if t.current == nil {
			sel, err := t.selectReplica(ctx)
			if err != nil {
				if errors.Is(err, errStreamGone) {
					return err
				}
				if err := t.wait(ctx); err != nil {
					return err
				}
				continue
			}
			t.current = &sel
		}
		done, err := t.getChanges(ctx, *t.current)
		if err != nil || done {
			return err
		}
	}
}

// handle applies an operator command. It reports whether a running
// GetChanges must stop (at its next batch boundary, after its commit).
func (t *tablet) handle(ctx workflow.Context, cmd TabletCommand) (interrupt bool) {
	switch cmd.Kind {
	case CmdPause:
		t.pause = true
	case CmdResume:
		t.pause = false
	case CmdStop:
		t.stop = true
	case CmdInclude:
		t.st.Exclude = slices.DeleteFunc(t.st.Exclude, func(e config.Exclusion) bool { return slices.Contains(cmd.Aliases, e.Alias) })
		t.st.Status.Excluded = t.liveExclusions(ctx)
	case CmdConfigure:
		if cmd.Tunables != nil {
			t.in.Config.Selection, t.in.Config.Retry = cmd.Tunables.Selection, cmd.Tunables.Retry
			t.in.Config.Batch, t.in.Config.Run = cmd.Tunables.Batch, cmd.Tunables.Run
			t.in.Config.AutoExcludeTTL = cmd.Tunables.AutoExcludeTTL
		}
	case "recheck":
	default:
		t.log.Warn("unknown tablet command", "kind", cmd.Kind)
	}
	return t.pause || t.stop
}

// drain applies every buffered signal before continuing as new.
func (t *tablet) drain(ctx workflow.Context) {
	for {
		var p activities.Progress
		if !t.progress.ReceiveAsync(&p) {
			break
		}
	}
	for {
		var cmd TabletCommand
		if !t.commands.ReceiveAsync(&cmd) {
			return
		}
		t.handle(ctx, cmd)
	}
}

// paused holds the tablet at its checkpoint until resumed or stopped. Its
// source history is not advanced meanwhile, so a timer flips it to Expired
// when the source's retention runs out. done: the workflow is finished.
func (t *tablet) paused(ctx workflow.Context) (bool, error) {
	now := workflow.Now(ctx)
	if t.st.Status.PausedAt.IsZero() {
		t.st.Status.PausedAt = now
	}
	if err := t.setState(ctx, Paused, "", "paused by the operator"); err != nil {
		return true, err
	}
	var expired workflow.Future
	if r := t.in.Retention; r > 0 {
		expired = workflow.NewTimer(ctx, retentionLeft(r, t.st.Status.PausedAt, now))
	}
	for t.pause && !t.stop {
		sel := workflow.NewSelector(ctx)
		if expired != nil {
			sel.AddFuture(expired, func(workflow.Future) {})
		}
		sel.AddReceive(t.commands, func(c workflow.ReceiveChannel, _ bool) {
			var cmd TabletCommand
			c.Receive(ctx, &cmd)
			t.handle(ctx, cmd)
		})
		sel.Select(ctx)
		if err := ctx.Err(); err != nil {
			return true, err
		}
		if expired != nil && expired.IsReady() && t.pause {
			return true, t.setState(ctx, Expired, "", fmt.Sprintf("paused for longer than the source's retention (%v)", t.in.Retention))
		}
	}
	t.st.Status.PausedAt = time.Time{}
	return false, nil
}

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
		Selection: t.in.Config.Selection, Exclude: t.liveExclusions(ctx),
	}
	if !t.st.Selected {
		in.Operator, in.OperatorKnown = t.in.Exclude, true
	}
	err := workflow.ExecuteLocalActivity(actx, a.SelectReplica, in).Get(ctx, &sel)
	if err == nil {
		t.st.Selected = true
		return sel, nil
	}
	state := Retrying
	if isType(err, activities.ErrNoEligibleReplica) {
		state = NoEligibleReplica
	}
	t.st.Status.LastError = rootMessage(err)
	if rerr := t.setState(ctx, state, "", rootMessage(err)); rerr != nil {
		return sel, rerr
	}
	return sel, err
}

// getChanges runs one GetChanges activity on the selected replica and
// reacts to how it ended. done means the tablet workflow is finished.
func (t *tablet) getChanges(ctx workflow.Context, sel activities.Selection) (done bool, err error) {
	cfg := t.in.Config
	t.st.Status.Attempt = 1
	t.st.Status.LastError = ""
	if err := t.setState(ctx, Streaming, sel.Replica.Alias, ""); err != nil {
		return false, err
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
	fut := workflow.ExecuteActivity(actx, a.GetChanges, activities.GetChangesInput{
		Stream: t.in.Stream, Tablet: t.in.Tablet, Source: cfg.Source, Sink: cfg.Sink,
		Replica: sel.Replica, Checkpoint: t.st.Checkpoint, Batch: cfg.Batch, RunFor: cfg.Run.Duration,
		Retention: t.in.Retention,
	})
	// While it runs: the activity says when it retries and recovers; an
	// operator's pause or stop cancels it (it returns at a batch boundary,
	// after its commit).
	cancelled := false
	for !fut.IsReady() {
		s := workflow.NewSelector(ctx)
		s.AddFuture(fut, func(workflow.Future) {})
		s.AddReceive(t.progress, func(c workflow.ReceiveChannel, _ bool) {
			var p activities.Progress
			c.Receive(ctx, &p)
			t.st.Status.Attempt = p.Attempt
			state := Streaming
			if p.State == string(Retrying) {
				state = Retrying
				t.st.Status.LastError = p.LastError
			}
			err = t.setState(ctx, state, p.Replica, "")
		})
		s.AddReceive(t.commands, func(c workflow.ReceiveChannel, _ bool) {
			var cmd TabletCommand
			c.Receive(ctx, &cmd)
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
	if runErr != nil || cancelled || res.Stopped != activities.StoppedRunEnded || sel.Fallback {
		t.current = nil
	}
	if runErr == nil || (cancelled && temporal.IsCanceledError(runErr)) {
		t.backoff = 0
		t.advance(res.Checkpoint)
		t.st.Status.Records += res.Records
		t.st.Status.Batches += res.Batches
		t.st.Status.LagSeconds = res.LagSeconds
		return false, t.report(ctx, false)
	}
	return t.onError(ctx, sel, runErr)
}

// onError decides what a failed run means for the tablet.
func (t *tablet) onError(ctx workflow.Context, sel activities.Selection, runErr error) (bool, error) {
	var d activities.ErrorDetails
	details(runErr, &d)
	t.advance(d.Checkpoint)
	t.st.Status.LastError = rootMessage(runErr)
	alias := sel.Replica.Alias
	now := workflow.Now(ctx)
	switch {
	case isType(runErr, activities.ErrFenced):
		// Another writer committed to this tablet's sink: this run ends and
		// the next one reopens the sink at its stored checkpoint.
		t.log.Warn("sink fenced this run; starting a new one", "error", runErr)
		return false, t.wait(ctx)
	case isType(runErr, activities.ErrReplicaUnhealthy):
		// The picker's health filter skips it: re-select at once.
		return false, nil
	case isType(runErr, activities.ErrRetryElsewhere):
		if t.exclude(ctx, sel, d.Reason, now) {
			return false, nil // another replica, at once
		}
		return false, t.wait(ctx) // the last one: again, with capped backoff
	case isType(runErr, activities.ErrTabletSplit) && d.Split != nil:
		t.advance(d.Split.Handoff)
		t.st.Status.Children = d.Split.Children
		t.st.Status.Handoff = d.Split.Handoff.String()
		return true, t.setState(ctx, Split, alias, fmt.Sprintf("split into %v at %s", d.Split.Children, d.Split.Handoff))
	case isType(runErr, activities.ErrStreamExpired):
		return true, t.setState(ctx, Expired, alias, "the source no longer holds the history this tablet needs: "+t.st.Status.LastError)
	case isType(runErr, activities.ErrFatal):
		return true, t.setState(ctx, Failed, alias, t.st.Status.LastError)
	case retriesExhausted(runErr):
		// A replica the topology calls healthy failed maximumAttempts
		// times: exclude it for a while and pick another.
		t.exclude(ctx, sel, "RETRIES_EXHAUSTED", now)
		return false, t.wait(ctx)
	}
	t.log.Warn("tablet run failed", "error", runErr)
	return false, t.wait(ctx)
}

// exclude adds the replica to the tablet's own exclude list for
// autoExcludeTTL, unless it is the last eligible replica: that one is kept
// and retried with capped backoff. It reports whether it excluded.
func (t *tablet) exclude(ctx workflow.Context, sel activities.Selection, reason string, now time.Time) bool {
	if sel.Candidates <= 1 {
		t.log.Warn("not excluding the last eligible replica", "replica", sel.Replica.Alias, "reason", reason)
		return false
	}
	t.st.Exclude = append(t.st.Exclude, config.Exclusion{
		Alias: sel.Replica.Alias, Tablet: t.in.Tablet, Reason: reason,
		Expires: now.Add(t.in.Config.AutoExcludeTTL.D()),
	})
	t.st.Status.Excluded = t.liveExclusions(ctx)
	return true
}

// liveExclusions drops expired automatic entries and returns the rest.
func (t *tablet) liveExclusions(ctx workflow.Context) []config.Exclusion {
	now := workflow.Now(ctx)
	live := t.st.Exclude[:0]
	for _, e := range t.st.Exclude {
		if _, ok := picker.Excluded([]config.Exclusion{e}, e.Alias, t.in.Tablet, now); ok {
			live = append(live, e)
		}
	}
	t.st.Exclude = live
	return append([]config.Exclusion(nil), live...)
}

// wait backs off between runs, doubling up to maxBackoff; an operator
// command (an exclusion lifted, pause, stop) ends it early.
func (t *tablet) wait(ctx workflow.Context) error {
	t.backoff = min(max(2*t.backoff, minBackoff), maxBackoff)
	timer := workflow.NewTimer(ctx, t.backoff)
	sel := workflow.NewSelector(ctx)
	sel.AddFuture(timer, func(workflow.Future) {})
	sel.AddReceive(t.commands, func(c workflow.ReceiveChannel, _ bool) {
		var cmd TabletCommand
		c.Receive(ctx, &cmd)
		t.handle(ctx, cmd)
		t.backoff = 0
	})
	sel.Select(ctx)
	return ctx.Err()
}

func (t *tablet) advance(cp source.Checkpoint) {
	if cp.Compare(t.st.Checkpoint) > 0 {
		t.st.Checkpoint = cp
		t.st.Status.Checkpoint = cp.String()
	}
}

// setState records a state change, keeps the search attributes and the
// workflow's details current, and reports to the stream at once.
func (t *tablet) setState(ctx workflow.Context, state State, replica, reason string) error {
	s := &t.st.Status
	changed := s.State != state || s.Replica != replica || s.Reason != reason
	s.State, s.Replica, s.Reason = state, replica, reason
	if !changed {
		return t.report(ctx, false)
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, SAState.ValueSet(string(state)), SAReplica.ValueSet(replica)); err != nil {
		t.log.Warn("search attributes not updated", "error", err)
	}
	return t.report(ctx, true)
}

// report signals the tablet's status to its stream: at once when forced
// (a state change), otherwise at most every max(60s, tablets × 0.5s). A
// closed stream ends the tablet (errStreamGone).
func (t *tablet) report(ctx workflow.Context, force bool) error {
	now := workflow.Now(ctx)
	t.st.Status.Updated = now
	workflow.SetCurrentDetails(ctx, t.details())
	interval := max(60*time.Second, time.Duration(t.in.Tablets)*500*time.Millisecond)
	if !force && now.Sub(t.st.LastReport) < interval {
		return nil
	}
	t.st.LastReport = now
	// The signal is not awaited: the next run starts at once, and a busy
	// stream never holds a tablet up. Its outcome is checked at the next
	// report (and awaited before the workflow ends).
	if err := t.checkReports(ctx, false); err != nil {
		return err
	}
	t.reports = append(t.reports, workflow.SignalExternalWorkflow(ctx, t.in.Stream, "", SignalTabletReport, t.st.Status))
	if terminal(t.st.Status.State) {
		return t.checkReports(ctx, true)
	}
	return nil
}

// checkReports collects the outcome of reports sent (all of them when
// wait is set, else those already delivered); a report that failed means
// the stream is closed, and the tablet stops itself (errStreamGone).
func (t *tablet) checkReports(ctx workflow.Context, wait bool) error {
	pending := t.reports[:0]
	var gone error
	for _, f := range t.reports {
		if !wait && !f.IsReady() {
			pending = append(pending, f)
			continue
		}
		if err := f.Get(ctx, nil); err != nil && gone == nil {
			t.log.Warn("report to stream failed", "error", err)
			gone = errStreamGone
		}
	}
	t.reports = pending
	return gone
}

// details says in words what the tablet is doing, for the Web UI.
func (t *tablet) details() string {
	s := t.st.Status
	out := fmt.Sprintf("**%s** tablet `%s`", s.State, s.ID)
	if s.Replica != "" {
		out += fmt.Sprintf(" on replica `%s`", s.Replica)
	}
	out += fmt.Sprintf("\n\ncheckpoint `%s`, %d records in %d batches", orDash(s.Checkpoint), s.Records, s.Batches)
	if s.Reason != "" {
		out += "\n\nwhy: " + s.Reason
	}
	if s.LastError != "" {
		out += fmt.Sprintf("\n\nattempt %d, last error: %s", s.Attempt, s.LastError)
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// isType reports whether err carries an ApplicationError of type typ.
func isType(err error, typ string) bool {
	var app *temporal.ApplicationError
	return errors.As(err, &app) && app.Type() == typ
}

// details extracts an ApplicationError's details, if any.
func details(err error, v any) {
	var app *temporal.ApplicationError
	if errors.As(err, &app) && app.HasDetails() {
		_ = app.Details(v)
	}
}

// retriesExhausted reports whether an activity failed because its retry
// policy ran out of attempts (or time) on plain retryable errors.
func retriesExhausted(err error) bool {
	var act *temporal.ActivityError
	if !errors.As(err, &act) {
		return false
	}
	switch act.RetryState() {
	case enumspb.RETRY_STATE_MAXIMUM_ATTEMPTS_REACHED, enumspb.RETRY_STATE_TIMEOUT:
		return true
	}
	return false
}

// rootMessage is the innermost error's message: what actually went wrong.
func rootMessage(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}
