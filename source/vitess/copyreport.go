package vitess

import (
	"slices"

	"github.com/tabletflow/tabletflow/source"
)

var _ source.CopyReporter = (*Reader)(nil)

// Copy returns the copy the reader has open (a stream's snapshot start or
// a resync's), or the last one it finished, also after Close; nil when it
// opened none. Its figures are those of what GetChanges handed out: Rows
// the Read records since the reader opened the copy (rows copied again
// after a restart count again), TablesDone and Table as the last
// checkpoint says. Vitess gives no row estimate. Call it from the
// goroutine that calls GetChanges.
func (r *Reader) Copy() *source.CopyProgress {
	if r.copy == nil {
		return nil
	}
	c := *r.copy
	return &c
}

// opened begins the report of a copy the reader opens at state, of tables
// (none: not known).
func (r *Reader) opened(state *copyState, tables []string) {
	kind := source.CopyStart
	if state.resync != "" {
		kind = source.CopyResync
	}
	r.copy = &source.CopyProgress{Kind: kind, ID: state.resync, Tables: len(tables)}
	r.copyTables = slices.Sorted(slices.Values(tables))
	r.progress(state)
}

// report counts the copy's rows among recs, handed out with checkpoint
// cp, and where cp says the copy stands: a checkpoint without a copy
// state is the copy's end.
func (r *Reader) report(recs []source.Record, cp source.Checkpoint) {
	if r.copy == nil || r.copy.Done {
		return
	}
	for _, rec := range recs {
		if rec.Op == source.Read {
			r.copy.Rows++
		}
	}
	if _, state, err := parseOpaque(cp.Opaque); err == nil {
		r.progress(state)
	}
}

// progress sets the report's tables done and table in progress from
// state (nil: the copy is over).
func (r *Reader) progress(state *copyState) {
	c := r.copy
	if state == nil {
		c.TablesDone, c.Table, c.Done = c.Tables, "", true
		return
	}
	left := state.toCopy(r.copyTables)
	c.TablesDone, c.Table = len(r.copyTables)-len(left), state.table
}
