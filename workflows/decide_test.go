package workflows

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
)

func TestDecideWhatARunsEndMeansForTheTablet(t *testing.T) {
	three := activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 3}
	last := activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 1}
	fallback := activities.Selection{Replica: replica("t-0001", "zone2-0000000201"), Candidates: 2, Fallback: true}
	split := &activities.SplitDetails{Children: []string{"t-0002", "t-0003"}, Handoff: cp(40)}
	tests := []struct {
		name string
		o    outcome
		sel  activities.Selection
		want decision
	}{
		// A run that used up its time keeps its replica: no selection
		// between normal runs.
		{"run ended", outcome{end: runOK, stopped: activities.StoppedRunEnded}, three,
			decision{resetBackoff: true, keepReplica: true}},
		// A fallback pick selects again after each run, to return to the
		// preferred replica once it recovers.
		{"run ended on a fallback", outcome{end: runOK, stopped: activities.StoppedRunEnded}, fallback,
			decision{resetBackoff: true}},
		// Cancelled by the workflow (pause, stop): select again next time.
		{"cancelled", outcome{end: runOK, cancelled: true, stopped: "cancelled"}, three,
			decision{resetBackoff: true}},
		// Stopped because the operator excluded the replica.
		{"replica excluded", outcome{end: runOK, stopped: "replica excluded: maintenance"}, three,
			decision{resetBackoff: true}},
		// Another writer committed: back off, reopen the sink; Retrying
		// meanwhile.
		{"fenced", outcome{end: runFenced}, three, decision{state: Retrying,
			reason: "another writer committed to the tablet's sink: the next run reopens it after a backoff", wait: true, failed: true}},
		// The sink's trouble is never the replica's: same replica, no
		// exclusion, a backoff by the stream's retry policy.
		{"sink unavailable", outcome{end: runSinkUnavailable, message: "tablet is locked"}, three,
			decision{state: Retrying, reason: "sink unavailable: tablet is locked", wait: true, keepReplica: true, byPolicy: true, failed: true}},
		// A sink that cannot take the data fails the tablet whatever the
		// replica: a poison record does not walk the replicas.
		{"sink failed", outcome{end: runSinkFailed, message: "jsonl: bad record"}, three,
			decision{state: Failed, reason: "sink: jsonl: bad record", done: true}},
		// The topology says the replica is down: re-select at once, no
		// exclusion (the picker's health filter skips it).
		{"replica unhealthy", outcome{end: runReplicaUnhealthy}, three,
			decision{state: Retrying, reason: "the topology says the replica cannot serve: another is selected", failed: true}},
		// POSITION_MISMATCH: exclude it, another replica at once.
		{"retry elsewhere", outcome{end: runRetryElsewhere, reason: "POSITION_MISMATCH"}, three,
			decision{state: Retrying, reason: "POSITION_MISMATCH: the replica is excluded and another is selected", exclude: "POSITION_MISMATCH", failed: true}},
		// ...unless it is the last eligible one: never excluded, backoff,
		// and Retrying, never Streaming, while it cannot serve.
		{"retry elsewhere on the last replica", outcome{end: runRetryElsewhere, reason: "POSITION_MISMATCH"}, last,
			decision{state: Retrying, reason: "POSITION_MISMATCH on the tablet's last eligible replica: it is retried with backoff", wait: true, failed: true}},
		{"split", outcome{end: runSplit, split: split}, three,
			decision{state: Split, reason: "split into [t-0002 t-0003] at 1.40", done: true}},
		{"expired", outcome{end: runExpired, message: "history gone"}, three,
			decision{state: Expired, reason: "the source no longer holds the history this tablet needs: history gone", done: true}},
		{"fatal", outcome{end: runFatal, message: "permission denied"}, three,
			decision{state: Failed, reason: "permission denied", done: true}},
		// A healthy-looking replica that failed maximumAttempts times is
		// excluded for a while; the tablet selects again after a backoff.
		{"retries exhausted", outcome{end: runRetriesExhausted}, three,
			decision{state: Retrying, reason: "retry.maximumAttempts spent on the replica: it is excluded and another is selected after a backoff",
				exclude: "RETRIES_EXHAUSTED", wait: true, failed: true}},
		{"retries exhausted on the last replica", outcome{end: runRetriesExhausted}, last,
			decision{state: Retrying, reason: "retry.maximumAttempts spent on the tablet's last eligible replica: it is retried with backoff", wait: true, failed: true}},
		// Anything else: back off and run again.
		{"transient", outcome{end: runTransient}, three,
			decision{state: Retrying, reason: "the run failed: it is run again after a backoff", wait: true, failed: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, decide(tt.o, tt.sel))
		})
	}
}

// A tablet from before changeRetryingState carries out the decisions it
// was recorded with: a failed run that is tried again changes no state,
// but for the sink's trouble.
func TestDecisionsBeforeRetryingStateAreTheOldOnes(t *testing.T) {
	three := activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 3}
	last := activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 1}
	tests := []struct {
		name string
		o    outcome
		sel  activities.Selection
		want decision
	}{
		{"fenced", outcome{end: runFenced}, three, decision{wait: true}},
		{"sink unavailable", outcome{end: runSinkUnavailable, message: "tablet is locked"}, three,
			decision{state: Retrying, reason: "sink unavailable: tablet is locked", wait: true, keepReplica: true, byPolicy: true}},
		{"replica unhealthy", outcome{end: runReplicaUnhealthy}, three, decision{}},
		{"retry elsewhere", outcome{end: runRetryElsewhere, reason: "POSITION_MISMATCH"}, three, decision{exclude: "POSITION_MISMATCH"}},
		{"retry elsewhere on the last replica", outcome{end: runRetryElsewhere, reason: "POSITION_MISMATCH"}, last, decision{wait: true}},
		{"retries exhausted", outcome{end: runRetriesExhausted}, three, decision{exclude: "RETRIES_EXHAUSTED", wait: true}},
		{"retries exhausted on the last replica", outcome{end: runRetriesExhausted}, last, decision{wait: true}},
		{"transient", outcome{end: runTransient}, three, decision{wait: true}},
		{"run ended", outcome{end: runOK, stopped: activities.StoppedRunEnded}, three, decision{resetBackoff: true, keepReplica: true}},
		{"fatal", outcome{end: runFatal, message: "permission denied"}, three, decision{state: Failed, reason: "permission denied", done: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, decide(tt.o, tt.sel).beforeRetryingState())
		})
	}
}

func TestRunOutcomeReadsTheActivitysTypedErrors(t *testing.T) {
	typed := func(typ string, d activities.ErrorDetails) error {
		return temporal.NewNonRetryableApplicationError("boom", typ, errors.New("boom"), d)
	}
	split := &activities.SplitDetails{Children: []string{"t-0002"}, Handoff: cp(40)}
	tests := []struct {
		name      string
		err       error
		cancelled bool
		want      runEnd
	}{
		{"success", nil, false, runOK},
		// A run the workflow cancelled returns at a batch boundary.
		{"cancelled", temporal.NewCanceledError(), true, runOK},
		{"fenced", typed(activities.ErrFenced, activities.ErrorDetails{}), false, runFenced},
		{"sink unavailable", typed(activities.ErrSinkUnavailable, activities.ErrorDetails{}), false, runSinkUnavailable},
		{"sink failed", typed(activities.ErrSinkFailed, activities.ErrorDetails{}), false, runSinkFailed},
		{"unhealthy", typed(activities.ErrReplicaUnhealthy, activities.ErrorDetails{}), false, runReplicaUnhealthy},
		{"elsewhere", typed(activities.ErrRetryElsewhere, activities.ErrorDetails{Reason: "POSITION_MISMATCH"}), false, runRetryElsewhere},
		{"split", typed(activities.ErrTabletSplit, activities.ErrorDetails{Split: split}), false, runSplit},
		// A split without its details cannot be handed off: retried.
		{"split without details", typed(activities.ErrTabletSplit, activities.ErrorDetails{}), false, runTransient},
		{"expired", typed(activities.ErrStreamExpired, activities.ErrorDetails{}), false, runExpired},
		{"fatal", typed(activities.ErrFatal, activities.ErrorDetails{}), false, runFatal},
		// (runRetriesExhausted needs an ActivityError with its retry state,
		// which only the SDK makes: the e2e tests cover it.)
		{"plain", errors.New("UNAVAILABLE"), false, runTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, runOutcome(activities.GetChangesResult{}, tt.err, tt.cancelled, true).end)
		})
	}
}

// A reason shows what went wrong, without the SDK's "(type: …,
// retryable: …)" decoration of an activity's error.
func TestRootMessageIsTheInnermostMessageWithoutDecoration(t *testing.T) {
	inner := temporal.NewApplicationError("password authentication failed for user \"tabletflow\"", "wrapErrors")
	outer := temporal.NewNonRetryableApplicationError("sink: access denied", "SinkFailed", inner)
	require.Equal(t, `password authentication failed for user "tabletflow"`, rootMessage(outer))
	require.Equal(t, "plain", rootMessage(errors.New("plain")))
}

// A reason keeps an error's context: the outermost of a chain of wraps
// that only add a prefix, a timeout by its own message.
func TestRootMessageKeepsTheContextOfPrefixWraps(t *testing.T) {
	pathErr := fmt.Errorf("open sink for tablet t-0001: %w", &os.PathError{Op: "mkdir", Path: "/data/out", Err: syscall.ENOTDIR})
	require.Equal(t, "open sink for tablet t-0001: mkdir /data/out: not a directory", rootMessage(pathErr))
	require.Equal(t, "not a directory", innermostMessage(pathErr), "what runs from before the change still show")
	require.Equal(t, "heartbeat timeout", rootMessage(temporal.NewHeartbeatTimeoutError()))
	require.Equal(t, rootMessage(pathErr), errorMessage(pathErr, true))
	require.Equal(t, innermostMessage(pathErr), errorMessage(pathErr, false))
}

// A run on a fallback replica reads at most activities.FallbackRun, so the
// next pick brings the tablet back to its preferred replica that soon;
// any other run reads run.duration.
func TestARunOnAFallbackReplicaIsBoundedByFallbackRun(t *testing.T) {
	five := config.Duration(5 * time.Minute)
	short := config.Duration(20 * time.Second)
	for _, tt := range []struct {
		name string
		d    config.Duration
		sel  activities.Selection
		want config.Duration
	}{
		{"preferred", five, activities.Selection{}, five},
		{"fallback", five, activities.Selection{Fallback: true}, config.Duration(activities.FallbackRun)},
		{"fallback, run.duration shorter", short, activities.Selection{Fallback: true}, short},
	} {
		require.Equal(t, tt.want, runFor(tt.d, tt.sel), tt.name)
	}
}
