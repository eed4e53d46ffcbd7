package workflows

import (
	"fmt"
	"slices"
	"time"

	"github.com/tabletflow/tabletflow/config"
)

// Operator commands: each is a signal (fire and forget) and an update of
// the same name with a validator; configure is an update only. Payloads are
// decoded strictly.
const (
	CmdExclude   = "exclude"
	CmdInclude   = "include"
	CmdPause     = "pause"
	CmdResume    = "resume"
	CmdRetry     = "retry"
	CmdStop      = "stop"
	CmdConfigure = "configure"
	CmdResync    = "resync"
	// CmdRecheck is a stream-to-tablet command only: an exclusion ended,
	// try selecting a replica again now.
	CmdRecheck = "recheck"
)

// SignalCommands are the operator signals a stream listens to.
var SignalCommands = []string{CmdExclude, CmdInclude, CmdPause, CmdResume, CmdRetry, CmdStop, CmdResync, CmdSnapshot, CmdSnapshotCancel}

// ExcludeRequest excludes replicas by alias: on one tablet, or on every
// tablet when Tablet is empty; for TTL, or until included again.
type ExcludeRequest struct {
	Aliases []string        `json:"aliases"`
	Tablet  string          `json:"tablet,omitempty"`
	Reason  string          `json:"reason,omitempty"`
	TTL     config.Duration `json:"ttl,omitempty"`
}

// IncludeRequest lifts operator and automatic exclusions of the aliases.
type IncludeRequest struct {
	Aliases []string `json:"aliases"`
}

// TabletsRequest names tablets for pause, resume and retry; empty means
// all.
type TabletsRequest struct {
	Tablets []string `json:"tablets,omitempty"`
}

// StopRequest ends the stream after a final commit on every tablet.
type StopRequest struct {
	DropSourceStream bool `json:"dropSourceStream,omitempty"`
}

// SignalTabletCommand: the stream tells one tablet what an operator asked.
const SignalTabletCommand = "tablet-command"

// TabletCommand is the SignalTabletCommand payload.
type TabletCommand struct {
	// Kind is pause, resume, stop, include (lift Aliases), recheck (an
	// exclusion ended: try selecting again now) or configure.
	Kind     string           `json:"kind"`
	Aliases  []string         `json:"aliases,omitempty"`
	Tunables *config.Tunables `json:"tunables,omitempty"`
}

// Stopped is the state of a tablet the operator stopped (final commit
// done).
const Stopped State = "Stopped"

// validateAliases checks an alias list against the replicas the stream
// knows.
func validateAliases(aliases, known []string) error {
	if len(aliases) == 0 {
		return fmt.Errorf("aliases: must not be empty")
	}
	for i, a := range aliases {
		if !config.ValidAlias(a) {
			return fmt.Errorf("aliases[%d]: %q: want <cell>-<name>", i, a)
		}
		if !slices.Contains(known, a) {
			return fmt.Errorf("aliases[%d]: %q is not a replica of this stream's tablets (known: %v)", i, a, known)
		}
	}
	return nil
}

// validateTablets checks tablet IDs against the stream's tablets.
func validateTablets(ids []string, known map[string]*TabletStatus) error {
	for i, id := range ids {
		if known[id] == nil {
			return fmt.Errorf("tablets[%d]: unknown tablet %q", i, id)
		}
	}
	return nil
}

// retentionLeft is what remains of the retention for a tablet paused at
// pausedAt.
func retentionLeft(retention time.Duration, pausedAt, now time.Time) time.Duration {
	return max(0, retention-now.Sub(pausedAt))
}
