package cluster

import (
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// stream is a source-side CDC stream: where it started each tablet, what it
// acknowledged, and when it was last active there.
type stream struct {
	id        string
	tables    []string // sorted; empty = all
	startFrom sourcepb.StartFrom
	created   time.Time
	tablets   map[string]*streamTablet
}

// streamTablet is a stream's state on one tablet (YugabyteDB's cdc_state
// row).
type streamTablet struct {
	start      uint64 // index the stream starts after
	acked      uint64
	lastActive time.Time
	// waiting: a split child whose parent this stream has not finished; its
	// retention clock starts when the parent is drained.
	waiting bool
	expired bool
	reason  string
	// lastReplica served the stream's last GetChanges on the tablet.
	lastReplica string
	// prefix is the digest of the records at or below start when the stream
	// began this tablet (or last resynced it); what the stream is due is
	// total - prefix.
	prefix digest.Digest
	// resyncID and resyncStart: the tablet's last resync (ResyncStream) and
	// the index it started after; resyncRows, the rows it copied.
	resyncID    string
	resyncStart uint64
	resyncRows  uint64
	resynced    bool
}

// wants reports whether the stream takes records of the table.
func (s *stream) wants(table string) bool {
	if len(s.tables) == 0 {
		return true
	}
	_, ok := slices.BinarySearch(s.tables, table)
	return ok
}

// barrier is the index below which this stream needs no history.
func (st *streamTablet) barrier() uint64 { return max(st.start, st.acked) }

// addChildren gives the stream entries for a split's children, continuing
// from the hand-off checkpoint. Callers hold the cluster lock.
func (s *stream) addChildren(parent *tablet, children []*tablet, handoff source.Checkpoint, now time.Time) {
	if s.tablets[parent.id] == nil {
		return
	}
	for _, ch := range children {
		s.tablets[ch.id] = &streamTablet{start: handoff.Index, lastActive: now, waiting: true}
	}
}

// createStream creates a stream, or returns the existing one if its
// parameters match.
func (c *Cluster) createStream(req *sourcepb.CreateStreamRequest) (*sourcepb.Stream, error) {
	if req.Stream == "" {
		return nil, errBadRequest("stream", "must not be empty")
	}
	if req.Keyspace != "" && req.Keyspace != c.cfg.Keyspace {
		return nil, errBadRequest("keyspace", "unknown keyspace %q (this cluster serves %q)", req.Keyspace, c.cfg.Keyspace)
	}
	tables := slices.Clone(req.Tables)
	slices.Sort(tables)
	tables = slices.Compact(tables)
	for _, t := range tables {
		if !slices.Contains(tableNames, t) {
			return nil, errBadRequest("tables", "unknown table %q (tables: %v)", t, tableNames)
		}
	}
	start := req.StartFrom
	switch start {
	case sourcepb.StartFrom_START_FROM_UNSPECIFIED:
		start = sourcepb.StartFrom_EARLIEST
	case sourcepb.StartFrom_EARLIEST, sourcepb.StartFrom_LATEST:
	default:
		return nil, errBadRequest("start_from", "unknown value %d", start)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.streams[req.Stream]; s != nil {
		if !slices.Equal(s.tables, tables) || s.startFrom != start {
			return nil, errf(codes.AlreadyExists, sourcepb.Reason_BAD_REQUEST, "stream",
				"stream %q exists with other tables or start (tables %v, start %s)", s.id, s.tables, s.startFrom)
		}
		return c.describe(s), nil
	}
	now := c.now()
	s := &stream{id: req.Stream, tables: tables, startFrom: start, created: now, tablets: map[string]*streamTablet{}}
	for _, id := range c.order {
		t := c.tablets[id]
		if p := s.tablets[t.parent]; t.parent != "" && p != nil && p.start < c.tablets[t.parent].log.splitAt {
			// The stream still has the parent to read: the child continues
			// from the hand-off.
			s.tablets[id] = &streamTablet{start: t.log.origin, lastActive: now, waiting: true}
			continue
		}
		t.log.mu.Lock()
		at := t.log.start
		if start == sourcepb.StartFrom_LATEST {
			at = t.log.last()
		}
		s.tablets[id] = &streamTablet{start: at, lastActive: now, prefix: t.log.digestUpTo(at, s)}
		t.log.mu.Unlock()
	}
	c.streams[s.id] = s
	return c.describe(s), nil
}

// describe renders a stream. Callers hold the cluster lock.
func (c *Cluster) describe(s *stream) *sourcepb.Stream {
	out := &sourcepb.Stream{
		Id:        s.id,
		Keyspace:  c.cfg.Keyspace,
		Tables:    s.tables,
		StartFrom: s.startFrom,
		Created:   timestamppb.New(s.created),
		Retention: durationpb.New(c.cfg.Retention),
	}
	for _, id := range c.order {
		st := s.tablets[id]
		if st == nil {
			continue
		}
		log := c.tablets[id].log
		e := &sourcepb.StreamTablet{
			Tablet:        id,
			Start:         log.position(st.start).String(),
			LastActive:    timestamppb.New(st.lastActive),
			Expired:       st.expired,
			ExpiredReason: st.reason,
			LastReplica:   st.lastReplica,
		}
		if st.acked > 0 {
			e.Acked = log.position(st.acked).String()
		}
		if st.resynced {
			e.ResyncId = st.resyncID
			e.ResyncStart = log.position(st.resyncStart).String()
		}
		out.Tablets = append(out.Tablets, e)
	}
	return out
}

// expireIdle marks (stream, tablet) pairs inactive for longer than the
// retention as expired, and returns each tablet's barrier: the index below
// which no live stream needs history (ok false when no stream holds it).
// Callers hold the cluster lock.
func (c *Cluster) expireIdle(now time.Time) map[string]uint64 {
	barriers := map[string]uint64{}
	for _, s := range c.streams {
		for id, st := range s.tablets {
			t := c.tablets[id]
			done := len(t.children) > 0 && st.barrier() >= t.log.splitAt
			if st.expired || done {
				continue
			}
			if !st.waiting && now.Sub(st.lastActive) > c.cfg.Retention {
				st.expired = true
				st.reason = "inactive for longer than the retention (" + c.cfg.Retention.String() + ")"
				continue
			}
			if b, ok := barriers[id]; !ok || st.barrier() < b {
				barriers[id] = st.barrier()
			}
		}
	}
	return barriers
}

// retentionLoop frees history no live stream needs, and history older than
// the retention on tablets no stream holds.
func (c *Cluster) retentionLoop() {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		c.enforceRetention()
	}
}

func (c *Cluster) enforceRetention() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	barriers := c.expireIdle(now)
	for id, t := range c.tablets {
		t.log.mu.Lock()
		if b, held := barriers[id]; held {
			t.log.truncate(b)
		} else {
			t.log.truncate(t.log.indexBefore(now.Add(-c.cfg.Retention)))
		}
		t.log.mu.Unlock()
	}
}

// streamDigest returns what a stream is due on each tablet: the records
// after its start positions. Callers hold the cluster lock.
func (c *Cluster) streamDigest(s *stream) map[string]digest.Digest {
	out := map[string]digest.Digest{}
	for id, st := range s.tablets {
		log := c.tablets[id].log
		log.mu.Lock()
		out[id] = log.digestUpTo(log.last(), s).Minus(st.prefix)
		log.mu.Unlock()
	}
	return out
}
