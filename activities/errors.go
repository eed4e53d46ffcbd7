package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// ApplicationError types GetChanges and SelectReplica return for the
// workflow to decide on. Retry-same errors of the source are plain
// retryable errors; a sink error never is (classifySink).
const (
	ErrRetryElsewhere    = "RetryElsewhere"
	ErrReplicaUnhealthy  = "ReplicaUnhealthy"
	ErrTabletSplit       = "TabletSplit"
	ErrStreamExpired     = "StreamExpired"
	ErrFatal             = "Fatal"
	ErrFenced            = "Fenced"
	ErrNoEligibleReplica = "NoEligibleReplica"
	// ErrSinkUnavailable: the sink cannot take writes right now (its lock
	// is held, it is unreachable). Never counted against the replica: the
	// tablet waits with backoff and runs again on the same replica.
	ErrSinkUnavailable = "SinkUnavailable"
	// ErrSinkFailed: the sink cannot take this tablet's data at all (a
	// corrupt sink, a record it cannot write): the tablet goes Failed with
	// the reason, whatever replica it reads.
	ErrSinkFailed = "SinkFailed"
)

// ErrRetrySame is the type of GetChanges' retryable errors (a source's
// retry-same ones): the activity's retry policy retries them on the same
// replica. They are typed only for their details, which name the replica
// (the run may have moved in place since its start), so that the replica
// is charged when the retries run out. Not in NonRetryable.
const ErrRetrySame = "RetrySame"

// retrySame is err as a retryable ErrRetrySame error with details d.
func retrySame(err error, d ErrorDetails) error {
	return temporal.NewApplicationErrorWithOptions(err.Error(), ErrRetrySame, temporal.ApplicationErrorOptions{Cause: err, Details: []any{d}})
}

// NonRetryable lists the types above, for activity retry policies.
var NonRetryable = []string{ErrRetryElsewhere, ErrReplicaUnhealthy, ErrTabletSplit, ErrStreamExpired, ErrFatal, ErrFenced, ErrNoEligibleReplica, ErrSinkUnavailable, ErrSinkFailed}

// SplitDetails ride on a TabletSplit error.
type SplitDetails struct {
	Children []string          `json:"children"`
	Handoff  source.Checkpoint `json:"handoff"`
}

// ErrorDetails ride on every typed error: what the workflow records.
type ErrorDetails struct {
	Reason     string            `json:"reason"`
	Replica    string            `json:"replica,omitempty"`
	Checkpoint source.Checkpoint `json:"checkpoint"`
	Split      *SplitDetails     `json:"split,omitempty"`
	// Records and Batches are what the run committed before it failed
	// (its earlier attempts' included), which the tablet counts as it
	// counts a run's result.
	Records int64 `json:"records,omitempty"`
	Batches int64 `json:"batches,omitempty"`
}

// typed returns the error the workflow sees for a classified source error:
// a plain retryable error for RetrySame, otherwise a non-retryable
// ApplicationError whose type names the action.
func typed(c source.Classification, err error, replica string, cp source.Checkpoint) error {
	d := ErrorDetails{Reason: c.Reason, Replica: replica, Checkpoint: cp}
	var typ string
	switch c.Action {
	case source.RetrySame:
		return err
	case source.RetryElsewhere:
		typ = ErrRetryElsewhere
	case source.Split:
		typ = ErrTabletSplit
		d.Split = &SplitDetails{Children: c.Children, Handoff: c.Handoff}
	case source.Expired:
		typ = ErrStreamExpired
	default:
		typ = ErrFatal
	}
	return nonRetryable(typ, err, d)
}

func nonRetryable(typ string, err error, d ErrorDetails) error {
	return temporal.NewNonRetryableApplicationError(err.Error(), typ, err, d)
}

// unhealthy is the ReplicaUnhealthy error: the topology says the replica
// is down, not serving or unhealthy; the tablet re-selects at once.
func unhealthy(alias, why string, cp source.Checkpoint) error {
	err := fmt.Errorf("replica %s is %s", alias, why)
	return nonRetryable(ErrReplicaUnhealthy, err, ErrorDetails{Reason: "REPLICA_" + strings.ToUpper(strings.ReplaceAll(why, " ", "_")), Replica: alias, Checkpoint: cp})
}

// sinkClass is what a sink error means for the tablet: the type of the
// ApplicationError GetChanges returns, and its reason.
type sinkClass struct {
	Type   string // ErrFenced, ErrSinkUnavailable or ErrSinkFailed
	Reason string
}

// classifySink maps an error from a sink (building it, Open, Write,
// Commit) to what the workflow must do. A sink error is never the
// replica's fault, so it is never a plain retryable error (which the
// activity's RetryPolicy counts against the replica). It reads only the
// sink package's sentinels, which adapters' errors wrap, never a message:
//
//	sink.ErrFenced                    → Fenced           FENCED
//	sink.ErrCorrupt                   → SinkFailed       SINK_CORRUPT
//	sink.ErrBadRecord                 → SinkFailed       SINK_BAD_RECORD
//	sink.ErrBadTablet                 → SinkFailed       SINK_BAD_TABLET
//	sink.ErrBadCommit                 → SinkFailed       SINK_BAD_COMMIT
//	sink.ErrLocked                    → SinkUnavailable  SINK_LOCKED
//	sink.ErrClosed                    → SinkUnavailable  SINK_CLOSED
//	context.DeadlineExceeded          → SinkUnavailable  SINK_TIMEOUT
//	context.Canceled                  → SinkUnavailable  SINK_CANCELLED
//	anything else (I/O, disk full)    → SinkUnavailable  SINK_IO
//
// Fenced wins over the rest (a fenced commit may also fail to clean up),
// and SinkFailed over SinkUnavailable: a corrupt sink stays corrupt.
func classifySink(err error) sinkClass {
	for _, c := range []struct {
		target error
		class  sinkClass
	}{
		{sink.ErrFenced, sinkClass{ErrFenced, "FENCED"}},
		{sink.ErrCorrupt, sinkClass{ErrSinkFailed, "SINK_CORRUPT"}},
		{sink.ErrBadRecord, sinkClass{ErrSinkFailed, "SINK_BAD_RECORD"}},
		{sink.ErrBadTablet, sinkClass{ErrSinkFailed, "SINK_BAD_TABLET"}},
		{sink.ErrBadCommit, sinkClass{ErrSinkFailed, "SINK_BAD_COMMIT"}},
		{sink.ErrDenied, sinkClass{ErrSinkFailed, "SINK_DENIED"}},
		{sink.ErrLocked, sinkClass{ErrSinkUnavailable, "SINK_LOCKED"}},
		{sink.ErrClosed, sinkClass{ErrSinkUnavailable, "SINK_CLOSED"}},
		{context.DeadlineExceeded, sinkClass{ErrSinkUnavailable, "SINK_TIMEOUT"}},
		{context.Canceled, sinkClass{ErrSinkUnavailable, "SINK_CANCELLED"}},
	} {
		if errors.Is(err, c.target) {
			return c.class
		}
	}
	return sinkClass{ErrSinkUnavailable, "SINK_IO"}
}

// sinkError is the error GetChanges returns for a sink error: typed by
// classifySink, carrying the replica and the latest committed checkpoint.
func sinkError(err error, replica string, cp source.Checkpoint) error {
	c := classifySink(err)
	return nonRetryable(c.Type, err, ErrorDetails{Reason: c.Reason, Replica: replica, Checkpoint: cp})
}

// sinkBehind is the SinkFailed error for a sink whose stored checkpoint is
// behind one that was committed to it (the workflow's, or an earlier
// attempt's): records between the two are gone from the sink, and reading
// on from either point would hide that.
func sinkBehind(stored, committed source.Checkpoint, replica string) error {
	err := fmt.Errorf("sink checkpoint %s is behind the workflow's %s: data lost from the sink?", orNone(stored), orNone(committed))
	return nonRetryable(ErrSinkFailed, err, ErrorDetails{Reason: "SINK_BEHIND", Replica: replica, Checkpoint: committed})
}

// orNone formats a checkpoint, "none" for the zero one.
func orNone(cp source.Checkpoint) string {
	if cp.IsZero() {
		return "none"
	}
	return cp.String()
}

// fatalf is a non-retryable Fatal error.
func fatalf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return temporal.NewNonRetryableApplicationError(msg, ErrFatal, errors.New(msg), ErrorDetails{Reason: "CONFIG"})
}
