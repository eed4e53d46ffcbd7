// Package workflows holds tabletflow's Temporal workflows: StreamWorkflow,
// one per stream, and TabletWorkflow, one child per tablet. Workflow code
// is deterministic: only workflow APIs for time, sleep, randomness and
// concurrency.
package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// Names shared with the worker, the starter and the Temporal CLI.
const (
	TaskQueue = "tabletflow"
	// SignalTabletReport: a TabletWorkflow reports its status to its stream.
	SignalTabletReport = "tablet-report"
	// QueryStatus returns a StreamStatus (or, on a TabletWorkflow, its
	// TabletStatus).
	QueryStatus = "status"
)

// State is a tablet's state. A tablet never dies silently: its status says
// which state it is in and why.
type State string

// Tablet states.
const (
	Starting          State = "Starting"
	Streaming         State = "Streaming"
	Retrying          State = "Retrying"
	NoEligibleReplica State = "NoEligibleReplica"
	Paused            State = "Paused"
	Split             State = "Split"
	Expired           State = "Expired"
	Failed            State = "Failed"
	// Stuck: the tablet's workflow runs but its workflow task keeps
	// failing (a panic, a non-determinism after an upgrade); set by the
	// stream (changeStuckState), which the tablet cannot tell itself.
	Stuck State = "Stuck"
)

// Search attributes (Keyword), kept current so the Web UI can list, say,
// every tablet of a stream that is not streaming.
var (
	SAStream  = temporal.NewSearchAttributeKeyKeyword("TabletflowStream")
	SATablet  = temporal.NewSearchAttributeKeyKeyword("TabletflowTablet")
	SAState   = temporal.NewSearchAttributeKeyKeyword("TabletflowState")
	SAReplica = temporal.NewSearchAttributeKeyKeyword("TabletflowReplica")
)

// SearchAttributes are the names the worker checks for at start.
var SearchAttributes = []string{"TabletflowStream", "TabletflowTablet", "TabletflowState", "TabletflowReplica"}

// TabletStatus is one tablet as its workflow reports it: a row of the
// stream's status.
type TabletStatus struct {
	ID         string            `json:"id"`
	State      State             `json:"state"`
	Reason     string            `json:"reason,omitempty"`
	Replica    string            `json:"replica"`
	Checkpoint source.Checkpoint `json:"checkpoint"`
	Records    int64             `json:"records"`
	Batches    int64             `json:"batches"`
	// Attempt is the current GetChanges attempt on the replica.
	Attempt    int32   `json:"attempt"`
	LastError  string  `json:"lastError"`
	LagSeconds float64 `json:"lagSeconds"`
	// Slot: on a PostgreSQL source, the replica's slot at the last run's
	// end — the WAL it holds past the checkpoint (lagBytes) and what may
	// still be written before it is invalidated (safeWALBytes, -1: no
	// limit).
	Slot *source.SlotStats `json:"slot,omitempty"`
	// RetentionLeft counts down while the tablet does not advance (Paused).
	RetentionLeft string             `json:"retentionLeft"`
	Excluded      config.ExcludeList `json:"excluded"`
	// PausedAt is when a Paused tablet stopped advancing.
	PausedAt time.Time `json:"pausedAt,omitzero"`
	// For a Split tablet: its children and their starting checkpoint.
	Children []string          `json:"children,omitempty"`
	Handoff  source.Checkpoint `json:"handoff,omitzero"`
	// Start is where the tablet started: a split's hand-off, or empty for
	// the stream's start position.
	Start source.Checkpoint `json:"start,omitzero"`
	// Restarts counts how often the stream restarted this tablet's
	// workflow after it closed without a terminal report (terminated,
	// reset, timed out, failed).
	Restarts int       `json:"restarts,omitempty"`
	Updated  time.Time `json:"updated"`
	// Seq numbers the tablet's reports (across its runs and restarts):
	// reports are not awaited, so two sent in one workflow task can arrive
	// in either order, and the stream keeps only the newest.
	Seq int64 `json:"seq,omitempty"`
	// Resyncs counts the tablet's resyncs (ResyncRequest); its Start is
	// the last one's.
	Resyncs int `json:"resyncs,omitempty"`
	// Copy is the tablet's copy of rows (a stream's start, a resync, an
	// ad-hoc snapshot) as its last run that reported one saw it.
	Copy *source.CopyProgress `json:"copy,omitempty"`
	// Live is set in a status query's answer (not in reports) when the
	// tablet's pending GetChanges run is past the figures it last
	// reported: Checkpoint, Records, Batches and LagSeconds are then the
	// run's as of its last heartbeat (docs/operating.md#live-status).
	Live *LiveRow `json:"live,omitempty"`
}

// LiveRow says how a status row's live figures were read.
type LiveRow struct {
	// At is when the server got the heartbeat they come from.
	At time.Time `json:"at"`
	// Records and Batches are the pending run's, counted in the row's.
	Records int64 `json:"records"`
	Batches int64 `json:"batches"`
	// RecordsPerSecond is the tablet's rate between the stream's last two
	// reads of the live figures (none before the second).
	RecordsPerSecond float64 `json:"recordsPerSecond,omitempty"`
}

// StreamStatus is the `status` query's result.
type StreamStatus struct {
	Stream   string             `json:"stream"`
	Tablets  []TabletStatus     `json:"tablets"`
	Exclude  config.ExcludeList `json:"exclude"`
	Rejected []Rejected         `json:"rejected"`
	// Topology is set while the source's topology cannot be read.
	Topology *TopologyTrouble `json:"topology,omitempty"`
	// Checks is set while the stream cannot check its tablet workflows
	// (CheckTablets): a tablet that closes meanwhile is not restarted.
	Checks *TopologyTrouble `json:"checks,omitempty"`
	// Snapshot is the stream's last ad-hoc snapshot, if any.
	Snapshot *Snapshot `json:"snapshot,omitempty"`
	// TablesChange is the last change of the tables the stream reads
	// (configure's source.tables), if any.
	TablesChange *TablesChange `json:"tablesChange,omitempty"`
	// Live is the stream's totals as of its last read of the live
	// figures (none before the first).
	Live *LiveTotals `json:"live,omitempty"`
}

// TopologyTrouble says why and since when the stream cannot list its
// tablets; the stream keeps taking commands meanwhile.
type TopologyTrouble struct {
	Error string    `json:"error"`
	Since time.Time `json:"since"`
}

// Rejected is a signal payload the stream refused, shown in its status.
type Rejected struct {
	Signal string    `json:"signal"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// StreamState is everything a StreamWorkflow carries across
// continue-as-new; nil on a first start.
type StreamState struct {
	// SourceStream: the source-side stream has been ensured.
	SourceStream bool                     `json:"sourceStream"`
	Tablets      map[string]*TabletStatus `json:"tablets"`
	Exclude      config.ExcludeList       `json:"exclude"`
	Rejected     []Rejected               `json:"rejected"`
	// Aliases are the replicas the stream knows (from its last listing).
	Aliases []string `json:"aliases"`
	// Retention is the source's retention for the stream.
	Retention time.Duration `json:"retention"`
	// Tunables is the operator's last configure, if any.
	Tunables *config.Tunables `json:"tunables,omitempty"`
	// Stop is set once the operator asked the stream to stop.
	Stop *StopRequest `json:"stop,omitempty"`
	// Topology is set while the topology cannot be read; Checks while
	// the tablet workflows cannot be checked.
	Topology *TopologyTrouble `json:"topology,omitempty"`
	Checks   *TopologyTrouble `json:"checks,omitempty"`
	// Paused are the tablets the operator paused and has not resumed,
	// sorted; Intents says they are carried (a state from before has
	// them derived from the rows that say Paused). With Stop, what the
	// operator asked of each tablet (changeOperatorIntents).
	Paused  []string `json:"paused,omitempty"`
	Intents bool     `json:"intents,omitempty"`
	// Retried are the tablets the operator retried while their previous
	// workflow had not closed yet: each new workflow starts once the old
	// one has closed (changeRetryAfterClose).
	Retried []string `json:"retried,omitempty"`
	// Resyncs are the resyncs whose fresh start is being made.
	Resyncs []PendingResync `json:"resyncs,omitempty"`
	// ResyncSeq numbers the resyncs the stream asked for: each request
	// gets an id of its own at the source.
	ResyncSeq int `json:"resyncSeq,omitempty"`
	// Snapshot is the last ad-hoc snapshot; SnapshotSeq numbers them.
	Snapshot    *Snapshot `json:"snapshot,omitempty"`
	SnapshotSeq int       `json:"snapshotSeq,omitempty"`
	// TablesChange is the last change of the tables the stream reads;
	// TablesSeq numbers them.
	TablesChange *TablesChange `json:"tablesChange,omitempty"`
	TablesSeq    int           `json:"tablesSeq,omitempty"`
}

// TabletInput starts a TabletWorkflow. It carries what the tablet needs,
// not the whole stream config: see tabletConfig.
type TabletInput struct {
	Stream string `json:"stream"`
	Tablet string `json:"tablet"`
	// Config is the stream config as far as the tablet uses it: its
	// source and sink sections (by kind only when Sections names them),
	// its tunables and its reportRate.
	Config config.Stream `json:"config"`
	// Sections, when set, names the stream's config, whose source and
	// sink sections the tablet's activities read from the stream
	// (activities.ConfigRef): a stream's large sections do not ride in
	// every tablet's input.
	Sections *activities.ConfigRef `json:"sections,omitempty"`
	// Start is where the tablet starts: a split's hand-off checkpoint, or
	// zero for the stream's start position.
	Start source.Checkpoint `json:"start"`
	// Tablets is how many tablets the stream has, to pace counter reports.
	Tablets int `json:"tablets"`
	// Retention is the source's retention: how long the tablet may be
	// paused before its history expires (0: unknown).
	Retention time.Duration `json:"retention"`
	// Exclude is the stream's operator exclude list when the tablet was
	// started, the entries that apply to the tablet: its first selection
	// uses it instead of querying the stream (which is busy starting
	// every tablet); later ones read the live list.
	Exclude config.ExcludeList `json:"exclude,omitempty"`
	// First is the replica the stream picked for the tablet's first run
	// (changeFirstPicks); nil: the tablet selects one itself.
	First *activities.Selection `json:"first,omitempty"`
	// Resync: Start is a resync's; the sink may hold anything below it.
	Resync bool `json:"resync,omitempty"`
}

// TabletState is everything a TabletWorkflow carries across
// continue-as-new; nil on a first start.
type TabletState struct {
	Status     TabletStatus      `json:"status"`
	Checkpoint source.Checkpoint `json:"checkpoint"`
	// Exclude is the tablet's own automatic exclude list.
	Exclude    config.ExcludeList `json:"exclude"`
	LastReport time.Time          `json:"lastReport"`
	// Selected is set once the tablet has selected a replica.
	Selected bool `json:"selected,omitempty"`
	// The operator's intents, carried across continue-as-new so a command
	// drained just before it is never lost: Pause holds the tablet at its
	// checkpoint until resumed; Stop ends it after a final commit.
	Pause bool `json:"pause,omitempty"`
	Stop  bool `json:"stop,omitempty"`
	// Intents says Pause and Stop are carried; a state from before they
	// were (a worker upgrade) has the pause derived from its status.
	Intents bool `json:"intents,omitempty"`
	// Resend: a report was lost (not because the stream is gone); the
	// next run sends the status at its start.
	Resend bool `json:"resend,omitempty"`
	// Failing counts the GetChanges attempts that failed since the
	// tablet's last commit (changeRetryingState): while it is above 0 the
	// tablet is Retrying, and a new run's attempt counts on from it.
	Failing int32 `json:"failing,omitempty"`
}

// TabletWorkflowID is a tablet's workflow ID.
func TabletWorkflowID(stream, tablet string) string { return stream + "/tablet/" + tablet }
