package cluster

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// Request limits: what GetChanges accepts.
const (
	maxRecordsLimit = 100_000
	maxWaitLimit    = 5 * time.Minute
)

// tabletService serves GetChanges and Ack for the replicas on one server.
type tabletService struct {
	sourcepb.UnimplementedTabletServerServer
	ts *tabletServer
}

func (s *tabletService) GetChanges(ctx context.Context, req *sourcepb.GetChangesRequest) (*sourcepb.GetChangesResponse, error) {
	c := s.ts.cluster
	if err := validateStreamTablet(req.Stream, req.Tablet); err != nil {
		return nil, err
	}
	if req.MaxRecords < 1 || req.MaxRecords > maxRecordsLimit {
		return nil, errBadRequest("max_records", "%d not in [1, %d]", req.MaxRecords, maxRecordsLimit)
	}
	var wait time.Duration
	if req.MaxWait != nil {
		if err := req.MaxWait.CheckValid(); err != nil {
			return nil, errBadRequest("max_wait", "%v", err)
		}
		wait = req.MaxWait.AsDuration()
	}
	if wait < 0 || wait > maxWaitLimit {
		return nil, errBadRequest("max_wait", "%v not in [0, %v]", wait, maxWaitLimit)
	}
	from, err := parseCheckpoint("from_checkpoint", req.FromCheckpoint)
	if err != nil {
		return nil, err
	}
	t, place, err := c.replicaOn(req.Tablet, s.ts)
	if err != nil {
		return nil, err
	}
	if err := s.ts.apply(ctx, t.id, true); err != nil {
		return nil, err
	}
	now := c.now()
	idx, str, err := c.beginRead(req.Stream, t, from, s.ts.alias, now)
	if err != nil {
		return nil, err
	}
	lag := c.replicaLag(t, place)
	deadline := now.Add(wait)
	for {
		now = c.now()
		l := t.log
		l.mu.Lock()
		if idx < l.start {
			l.mu.Unlock()
			return nil, c.expire(str, t, fmt.Sprintf("history up to %s was freed; the stream needs it from %s",
				l.position(l.start), l.position(idx)))
		}
		applied := l.applied(lag, now)
		recs, scanned := readFiltered(l, idx, applied, int(req.MaxRecords), str)
		idx = scanned
		if len(recs) > 0 {
			resp := &sourcepb.GetChangesResponse{
				Records:    recs,
				Checkpoint: l.position(idx).String(),
				CaughtUp:   idx >= applied,
				ReplicaLag: durationpb.New(l.lagOf(applied, now)),
			}
			l.mu.Unlock()
			return resp, nil
		}
		if l.closed && idx >= l.splitAt {
			handoff := l.position(l.splitAt)
			l.mu.Unlock()
			return nil, c.splitDelivered(str, t, handoff)
		}
		next, pending := l.visibleAt(idx, lag)
		notify := l.notify
		replicaLag := l.lagOf(applied, now)
		l.mu.Unlock()

		left := deadline.Sub(now)
		if left <= 0 {
			return &sourcepb.GetChangesResponse{
				Checkpoint: t.log.position(idx).String(),
				CaughtUp:   true,
				ReplicaLag: durationpb.New(replicaLag),
			}, nil
		}
		if pending { // a record exists that this follower applies soon
			left = min(left, max(next.Sub(now), time.Millisecond))
		}
		timer := time.NewTimer(left)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-notify:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// readFiltered returns up to max records after index, up to upto, that
// stream s reads (its tables' changes and its own resync copies), and the
// last index it looked at. Callers hold l.mu.
func readFiltered(l *tabletLog, index, upto uint64, max int, s *stream) ([]*sourcepb.Record, uint64) {
	if upto <= index {
		return nil, index
	}
	var out []*sourcepb.Record
	i := index
	for i < upto && len(out) < max {
		i++
		if l.visible(i, s) {
			out = append(out, l.recs[i-l.start-1])
		}
	}
	return out, i
}

func (s *tabletService) Ack(ctx context.Context, req *sourcepb.AckRequest) (*sourcepb.AckResponse, error) {
	c := s.ts.cluster
	if err := validateStreamTablet(req.Stream, req.Tablet); err != nil {
		return nil, err
	}
	cp, err := parseCheckpoint("checkpoint", req.Checkpoint)
	if err != nil {
		return nil, err
	}
	if cp.IsZero() {
		return nil, errBadRequest("checkpoint", "must not be empty")
	}
	t, _, err := c.replicaOn(req.Tablet, s.ts)
	if err != nil {
		return nil, err
	}
	if err := s.ts.apply(ctx, t.id, false); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, st, err := c.streamTablet(req.Stream, t)
	if err != nil {
		return nil, err
	}
	idx, err := resolve(t, cp)
	if err != nil {
		return nil, err
	}
	st.acked = max(st.acked, idx)
	st.lastActive = c.now()
	return &sourcepb.AckResponse{}, nil
}

func validateStreamTablet(stream, tablet string) error {
	if stream == "" {
		return errBadRequest("stream", "must not be empty")
	}
	if tablet == "" {
		return errBadRequest("tablet", "must not be empty")
	}
	return nil
}

func parseCheckpoint(field, s string) (source.Checkpoint, error) {
	cp, err := source.ParseCheckpoint(s)
	if err != nil {
		return cp, errf(codeInvalidArgument, sourcepb.Reason_BAD_CHECKPOINT, field, "%s: %v", field, err)
	}
	return cp, nil
}

// replicaOn finds a tablet and its replica on server ts.
func (c *Cluster) replicaOn(tabletID string, ts *tabletServer) (*tablet, replicaPlace, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.tablets[tabletID]
	if t == nil {
		return nil, replicaPlace{}, errUnknownTablet(tabletID)
	}
	for _, p := range t.replicas {
		if p.server == ts {
			return t, p, nil
		}
	}
	return nil, replicaPlace{}, errf(codeNotFound, sourcepb.Reason_UNKNOWN_TABLET, "tablet",
		"tablet %s has no replica on server %s", tabletID, ts.alias)
}

// replicaLag is how far a replica trails its leader: the cluster's lag for
// followers, plus any injected lag.
func (c *Cluster) replicaLag(t *tablet, p replicaPlace) time.Duration {
	_, _, extra := p.server.health(t.id)
	if p.typ == sourcepb.TabletType_PRIMARY {
		return extra
	}
	return c.cfg.Lag + extra
}

// streamTablet finds a stream's state on a tablet. Callers hold mu.
func (c *Cluster) streamTablet(streamID string, t *tablet) (*stream, *streamTablet, error) {
	s := c.streams[streamID]
	if s == nil {
		return nil, nil, errUnknownStream(streamID)
	}
	st := s.tablets[t.id]
	if st == nil {
		return nil, nil, errf(codeNotFound, sourcepb.Reason_UNKNOWN_TABLET, "tablet",
			"stream %q does not cover tablet %s", streamID, t.id)
	}
	if st.expired {
		return nil, nil, errExpired(t.id, st.reason)
	}
	return s, st, nil
}

// resolve maps a checkpoint to an index of t's log: a position of the log
// itself, or the hand-off checkpoint of its parent. Callers hold c.mu.
func resolve(t *tablet, cp source.Checkpoint) (uint64, error) {
	l := t.log
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case cp.Term == l.term && cp.Index >= l.origin && cp.Index <= l.last():
		return cp.Index, nil
	case cp.Term < l.term && cp.Index == l.origin:
		return cp.Index, nil
	case cp.Term == l.term && cp.Index > l.last():
		return 0, errf(codeInvalidArgument, sourcepb.Reason_BAD_CHECKPOINT, "checkpoint",
			"checkpoint %s is beyond the end of tablet %s (last %s)", cp, t.id, l.position(l.last()))
	}
	return 0, errf(codeInvalidArgument, sourcepb.Reason_BAD_CHECKPOINT, "checkpoint",
		"checkpoint %s is not a position of tablet %s (term %d, starting after %d)", cp, t.id, l.term, l.origin)
}

// beginRead resolves where a GetChanges starts and marks the stream active
// on the tablet. A zero checkpoint, or one before the stream's own start,
// starts at the stream's start.
func (c *Cluster) beginRead(streamID string, t *tablet, from source.Checkpoint, replica string, now time.Time) (uint64, *stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, st, err := c.streamTablet(streamID, t)
	if err != nil {
		return 0, nil, err
	}
	idx := st.start
	if !from.IsZero() {
		i, err := resolve(t, from)
		if err != nil {
			return 0, nil, err
		}
		idx = max(i, st.start)
	}
	st.lastActive = now
	st.waiting = false
	st.lastReplica = replica
	return idx, s, nil
}

// expire marks a stream expired on a tablet and returns the error to send.
func (c *Cluster) expire(s *stream, t *tablet, reason string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := s.tablets[t.id]; st != nil && !st.expired {
		st.expired, st.reason = true, reason
	}
	return errExpired(t.id, reason)
}

// splitDelivered starts the retention clock of the children once the
// stream has drained the parent, and returns the TABLET_SPLIT error.
func (c *Cluster) splitDelivered(s *stream, t *tablet, handoff source.Checkpoint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for _, ch := range t.children {
		if st := s.tablets[ch]; st != nil && st.waiting {
			st.waiting, st.lastActive = false, now
		}
	}
	return errInfo(codeOutOfRange, &sourcepb.ErrorInfo{
		Reason: sourcepb.Reason_TABLET_SPLIT, Tablet: t.id,
		Children: t.children, HandoffCheckpoint: handoff.String(),
	}, fmt.Sprintf("tablet %s split at %s into %v", t.id, handoff, t.children))
}

func errExpired(tabletID, reason string) error {
	return errInfo(codeOutOfRange, &sourcepb.ErrorInfo{Reason: sourcepb.Reason_STREAM_EXPIRED, Tablet: tabletID},
		fmt.Sprintf("stream expired on tablet %s: %s", tabletID, reason))
}
