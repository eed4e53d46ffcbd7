// Package source defines how tabletflow reads changes from a tablet-sharded
// database: the Source interface, the values it returns, and the actions an
// error can lead to. Adapters live in sub-packages (source/tabletd).
package source

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Errors shared by every adapter.
var (
	// ErrBadCheckpoint: a checkpoint string could not be parsed.
	ErrBadCheckpoint = errors.New("bad checkpoint")
	// ErrUnknownTablet: the tablet does not exist in the keyspace.
	ErrUnknownTablet = errors.New("unknown tablet")
	// ErrUnknownReplica: no replica of the tablet has that alias.
	ErrUnknownReplica = errors.New("unknown replica")
)

// Source is one sharded database as tabletflow sees it. Implementations are
// safe for concurrent use; every method honours the context's deadline.
type Source interface {
	// EnsureStream creates the source-side stream (a tabletd stream, a
	// PostgreSQL slot) if it does not exist, and returns it. It is
	// idempotent: ensuring an existing stream with the same spec returns it.
	EnsureStream(ctx context.Context, spec StreamSpec) (Stream, error)
	// DeleteStream drops the source-side stream so it holds no history. It is
	// idempotent: deleting an absent stream returns nil.
	DeleteStream(ctx context.Context, stream string) error
	// ListTablets returns every tablet of the keyspace with its replicas'
	// current health, split parents included.
	ListTablets(ctx context.Context) ([]Tablet, error)
	// OpenReplica returns a reader on one replica of a tablet. It does not
	// contact the replica; errors surface from the reader's calls.
	OpenReplica(ctx context.Context, r Replica) (ReplicaReader, error)
	// Classify maps an error from any method to what the caller should do.
	Classify(err error) Classification
	// Close releases connections. Readers opened from it stop working.
	Close() error
}

// ReplicaReader reads one replica's change log for a stream.
type ReplicaReader interface {
	// GetChanges returns up to maxRecords records of the tablet after from,
	// in log order, waiting up to maxWait for the first one. A zero from
	// means the stream's start position for the tablet. The returned
	// Batch.Checkpoint is the position of the last record, or the resolved
	// from when the batch is empty.
	GetChanges(ctx context.Context, req ChangesRequest) (Batch, error)
	// Ack tells the source that everything up to cp is durably consumed, so
	// it may free that history. Acking an older checkpoint than before is a
	// no-op.
	Ack(ctx context.Context, stream, tablet string, cp Checkpoint) error
}

// LossWatcher is implemented by readers that can tell, between reads,
// that their connection to the replica was lost (its server went down): a
// tablet waiting before its next read (the group commit's linger) reads
// at once and learns why, rather than at the end of the wait.
type LossWatcher interface {
	// Lost returns a channel closed once the reader's connection is not
	// ready (at once if it is not ready now); it is watched until ctx ends.
	Lost(ctx context.Context) <-chan struct{}
}

// SlotStats is how much history a replica's slot holds for a stream and
// how much more it may hold before the server invalidates it.
type SlotStats struct {
	// LagBytes: WAL between the replica's current position and the slot's
	// confirmed (committed) position.
	LagBytes int64 `json:"lagBytes"`
	// SafeWALBytes: WAL that may still be written before the slot is
	// invalidated; negative when the server sets no limit.
	SafeWALBytes int64 `json:"safeWALBytes"`
}

// SlotReporter is implemented by readers whose source keeps a stream's
// history in a slot per replica (PostgreSQL): the retention is in bytes,
// not time.
type SlotReporter interface {
	SlotStats(ctx context.Context, stream string) (SlotStats, error)
}

// Resyncer is implemented by sources that can give one tablet of a
// stream a fresh source-side start while the stream's other tablets go
// on: a tablet whose history expired, or whose sink lost data.
type Resyncer interface {
	// Resync drops what the source keeps of the stream for the tablet
	// (its history, a copy in progress) and starts it afresh: read from
	// the returned checkpoint, the tablet delivers a ResyncBegin marker,
	// then its current rows as Read records woven with its changes so
	// that nothing is missed or applied out of order, then a ResyncEnd
	// marker once the copy is complete, then its changes. The checkpoint
	// is after every position the tablet had before, so positions keep
	// increasing. id names the resync: a second call with the id of the
	// last one returns the same checkpoint without starting again (an
	// activity tried again after its answer was lost), or, on a source
	// that keeps nothing of a stream on its servers (vitess), a later
	// start as good. after is the tablet's last checkpoint (zero: none),
	// which such a source starts after.
	Resync(ctx context.Context, stream, tablet, id string, after Checkpoint) (Checkpoint, error)
}

// Snapshotter is implemented by sources that can copy named tables of a
// running stream again, tablet by tablet, while the tablet streams (an
// ad-hoc snapshot, the operator's snapshot command; or the backfill of a
// table added to the stream).
type Snapshotter interface {
	// Snapshot records job for the tablet: its readers opened after the
	// call returns copy the current rows of the job's tables as Read
	// records, chunked by primary key and woven into the tablet's changes
	// by watermarks, so that no table is locked and nothing is missed or
	// applied out of order; after a copy already in progress (a stream's
	// start, a resync), and resumable across reader restarts. The tables
	// must be ones the stream publishes. A second call with the job's ID
	// does nothing; a job with another ID replaces one not finished.
	Snapshot(ctx context.Context, stream, tablet string, job SnapshotJob) error
	// CancelSnapshot ends job id on the tablet: readers opened after the
	// call copy no more of it. No such job (or a finished one): nil.
	CancelSnapshot(ctx context.Context, stream, tablet, id string) error
}

// TableChanger is a source whose running streams can change the tables
// they read (the operator's configure with source.tables).
type TableChanger interface {
	// SetTables makes stream read exactly tables from then on, on every
	// tablet, for the change asked at at: changes of a table added are
	// delivered from the call's return on (its rows from before come by a
	// Snapshotter job the caller asks for next), a table removed is
	// delivered no more. It checks every table first and changes nothing
	// when one cannot be read (a Fatal error naming it); a failure after
	// that is not Fatal (tablets may read different lists until a retry
	// succeeds). A second call for the same change does nothing, and so
	// does one for a change older than the last one made.
	SetTables(ctx context.Context, stream string, tables []string, at time.Time) error
}

// SnapshotJob is an ad-hoc snapshot of a tablet: its tables, named as the
// source's config names them.
type SnapshotJob struct {
	ID     string   `json:"id"`
	Tables []string `json:"tables"`
}

// Copy kinds (CopyProgress.Kind).
const (
	CopyStart    = "start"    // a stream's startFrom snapshot
	CopyResync   = "resync"   // a resync's (Resyncer)
	CopySnapshot = "snapshot" // an ad-hoc snapshot's (Snapshotter)
)

// CopyProgress is a tablet's copy of rows as its reader saw it.
type CopyProgress struct {
	Kind string `json:"kind"`
	// ID is the resync's or the snapshot's id.
	ID string `json:"id,omitempty"`
	// Tables the copy takes, and how many of them are done.
	Tables     int `json:"tables"`
	TablesDone int `json:"tablesDone"`
	// Table is the table being copied.
	Table string `json:"table,omitempty"`
	// Rows the reader handed out since it opened the copy (a chunk copied
	// again after a crash counts again).
	Rows int64 `json:"rows"`
	// Estimate is how many rows the copy's tables hold, by the server's
	// statistics (0: unknown).
	Estimate int64 `json:"estimate,omitempty"`
	// Done: the copy's last chunk was handed out.
	Done bool `json:"done,omitempty"`
}

// CopyReporter is implemented by readers that copy rows: Copy returns the
// copy the reader has open, or the last one it finished (nil: none).
type CopyReporter interface {
	Copy() *CopyProgress
}

// StartFrom says where a new stream starts.
type StartFrom string

// StartFrom values.
const (
	// StartEarliest: all the history the source still retains.
	StartEarliest StartFrom = "earliest"
	// StartLatest: only changes made after the stream is created.
	StartLatest StartFrom = "latest"
	// StartSnapshot: the rows the tables hold when the stream is created
	// (as Read records), then every change after (postgres).
	StartSnapshot StartFrom = "snapshot"
)

// StreamSpec describes a source-side stream.
type StreamSpec struct {
	ID        string
	Tables    []string // empty: all tables
	StartFrom StartFrom
}

// Stream is a source-side stream and where it starts each tablet.
type Stream struct {
	ID        string
	Tables    []string
	StartFrom StartFrom
	Created   time.Time
	Retention time.Duration
	// Start is the checkpoint the stream starts each tablet from.
	Start map[string]Checkpoint
}

// TabletType is a replica's role, as in Vitess.
type TabletType string

// TabletType values.
const (
	TypePrimary TabletType = "PRIMARY"
	TypeReplica TabletType = "REPLICA"
	TypeRDOnly  TabletType = "RDONLY"
)

// Replica is one copy of a tablet on a tablet server.
type Replica struct {
	Tablet  string
	Alias   string // "<cell>-<name>", the server's alias (tabletd: <cell>-<uid>)
	Cell    string
	Type    TabletType
	Address string
	Serving bool
	Healthy bool
	Lag     time.Duration
}

// Tablet is a partition of the keyspace with its own change log.
type Tablet struct {
	ID       string
	Parent   string
	Split    bool // the log ended at SplitAt; Children continue it
	Children []string
	SplitAt  Checkpoint
	Replicas []Replica
}

// Op is a change's kind.
type Op string

// Op values.
const (
	Insert Op = "insert"
	Update Op = "update"
	Delete Op = "delete"
	// Read: a row as it was copied by a snapshot (After holds it).
	Read Op = "read"
	// Truncate: every row of the table in the tablet was removed (Table
	// says which; Key, Before and After are nil).
	Truncate Op = "truncate"
	// ResyncBegin and ResyncEnd are markers, not changes (Table, Key,
	// Before and After are empty): a resync of the tablet (Resyncer)
	// begins its copy here, and the copy is complete here. Every row the
	// tablet holds at the source is delivered between them (as a Read,
	// or by a change after ResyncBegin), so a consumer drops the
	// tablet's earlier state at ResyncBegin, or, keeping it, drops at
	// ResyncEnd the rows of the tablet it was not given since
	// ResyncBegin. A marker may come more than once (a copy started again
	// after a crash, before any of its rows were acknowledged): each
	// begin starts the copy over.
	ResyncBegin Op = "resync-begin"
	ResyncEnd   Op = "resync-end"
)

// Marker reports whether op is a marker rather than a change.
func (op Op) Marker() bool { return op == ResyncBegin || op == ResyncEnd }

// Record is one change. Key, Before and After are JSON objects; Before is
// nil for an insert, After for a delete.
type Record struct {
	Tablet     string
	Position   Checkpoint
	CommitTime time.Time
	Table      string
	Op         Op
	Key        json.RawMessage
	Before     json.RawMessage
	After      json.RawMessage
	// Types: the SQL type of each column the table has at the record's
	// position (its columns as the stream or the copy described them;
	// the names as the source's catalog gives them when read), as
	// PostgreSQL names it (format_type: "numeric(10,2)", "timestamp with
	// time zone", "text[]"), for a sink that makes typed tables; nil
	// when the source declares no types (tabletd). Records of one table
	// share the map: it is read, never written.
	Types map[string]string
}

// ChangesRequest asks a replica for a batch.
type ChangesRequest struct {
	Stream     string
	Tablet     string
	From       Checkpoint
	MaxRecords int
	MaxWait    time.Duration
	// StartFrom is the stream's start, for a source that keeps nothing
	// of a stream on its servers (vitess): what a zero From means.
	StartFrom StartFrom
}

// Batch is what one GetChanges returns.
type Batch struct {
	Records    []Record
	Checkpoint Checkpoint
	// CaughtUp: the replica had nothing more to give.
	CaughtUp bool
	// ReplicaLag: how far the replica is behind its leader.
	ReplicaLag time.Duration
}
