package source

// Action is what to do after an error, decided by an adapter's Classify.
type Action int

// Actions, from least to most drastic.
const (
	// RetrySame: a transient error; retry on the same replica with backoff.
	RetrySame Action = iota + 1
	// RetryElsewhere: this replica cannot serve the request (it lost the
	// history, as Vitess's GTIDSet Mismatch); exclude it and pick another.
	RetryElsewhere
	// Split: the tablet split; continue with Children from Handoff.
	Split
	// Expired: the history the stream needs is gone on this tablet.
	Expired
	// Fatal: retrying cannot help (auth, permission, a bad request).
	Fatal
)

var actionNames = map[Action]string{
	RetrySame:      "RetrySame",
	RetryElsewhere: "RetryElsewhere",
	Split:          "Split",
	Expired:        "Expired",
	Fatal:          "Fatal",
}

// String returns the action's name.
func (a Action) String() string {
	if n, ok := actionNames[a]; ok {
		return n
	}
	return "Unknown"
}

// Classification is an error's action and what goes with it.
type Classification struct {
	Action Action
	// Reason is a short machine-readable cause ("POSITION_MISMATCH",
	// "UNAVAILABLE"), for exclude-list entries, metrics and status.
	Reason string
	// For Split: the children and the checkpoint they continue from.
	Children []string
	Handoff  Checkpoint
}
