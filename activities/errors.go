package activities

import (
	"errors"
	"fmt"
	"strings"

	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/source"
)

// ApplicationError types GetChanges and SelectReplica return for the
// workflow to decide on. Retry-same errors are plain retryable errors.
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

// fatalf is a non-retryable Fatal error.
func fatalf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return temporal.NewNonRetryableApplicationError(msg, ErrFatal, errors.New(msg), ErrorDetails{Reason: "CONFIG"})
}
