package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
)

// Backoff between attempts that are not the activity's own retries
// (re-selection when no replica is eligible, a replica that keeps failing).
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
)

// policyBackoff is the wait after prev (0: the first) by a retry
// policy's intervals: initialInterval, then times backoffCoefficient, up
// to maximumInterval. A timer's length is not part of the command
// sequence (a replay matches timers by ID), so this needs no version.
func policyBackoff(prev time.Duration, r config.Retry) time.Duration {
	initial, limit, coef := r.InitialInterval.D(), r.MaximumInterval.D(), r.BackoffCoefficient
	if initial <= 0 {
		initial = minBackoff
	}
	if coef < 1 {
		coef = 2
	}
	if limit < initial {
		limit = max(initial, maxBackoff)
	}
	if prev <= 0 {
		return initial
	}
	return min(max(time.Duration(float64(prev)*coef), initial), limit)
}

// errStreamGone: the stream workflow is closed; the tablet stops itself.
var errStreamGone = errors.New("stream workflow is closed")

// TabletWorkflow streams one tablet: select a replica → GetChanges (a
// bounded run with its own retry policy) → keep the checkpoint, and react
// to what GetChanges reports. It reports its status to the stream on every
// state change and its counters at a bounded rate, and continues-as-new
// when Temporal suggests it. The run loop is here; a run and its outcome
// are in tablet_run.go, reports in tablet_report.go.
func TabletWorkflow(ctx workflow.Context, in TabletInput, st *TabletState) error {
	t := &tablet{in: in, st: st, log: workflow.GetLogger(ctx)}
	// A tablet given its first replica was started by a stream with
	// changeFirstPicks, which postdates every change below: it asks for
	// no version at all (each one asked is a marker and a visibility
	// write at the tablet's start).
	if in.First != nil || workflow.GetVersion(ctx, changeTabletBaseline, workflow.DefaultVersion, 1) >= 1 {
		t.version, t.quietStart, t.paced, t.reroute, t.signalHandling = versionDurable, true, true, true, true
	} else { // a tablet started before changeTabletBaseline: each change asked for
		t.version = workflow.GetVersion(ctx, changeDurable, workflow.DefaultVersion, versionDurable)
		t.quietStart = workflow.GetVersion(ctx, changeQuietStart, workflow.DefaultVersion, 1) >= 1
		t.paced = workflow.GetVersion(ctx, changePacedReports, workflow.DefaultVersion, 1) >= 1
		t.reroute = workflow.GetVersion(ctx, changeInPlaceReroute, workflow.DefaultVersion, 1) >= 1
		t.signalHandling = workflow.GetVersion(ctx, changeSignalHandling, workflow.DefaultVersion, 1) >= 1
	}
	if t.st == nil {
		t.st = &TabletState{Checkpoint: in.Start, Status: TabletStatus{ID: in.Tablet, State: Starting, Checkpoint: in.Start, Start: in.Start}}
		if in.First != nil {
			// The stream picked its first replica, started it with its
			// search attributes Streaming on it and makes its row
			// Streaming once this workflow started (changeFirstPicks): no
			// picker now, and no report until there is news.
			first := *in.First
			t.current = &first
			t.st.Selected = true
			t.st.Status.State, t.st.Status.Replica = Streaming, first.Replica.Alias
			t.st.Status.Updated = workflow.Now(ctx)
			t.st.LastReport = workflow.Now(ctx)
			t.in.First = nil // used: not carried into a continue-as-new
		}
	}
	if !t.st.Intents {
		// A state from before the intents were carried: derive the pause.
		// (Never from a carried state: a resume just before continuing as
		// new leaves the status Paused for a moment.)
		t.st.Pause, t.st.Intents = t.st.Status.State == Paused, true
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
	in      TabletInput
	st      *TabletState
	log     log.Logger
	version workflow.Version
	// quietStart: no report at the start of a run (changeQuietStart).
	quietStart bool
	// paced: reports go out from the pacer (changePacedReports); due says
	// one is wanted, gone that the pacer found the stream closed.
	paced bool
	due   bool
	gone  error
	// reroute: a run may move to another replica in place
	// (changeInPlaceReroute).
	reroute bool
	// signalHandling: signals decoded here, commands that come while the
	// run waits to continue as new applied, errors with their context
	// (changeSignalHandling).
	signalHandling bool
	// retrying: a failed run makes the tablet Retrying until a run
	// commits (changeRetryingState); nil until asked (retryingState).
	retrying *bool
	// charged: a failed run is charged to the replica its error names
	// (changeChargedReplica); nil until asked (chargesNamedReplica).
	charged *bool
	// rewording: a reworded reason leaves the search attributes alone
	// (changeQuietRewording); nil until asked (quietRewording).
	rewording *bool
	// copies: a run that finished a copy reports at once
	// (changeCopyReports); nil until asked (reportsCopies).
	copies *bool
	// progress: the activity's own signals; commands: the stream's.
	progress workflow.ReceiveChannel
	commands workflow.ReceiveChannel
	backoff  time.Duration
	// reports are the report signals sent and not yet checked; resend is
	// set when one failed for a reason other than the stream being gone,
	// so the next report goes out whatever its pace.
	reports []workflow.Future
	resend  bool
	// current is the replica being read. A run that simply ended keeps it
	// (no selection between runs) unless it was a fallback pick; any error,
	// an exclusion, a pause or a stop clears it so the next run selects
	// again.
	current *activities.Selection
}

// durable reports whether this run has the durability changes: operator
// intents checked before continue-as-new, report failures told apart.
func (t *tablet) durable() bool { return t.version >= versionDurable }

func (t *tablet) run(ctx workflow.Context) error {
	t.resend = t.st.Resend
	t.progress = workflow.GetSignalChannel(ctx, activities.SignalProgress)
	t.commands = workflow.GetSignalChannel(ctx, SignalTabletCommand)
	if t.paced {
		workflow.Go(ctx, t.pace)
	}
	if !t.quietStart || t.resend {
		if err := t.report(ctx, !t.quietStart); err != nil {
			return err
		}
	}
	for {
		if t.st.Stop && t.durable() {
			return t.stopped(ctx)
		}
		if workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			t.drain(ctx)
			if t.st.Stop && t.durable() {
				continue // a stop drained just now ends the tablet instead
			}
			if err := t.checkReports(ctx, true); err != nil {
				return err
			}
			// Waiting for the reports let more signals in: a command
			// left in its channel now would be lost with this run.
			if t.signalHandling && t.commands.Len() > 0 {
				continue
			}
			t.st.Resend = t.resend || t.due
			return workflow.NewContinueAsNewError(ctx, TabletWorkflow, t.in, t.st)
		}
		if t.st.Stop {
			return t.stopped(ctx)
		}
		if t.st.Pause {
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
				if err := t.wait(ctx, false); err != nil {
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

func (t *tablet) stopped(ctx workflow.Context) error {
	return t.setState(ctx, Stopped, t.st.Status.Replica, "stopped by the operator after a final commit")
}

// handle applies an operator command. It reports whether a running
// GetChanges must stop (at its next batch boundary, after its commit).
func (t *tablet) handle(ctx workflow.Context, cmd TabletCommand) (interrupt bool) {
	switch cmd.Kind {
	case CmdReopen:
		return true
	case CmdPause:
		t.st.Pause = true
	case CmdResume:
		t.st.Pause = false
	case CmdStop:
		t.st.Stop = true
	case CmdInclude:
		t.st.Exclude = t.st.Exclude.Remove(cmd.Aliases...)
		t.in.Exclude = t.in.Exclude.Remove(cmd.Aliases...)
		t.st.Status.Excluded = t.liveExclusions(ctx)
	case CmdConfigure:
		if cmd.Tunables != nil {
			t.in.Config.Selection, t.in.Config.Retry = cmd.Tunables.Selection, cmd.Tunables.Retry
			t.in.Config.Batch, t.in.Config.Run = cmd.Tunables.Batch, cmd.Tunables.Run
			t.in.Config.AutoExcludeTTL = cmd.Tunables.AutoExcludeTTL
		}
	case CmdRecheck:
	default:
		t.log.Warn("unknown tablet command", "kind", cmd.Kind)
	}
	return t.st.Pause || t.st.Stop
}

// drain applies every buffered signal before continuing as new; the
// intents it applies live in the state the next run receives.
func (t *tablet) drain(ctx workflow.Context) {
	for {
		var p activities.Progress
		if ok, _ := receiveAsync(t.progress, &p, t.signalHandling); !ok {
			break
		}
	}
	for {
		var cmd TabletCommand
		ok, err := receiveAsync(t.commands, &cmd, t.signalHandling)
		if !ok {
			return
		}
		if err != nil {
			t.badSignal(ctx, SignalTabletCommand, err)
			continue
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
	for t.st.Pause && !t.st.Stop {
		if t.durable() && workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			return false, nil // the run loop continues as new, still paused
		}
		sel := workflow.NewSelector(ctx)
		if expired != nil {
			sel.AddFuture(expired, func(workflow.Future) {})
		}
		sel.AddReceive(t.commands, func(c workflow.ReceiveChannel, _ bool) {
			var cmd TabletCommand
			if err := receive(ctx, c, &cmd, t.signalHandling); err != nil {
				t.badSignal(ctx, SignalTabletCommand, err)
				return
			}
			t.handle(ctx, cmd)
		})
		sel.Select(ctx)
		if err := ctx.Err(); err != nil {
			return true, err
		}
		if expired != nil && expired.IsReady() && t.st.Pause {
			return true, t.setState(ctx, Expired, "", fmt.Sprintf("paused for longer than the source's retention (%v)", t.in.Retention))
		}
	}
	t.st.Status.PausedAt = time.Time{}
	return false, nil
}

// badSignal logs a signal whose payload did not decode; the tablet goes
// on (its commands come from the stream, so only someone else's signal
// can be bad).
func (t *tablet) badSignal(ctx workflow.Context, name string, err error) {
	workflow.GetLogger(ctx).Warn("signal ignored: its payload does not decode", "signal", name, "error", err)
}

// wait backs off between runs, doubling up to maxBackoff, or byPolicy by
// the stream's retry policy's intervals (policyBackoff); an operator
// command (an exclusion lifted, pause, stop) ends it early.
func (t *tablet) wait(ctx workflow.Context, byPolicy bool) error {
	if byPolicy {
		t.backoff = policyBackoff(t.backoff, t.in.Config.Retry)
	} else {
		t.backoff = min(max(2*t.backoff, minBackoff), maxBackoff)
	}
	timer := workflow.NewTimer(ctx, t.backoff)
	sel := workflow.NewSelector(ctx)
	sel.AddFuture(timer, func(workflow.Future) {})
	sel.AddReceive(t.commands, func(c workflow.ReceiveChannel, _ bool) {
		var cmd TabletCommand
		if err := receive(ctx, c, &cmd, t.signalHandling); err != nil {
			t.badSignal(ctx, SignalTabletCommand, err)
			return
		}
		t.handle(ctx, cmd)
		if cmd.Kind != CmdReopen { // a snapshot recorded: no reason to hurry a retry
			t.backoff = 0
		}
	})
	sel.Select(ctx)
	return ctx.Err()
}
