package postgres

import (
	"context"
	"time"

	"github.com/tabletflow/tabletflow/source"
)

var _ source.CopyReporter = (*Reader)(nil)

// Copy returns the copy the reader has open (a stream's start or resync
// copy, an ad-hoc job's), or the last one it finished, also after Close;
// nil when it opened none. Rows counts the rows it handed out since it
// opened the copy (a chunk copied again after a crash counts again).
// Call it from the goroutine that calls GetChanges.
func (r *Reader) Copy() *source.CopyProgress {
	if r.lastCopy == nil {
		return nil
	}
	c := *r.lastCopy
	return &c
}

// opened begins the report of a copy the reader opens.
func (r *Reader) opened(ctx context.Context, snap *snapshot) {
	p := &source.CopyProgress{Kind: snap.kind, ID: snap.id, Tables: len(snap.tables), TablesDone: min(snap.ti, len(snap.tables))}
	if snap.ti < len(snap.tables) {
		p.Table = snap.tables[snap.ti].name
	}
	p.Estimate = r.estimate(ctx, snap.tables)
	r.lastCopy = p
}

// completed reports copy c complete as the reader opens (an earlier
// reader handed its last chunk out and the sink took it), so that the
// stream learns it is done even if the run that finished it ended
// without saying so.
func (r *Reader) completed(c copySpec) {
	n := len(c.tables)
	r.lastCopy = &source.CopyProgress{Kind: c.kind, ID: c.id, Tables: n, TablesDone: n, Done: true}
}

// chunkReport is what a chunk changes in its copy's report (to) once its
// rows are in a batch GetChanges returns (at once if it has none).
type chunkReport struct {
	to         *source.CopyProgress
	rows       int
	tablesDone int
	table      string
	done       bool
}

// reportOf is chunk c of snap's report.
func (r *Reader) reportOf(snap *snapshot, c *chunk) *chunkReport {
	rep := &chunkReport{to: r.lastCopy, rows: len(c.records), tablesDone: c.fromTable, done: c.last}
	if c.tableDone {
		rep.tablesDone++
	}
	if rep.tablesDone < len(snap.tables) {
		rep.table = snap.tables[rep.tablesDone].name
	}
	return rep
}

func (c *chunkReport) apply() {
	if c == nil || c.to == nil {
		return
	}
	c.to.Rows += int64(c.rows)
	c.to.TablesDone, c.to.Table, c.to.Done = c.tablesDone, c.table, c.done
}

// estimate is how many rows tables hold by the replica's statistics
// (pg_class.reltuples; a table never vacuumed nor analyzed counts 0), best
// effort: 0 when they cannot be read.
func (r *Reader) estimate(ctx context.Context, tables []snapTable) int64 {
	pool, err := r.rep.poolOf()
	if err != nil {
		return 0
	}
	oids := make([]uint32, len(tables))
	for i, t := range tables {
		oids[i] = t.rel.RelationID
	}
	ectx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var n int64
	if err := pool.QueryRow(ectx, `SELECT COALESCE(sum(GREATEST(reltuples, 0)), 0)::bigint FROM pg_class WHERE oid = ANY($1::oid[])`, oids).Scan(&n); err != nil {
		return 0
	}
	return n
}
