package workflows

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/config"
)

// finalReportTries bounds how often a terminal report that failed for a
// reason other than the stream being gone is sent again; after that the
// tablet ends anyway and the stream learns its end from its reconcile
// (it queries a closed tablet's final status).
const finalReportTries = 5

// setState records a state change, keeps the search attributes and the
// workflow's details current, and reports to the stream at once. The
// search attributes, whose every upsert is a visibility write on the
// server, change only with the state or the replica, not with a reason's
// wording (changeQuietRewording): a tablet that waits for an eligible
// replica says why at each look, in other words as the replicas' lag
// moves.
func (t *tablet) setState(ctx workflow.Context, state State, replica, reason string) error {
	s := &t.st.Status
	reason = clip(reason)
	moved := s.State != state || s.Replica != replica
	reworded := !moved && s.Reason != reason
	s.State, s.Replica, s.Reason = state, replica, reason
	if !moved && !reworded {
		return t.report(ctx, false)
	}
	if moved || !t.quietRewording(ctx) {
		if err := workflow.UpsertTypedSearchAttributes(ctx, SAState.ValueSet(string(state)), SAReplica.ValueSet(replica)); err != nil {
			t.log.Warn("search attributes not updated", "error", err)
		}
	}
	return t.report(ctx, true)
}

// quietRewording reports whether a reason reworded in the same state on
// the same replica leaves the search attributes alone
// (changeQuietRewording). Asked for at the first such rewording only.
func (t *tablet) quietRewording(ctx workflow.Context) bool {
	if t.rewording == nil {
		v := workflow.GetVersion(ctx, changeQuietRewording, workflow.DefaultVersion, 1) >= 1
		t.rewording = &v
	}
	return *t.rewording
}

// report signals the tablet's status to its stream: soon when forced (a
// state change) or when an earlier report was lost, otherwise at most
// every max(60s, tablets × 0.5s). A closed stream ends the tablet
// (errStreamGone). With paced reports the pacer sends it (see pace); a
// terminal report is awaited, sent and confirmed before the tablet ends.
func (t *tablet) report(ctx workflow.Context, force bool) error {
	now := workflow.Now(ctx)
	t.st.Status.Updated = now
	workflow.SetCurrentDetails(ctx, t.details())
	interval := max(60*time.Second, time.Duration(t.in.Tablets)*500*time.Millisecond)
	if !force && !t.resend && now.Sub(t.st.LastReport) < interval {
		return t.gone
	}
	if t.paced {
		t.due = true
		if t.gone != nil || !terminal(t.st.Status.State) {
			return t.gone
		}
		if err := workflow.Await(ctx, func() bool { return !t.due || t.gone != nil }); err != nil {
			return err
		}
		if t.gone != nil {
			return t.gone
		}
		return t.confirmFinal(ctx)
	}
	t.st.LastReport = now
	// The signal is not awaited: the next run starts at once, and a busy
	// stream never holds a tablet up. Its outcome is checked at the next
	// report (and awaited before the workflow ends).
	if err := t.checkReports(ctx, false); err != nil {
		return err
	}
	t.send(ctx)
	if !terminal(t.st.Status.State) {
		return nil
	}
	if !t.durable() {
		return t.checkReports(ctx, true)
	}
	return t.confirmFinal(ctx)
}

// confirmFinal makes sure the terminal report just sent arrived: it is the
// stream's only word of how the tablet ended. After finalReportTries the
// tablet ends anyway (the stream's reconcile reads the closed workflow).
func (t *tablet) confirmFinal(ctx workflow.Context) error {
	backoff := minBackoff
	for try := 1; ; try++ {
		if err := t.checkReports(ctx, true); err != nil || !t.resend {
			return err
		}
		if try == finalReportTries {
			t.log.Error("terminal report not delivered; the stream's reconcile will read it from this closed workflow", "tries", try)
			return nil
		}
		if err := workflow.Sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, maxBackoff)
		t.send(ctx)
	}
}

// pace is the tablet's reporter (a workflow goroutine, changePacedReports):
// when a report is due it waits for the tablet's next turn (paceDelay) and
// sends the status as it is then, so state changes made meanwhile go out
// as one report. The outcome of earlier reports is checked before each
// send; the stream being gone is left in t.gone for the run loop.
func (t *tablet) pace(ctx workflow.Context) {
	for {
		if err := workflow.Await(ctx, func() bool { return t.due }); err != nil {
			return
		}
		if d := paceDelay(t.in.Tablet, t.paceWindow(), t.st.LastReport, workflow.Now(ctx)); d > 0 {
			if err := workflow.Sleep(ctx, d); err != nil {
				return
			}
		}
		t.due = false
		t.st.LastReport = workflow.Now(ctx)
		if err := t.checkReports(ctx, false); err != nil {
			t.gone = err
			return
		}
		t.send(ctx)
	}
}

// paceWindow is the least time between two reports of one tablet: the
// stream's tablets over its reportRate, so that all of them together send
// at most reportRate reports a second.
func (t *tablet) paceWindow() time.Duration {
	rate := t.in.Config.ReportRate
	if rate <= 0 { // a tablet started by a stream from before reportRate
		rate = config.DefaultReportRate
	}
	return time.Duration(float64(max(t.in.Tablets, 1)) / rate * float64(time.Second))
}

// paceDelay is how long a tablet whose last report went out at last waits,
// at now, before its next one, for a window between reports:
//   - a window under a second (fewer tablets than reportRate): at once if
//     the last report is a window old, else when it is;
//   - otherwise in the tablet's own slot — an offset within the window
//     taken from a hash of the tablet's ID, repeating every window — at
//     least half a window after the last one. Tablets that change state
//     together then report spread over the window, not all at once.
func paceDelay(tablet string, window time.Duration, last, now time.Time) time.Duration {
	if window < time.Second {
		return max(0, last.Add(window).Sub(now))
	}
	h := fnv.New64a()
	h.Write([]byte(tablet))
	w := int64(window)
	offset := int64(h.Sum64() % uint64(w))
	earliest := now
	if e := last.Add(window / 2); e.After(earliest) {
		earliest = e
	}
	n := earliest.UnixNano() - offset
	slot := offset + (n+w-1)/w*w
	return time.Duration(slot - now.UnixNano())
}

// send signals the current status to the stream (by workflow ID, so it
// reaches the stream's current run).
func (t *tablet) send(ctx workflow.Context) {
	t.resend = false
	t.st.Status.Seq++
	t.reports = append(t.reports, workflow.SignalExternalWorkflow(ctx, t.in.Stream, "", SignalTabletReport, t.st.Status))
}

// checkReports collects the outcome of reports sent (all of them when
// wait is set, else those already delivered). A report that failed
// because the stream is gone ends the tablet (errStreamGone); any other
// failure (the stream's signal limit, a transient error) marks the status
// to be sent again.
func (t *tablet) checkReports(ctx workflow.Context, wait bool) error {
	pending := t.reports[:0]
	var gone error
	for _, f := range t.reports {
		if !wait && !f.IsReady() {
			pending = append(pending, f)
			continue
		}
		err := f.Get(ctx, nil)
		if err == nil {
			continue
		}
		var unknown *temporal.UnknownExternalWorkflowExecutionError
		if !t.durable() || errors.As(err, &unknown) {
			if gone == nil {
				t.log.Warn("report to stream failed: the stream is gone", "error", err)
			}
			gone = errStreamGone
			continue
		}
		t.log.Warn("report to stream failed; sending it again", "error", err)
		t.resend = true
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
	out += fmt.Sprintf("\n\ncheckpoint `%s`, %d records in %d batches", orDash(s.Checkpoint.String()), s.Records, s.Batches)
	if s.Reason != "" {
		out += "\n\nwhy: " + s.Reason
	}
	if s.LastError != "" {
		out += fmt.Sprintf("\n\nattempt %d, last error: %s", s.Attempt, s.LastError)
	}
	if s.Restarts > 0 {
		out += fmt.Sprintf("\n\nrestarted %d times by the stream", s.Restarts)
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// maxText bounds the error and reason strings the workflows keep, so the
// state carried across continue-as-new stays small.
const maxText = 512

// clip shortens s to maxText bytes (on a rune boundary), marking the cut.
func clip(s string) string {
	if len(s) <= maxText {
		return s
	}
	cut := maxText
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
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

// errorMessage is what an error shows in a status: rootMessage, or for a
// workflow from before changeSignalHandling innermostMessage.
func errorMessage(err error, withContext bool) string {
	if withContext {
		return rootMessage(err)
	}
	return innermostMessage(err)
}

// innermostMessage is the innermost error's message (an ApplicationError's
// own, without the "(type: …, retryable: …)" its Error adds). It drops the
// context of a wrapped error ("not a directory" for a sink path that is
// not one): rootMessage replaces it.
func innermostMessage(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			break
		}
		err = next
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) && app.Message() != "" {
		return app.Message()
	}
	return err.Error()
}

// rootMessage is what actually went wrong: the innermost message that is
// more than its cause's message with context in front. Down a chain of
// wraps that only add a prefix ("open sink for tablet t-0001: mkdir
// /data/out: not a directory" → … → "not a directory") it keeps the
// outermost, which names the path or the tablet; where a message says
// something its cause does not ("sink: access denied" over "password
// authentication failed …"), it goes on to the cause. The SDK's wrappers
// (an activity's or child workflow's error) do not count, and errors
// count by their own message, without the "(type: …, retryable: …)"
// their Error adds.
func rootMessage(err error) string {
	var msgs []string
	for ; err != nil; err = errors.Unwrap(err) {
		var msg string
		switch e := err.(type) {
		case *temporal.ActivityError, *temporal.ChildWorkflowExecutionError:
			continue
		case *temporal.ApplicationError:
			msg = e.Message()
		case *temporal.TimeoutError:
			msg = e.Message()
		case *temporal.CanceledError:
			msg = "canceled"
		}
		if msg == "" {
			msg = err.Error()
		}
		msgs = append(msgs, msg)
	}
	if len(msgs) == 0 {
		return ""
	}
	k := len(msgs) - 1
	for k > 0 && strings.HasSuffix(msgs[k-1], msgs[k]) {
		k--
	}
	return msgs[k]
}
