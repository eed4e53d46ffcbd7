// Package sink defines where tabletflow writes a stream's records: the Sink
// interface, its fencing contract, and the errors every adapter returns.
// Adapters live in sub-packages (sink/jsonl); sink/sinktest is the contract
// test suite every adapter must pass.
package sink

import (
	"context"
	"errors"

	"github.com/tabletflow/tabletflow/source"
)

// Errors every adapter returns, matched with errors.Is.
var (
	// ErrFenced: the tablet's stored checkpoint is no longer the one this
	// writer started from: another writer committed since. The writer must
	// stop; retrying cannot help.
	ErrFenced = errors.New("fenced: another writer committed to this tablet")
	// ErrLocked: another writer holds the tablet open right now. Retry later.
	ErrLocked = errors.New("tablet is locked by another writer")
	// ErrClosed: the writer or sink was closed.
	ErrClosed = errors.New("closed")
)

// Sink stores a stream's records per tablet, with each tablet's checkpoint
// kept atomically with its data. Implementations are safe for concurrent
// use by different tablets.
type Sink interface {
	// Open opens a tablet for writing. The writer is fenced to the tablet's
	// stored checkpoint as of Open: data written but never committed by an
	// earlier writer is discarded. It returns ErrLocked when another writer
	// holds the tablet.
	Open(ctx context.Context, tablet string) (TabletWriter, error)
	// Close releases the sink; open writers stop working.
	Close() error
}

// TabletWriter writes one tablet. It is used by one goroutine at a time.
type TabletWriter interface {
	// Checkpoint returns the tablet's stored checkpoint as this writer sees
	// it: the one at Open, then the last one it committed. Zero: nothing
	// stored yet.
	Checkpoint() source.Checkpoint
	// Write stages records (in log order) for the next Commit. Records at or
	// below Checkpoint() are skipped, so a re-read batch is not stored twice.
	Write(ctx context.Context, records []source.Record) error
	// Commit makes the staged records durable and stores cp as the tablet's
	// checkpoint, atomically: after a crash the tablet holds all of it or
	// none of it. It succeeds only if the stored checkpoint is still
	// Checkpoint() (compare-and-set); otherwise it returns ErrFenced and
	// stores nothing. cp must not be before Checkpoint().
	Commit(ctx context.Context, cp source.Checkpoint) error
	// Close releases the tablet; staged, uncommitted records are dropped.
	Close() error
}
