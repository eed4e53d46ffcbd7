package cluster

import (
	"slices"

	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

// A resync gives one tablet of a stream a fresh start with a copy of its
// rows (source.Resyncer). tabletd writes the copy into the tablet's own
// log, at once and under the log's lock, right after the position the
// stream restarts from:
//
//	start            the log's last index when the resync ran
//	start+1          RESYNC_BEGIN
//	start+2 ...      one READ per row of the tablet's key range (of the
//	                 stream's tables), by table then id
//	start+n+2        RESYNC_END
//	start+n+3 ...    the tablet's changes, as they are written
//
// So the copy's positions are the log's: unique, increasing, after every
// position the tablet had before and before every later change; a reader
// resumes anywhere inside the copy as it does anywhere in the log, and
// the copy is freed, like history, once every stream's barrier passes it.
// Only the stream that asked reads its copy (copySpan); other streams of
// the tablet skip those positions, and the cluster's own digest and Tail
// leave them out.
//
// The rows are what the logs hold at start: the workload's rows are taken
// while no change is between the workload and a log (workload.routing),
// so a READ and the changes after the copy never disagree.

// Resync starts stream streamID afresh on tablet tabletID: its expiry is
// cleared, its start and acknowledged checkpoint move to the log's end,
// and its copy is written after them. id names the resync: the id of the
// tablet's last resync returns that resync's start and starts nothing;
// an empty id always starts again.
func (c *Cluster) Resync(streamID, tabletID, id string) (*sourcepb.ResyncStreamResponse, error) {
	if err := validateStreamTablet(streamID, tabletID); err != nil {
		return nil, err
	}
	w := c.workload
	w.mu.Lock() // no new change; lock order: workload, cluster, log
	defer w.mu.Unlock()
	w.routing.Wait() // every change made is in its log
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.streams[streamID]
	if s == nil {
		return nil, errUnknownStream(streamID)
	}
	t := c.tablets[tabletID]
	if t == nil {
		return nil, errUnknownTablet(tabletID)
	}
	st := s.tablets[t.id]
	if st == nil {
		return nil, errf(codeNotFound, sourcepb.Reason_UNKNOWN_TABLET, "tablet",
			"stream %q does not cover tablet %s", streamID, t.id)
	}
	if st.resynced && id != "" && st.resyncID == id {
		return &sourcepb.ResyncStreamResponse{
			Start: t.log.position(st.resyncStart).String(), Rows: st.resyncRows, Existed: true,
		}, nil
	}
	if len(t.children) > 0 {
		return nil, errBadRequest("tablet", "tablet %s split into %v: resync its children", t.id, t.children)
	}
	tables := tableNames
	if len(s.tables) > 0 {
		tables = s.tables
	}
	rows := w.rowsOf(tables, func(table string, key []byte) bool { return t.contains(keyHash(table, key)) })

	now := c.now()
	l := t.log
	l.mu.Lock()
	at := l.last()
	l.add(&sourcepb.Record{Tablet: t.id, Op: sourcepb.Op_RESYNC_BEGIN}, now)
	for _, r := range rows {
		l.add(&sourcepb.Record{Tablet: t.id, Table: r.Table, Op: sourcepb.Op_READ, Key: r.Key, After: r.Row}, now)
	}
	l.add(&sourcepb.Record{Tablet: t.id, Op: sourcepb.Op_RESYNC_END}, now)
	l.copies = append(l.copies, copySpan{first: at + 1, last: l.last(), owner: s})
	prefix := l.digestUpTo(at, s)
	l.wake()
	l.mu.Unlock()

	*st = streamTablet{
		start: at, acked: at, lastActive: now, lastReplica: st.lastReplica, prefix: prefix,
		resynced: true, resyncID: id, resyncStart: at, resyncRows: uint64(len(rows)),
	}
	start := l.position(at).String()
	c.log.Info("stream resynced", zap.String("stream", s.id), zap.String("tablet", t.id),
		zap.String("id", id), zap.String("start", start), zap.Int("rows", len(rows)))
	return &sourcepb.ResyncStreamResponse{Start: start, Rows: uint64(len(rows))}, nil
}

// dropCopies forgets what a deleted stream's resyncs left in the logs: a
// stream created again with its ID must not read them. Callers hold mu.
func (c *Cluster) dropCopies(s *stream) {
	for _, t := range c.tablets {
		l := t.log
		l.mu.Lock()
		delete(l.freedCopies, s)
		l.copies = slices.DeleteFunc(l.copies, func(sp copySpan) bool { return sp.owner == s })
		l.mu.Unlock()
	}
}
