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

// Errors every adapter returns, matched with errors.Is. An adapter's own
// errors wrap the one here they are a case of, so callers classify sink
// trouble without knowing the adapter:
//
//   - ErrFenced: this writer must stop; a new one may open the tablet.
//   - ErrLocked, ErrClosed, and any error not listed here (an I/O error, a
//     timeout): the sink cannot take writes right now; retrying later can
//     help.
//   - ErrCorrupt, ErrBadRecord, ErrBadTablet, ErrBadCommit, ErrDenied: the sink cannot
//     take this tablet's data at all; retrying cannot help, someone must
//     look.
var (
	// ErrFenced: the tablet's stored checkpoint is no longer the one this
	// writer started from: another writer committed since. The writer must
	// stop; retrying cannot help.
	ErrFenced = errors.New("fenced: another writer committed to this tablet")
	// ErrLocked: another writer holds the tablet open right now. Retry later.
	ErrLocked = errors.New("tablet is locked by another writer")
	// ErrClosed: the writer or sink was closed.
	ErrClosed = errors.New("closed")
	// ErrCorrupt: the tablet's stored data contradicts itself (data without
	// the record of what is committed, less data than that record says) or
	// belongs to another stream. The sink never repairs it by dropping data.
	ErrCorrupt = errors.New("sink: tablet storage is corrupt")
	// ErrBadRecord: a record the sink cannot store (another tablet's, an
	// unknown op, invalid JSON).
	ErrBadRecord = errors.New("sink: record cannot be stored")
	// ErrBadTablet: a tablet ID the sink cannot store under.
	ErrBadTablet = errors.New("sink: tablet id cannot be stored")
	// ErrBadCommit: a Commit whose checkpoint is before Checkpoint() or
	// before the last staged record.
	ErrBadCommit = errors.New("sink: commit checkpoint goes backwards")
	// ErrDenied: the sink refuses us (wrong credentials, a missing
	// permission); retrying cannot help until someone fixes the access.
	ErrDenied = errors.New("sink: access denied")
)

// Sink stores a stream's records per tablet, with each tablet's checkpoint
// kept atomically with its data. Implementations are safe for concurrent
// use by different tablets.
type Sink interface {
	// Open opens a tablet for writing, storing it (empty, at the zero
	// checkpoint) if the sink does not hold it yet, so that from then on
	// data of the tablet without its commit record is corruption, not a
	// new tablet. The writer is fenced to the tablet's stored checkpoint as
	// of Open: data written but never committed by an earlier writer is
	// discarded. It returns ErrLocked when another writer holds the tablet,
	// ErrCorrupt when the tablet's stored data is inconsistent (it never
	// drops committed-looking data to make it fit), and ErrBadTablet for an
	// ID it cannot store.
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
	// A record the sink cannot store (another tablet's among them) is
	// ErrBadRecord, and nothing of that call is staged.
	Write(ctx context.Context, records []source.Record) error
	// Commit makes the staged records durable and stores cp as the tablet's
	// checkpoint, atomically: after a crash the tablet holds all of it or
	// none of it. It succeeds only if the stored checkpoint is still
	// Checkpoint() (compare-and-set); otherwise it returns ErrFenced and
	// stores nothing. A cp before Checkpoint() or before the last staged
	// record is ErrBadCommit, and the staged records stay staged.
	Commit(ctx context.Context, cp source.Checkpoint) error
	// Close releases the tablet; staged, uncommitted records are dropped.
	Close() error
}
