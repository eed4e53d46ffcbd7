package workflows

import (
	"errors"
	"fmt"
	"strings"

	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/source"
)

// The tablet's decision core: what one GetChanges run's end means for the
// tablet. decide is a pure function of the run's outcome and the
// selection it ran on (no clock, no Temporal calls), table-tested row by
// row in decide_test.go; the workflow only carries its decision out
// (tablet.apply).

// runEnd is how a GetChanges run ended.
type runEnd int

const (
	// runOK: the run returned a result (its time was up, or it stopped at a
	// batch boundary: cancelled, excluded, the worker stopping).
	runOK runEnd = iota
	runFenced
	runSinkUnavailable
	runSinkFailed
	runReplicaUnhealthy
	runRetryElsewhere
	runSplit
	runExpired
	runFatal
	// runRetriesExhausted: plain retryable errors until the retry policy
	// ran out on a replica the topology calls healthy.
	runRetriesExhausted
	// runTransient: any other failure; try again after a backoff.
	runTransient
)

// outcome is a run's end reduced to what the decision needs.
type outcome struct {
	end runEnd
	// checkpoint is the latest one the run committed (its result, or its
	// error's details).
	checkpoint source.Checkpoint
	// reason is the error's classified reason (POSITION_MISMATCH, …) and
	// message what went wrong, in words.
	reason, message string
	// stopped says why an OK run returned (activities.StoppedRunEnded: its
	// time was up); cancelled, that the workflow cancelled it.
	stopped   string
	cancelled bool
	split     *activities.SplitDetails
	// committed: an OK run committed at least once (it read from its
	// replica and wrote to the sink), which ends a tablet's Retrying.
	committed bool
	// replica is the replica the error's details name: where the run
	// failed ("": the details name none).
	replica string
	// records and batches are what a run that failed committed before
	// (its error's details, or a timed-out run's last heartbeat).
	records, batches int64
}

// decision is what the tablet does next.
type decision struct {
	// state, if set, is the tablet's next state, with reason.
	state  State
	reason string
	// exclude, if set, puts the replica on the tablet's own exclude list
	// for autoExcludeTTL with this reason.
	exclude string
	// wait: back off before the next run; resetBackoff: the run made
	// progress, the next failure starts the backoff afresh.
	wait, resetBackoff bool
	// keepReplica: the next run reads the same replica without selecting.
	keepReplica bool
	// byPolicy: the wait follows the stream's retry policy's intervals
	// (the sink's trouble) rather than the tablet's own backoff.
	byPolicy bool
	// failed: the run ended in an error without the tablet's workflow
	// ending; the tablet is Retrying until a run commits again
	// (changeRetryingState).
	failed bool
	// done: the tablet workflow ends (state is terminal).
	done bool
	// report: the tablet reports at once, whatever its pace (the run
	// finished a copy of rows).
	report bool
}

// decide returns what a run's outcome means for a tablet that ran on sel.
// A run that failed and is tried again makes the tablet Retrying, with a
// reason that says what the tablet does about it (the error itself is
// the status's lastError): a tablet that cannot make progress never shows
// Streaming.
func decide(o outcome, sel activities.Selection) decision {
	switch o.end {
	case runOK:
		// A run that simply used up its time on a preferred pick keeps its
		// replica; a cancelled or stopped one, or a fallback pick, selects
		// again so it returns to a better replica once it can.
		keep := !o.cancelled && o.stopped == activities.StoppedRunEnded && !sel.Fallback
		return decision{resetBackoff: true, keepReplica: keep}
	case runFenced:
		// Another writer committed to this tablet's sink: the next run
		// reopens the sink at its stored checkpoint.
		return decision{state: Retrying, reason: "another writer committed to the tablet's sink: the next run reopens it after a backoff",
			wait: true, failed: true}
	case runSinkUnavailable:
		// The sink's trouble, not the replica's: nothing is excluded and
		// the same replica is read again after the backoff.
		// The wait follows the stream's retry policy, as a run's own
		// retries do; its maximumAttempts does not apply: a sink coming
		// back is waited for, never held against a replica.
		return decision{state: Retrying, reason: "sink unavailable: " + o.message, wait: true, keepReplica: true, byPolicy: true, failed: true}
	case runSinkFailed:
		// No replica can help: the sink cannot take this tablet's data.
		return decision{state: Failed, reason: prefixed("sink: ", o.message), done: true}
	case runReplicaUnhealthy:
		// The picker's health filter skips it: select again at once.
		return decision{state: Retrying, reason: "the topology says the replica cannot serve: another is selected", failed: true}
	case runRetryElsewhere:
		// Another replica at once; the last eligible one is never
		// excluded, it is retried with capped backoff.
		why := o.reason
		if why == "" {
			why = "the replica cannot serve the checkpoint"
		}
		if sel.Candidates > 1 {
			return decision{state: Retrying, reason: why + ": the replica is excluded and another is selected", exclude: o.reason, failed: true}
		}
		return decision{state: Retrying, reason: why + " on the tablet's last eligible replica: it is retried with backoff", wait: true, failed: true}
	case runSplit:
		return decision{state: Split, reason: fmt.Sprintf("split into %v at %s", o.split.Children, o.split.Handoff), done: true}
	case runExpired:
		return decision{state: Expired, reason: "the source no longer holds the history this tablet needs: " + o.message, done: true}
	case runFatal:
		return decision{state: Failed, reason: o.message, done: true}
	case runRetriesExhausted:
		// A replica the topology calls healthy failed maximumAttempts
		// times: excluded for a while (unless it is the last one), and the
		// tablet selects again after a backoff.
		d := decision{state: Retrying, reason: "retry.maximumAttempts spent on the tablet's last eligible replica: it is retried with backoff",
			wait: true, failed: true}
		if sel.Candidates > 1 {
			d.exclude = "RETRIES_EXHAUSTED"
			d.reason = "retry.maximumAttempts spent on the replica: it is excluded and another is selected after a backoff"
		}
		return d
	}
	return decision{state: Retrying, reason: "the run failed: it is run again after a backoff", wait: true, failed: true}
}

// beforeRetryingState is d as decide made it before changeRetryingState:
// a failed run that the tablet tries again changed no state (but for the
// sink's trouble, which was Retrying already), and the next run's start
// said Streaming.
func (d decision) beforeRetryingState() decision {
	if d.failed && !d.byPolicy {
		d.state, d.reason = "", ""
	}
	d.failed = false
	return d
}

// runOutcome reads how a GetChanges run ended from its result and error:
// the one place that looks at Temporal's error types.
// withContext picks how an error becomes the message (errorMessage).
func runOutcome(res activities.GetChangesResult, runErr error, cancelled, withContext bool) outcome {
	if runErr == nil || (cancelled && temporal.IsCanceledError(runErr)) {
		return outcome{end: runOK, checkpoint: res.Checkpoint, stopped: res.Stopped, cancelled: cancelled, committed: res.Batches > 0}
	}
	var d activities.ErrorDetails
	details(runErr, &d)
	o := outcome{end: runTransient, checkpoint: d.Checkpoint, reason: d.Reason, message: clip(errorMessage(runErr, withContext)), replica: d.Replica,
		records: d.Records, batches: d.Batches}
	var timeout *temporal.TimeoutError
	if o.records == 0 && o.batches == 0 && errors.As(runErr, &timeout) && timeout.HasLastHeartbeatDetails() {
		// Timed out (its worker died): what its last heartbeat says it
		// committed.
		var hb activities.Heartbeat
		if timeout.LastHeartbeatDetails(&hb) == nil {
			o.records, o.batches = hb.Records, hb.Batches
		}
	}
	var app *temporal.ApplicationError
	if errors.As(runErr, &app) {
		switch app.Type() {
		case activities.ErrFenced:
			o.end = runFenced
		case activities.ErrSinkUnavailable:
			o.end = runSinkUnavailable
		case activities.ErrSinkFailed:
			o.end = runSinkFailed
		case activities.ErrReplicaUnhealthy:
			o.end = runReplicaUnhealthy
		case activities.ErrRetryElsewhere:
			o.end = runRetryElsewhere
		case activities.ErrTabletSplit:
			if d.Split != nil {
				o.end, o.split = runSplit, d.Split
			}
		case activities.ErrStreamExpired:
			o.end = runExpired
		case activities.ErrFatal:
			o.end = runFatal
		}
	}
	if o.end == runTransient && retriesExhausted(runErr) {
		o.end = runRetriesExhausted
	}
	return o
}

// prefixed puts p before msg unless msg already begins with it (a sink
// error's own message says "sink: …").
func prefixed(p, msg string) string {
	if strings.HasPrefix(msg, p) {
		return msg
	}
	return p + msg
}
