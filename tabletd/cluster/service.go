package cluster

import (
	"context"
	"math"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

// topologyService serves the cluster layout and the streams.
type topologyService struct {
	sourcepb.UnimplementedTopologyServer
	c *Cluster
}

func (s *topologyService) checkKeyspace(ks string) error {
	if ks != "" && ks != s.c.cfg.Keyspace {
		return errBadRequest("keyspace", "unknown keyspace %q (this cluster serves %q)", ks, s.c.cfg.Keyspace)
	}
	return nil
}

func (s *topologyService) ListTablets(_ context.Context, req *sourcepb.ListTabletsRequest) (*sourcepb.ListTabletsResponse, error) {
	if err := s.checkKeyspace(req.Keyspace); err != nil {
		return nil, err
	}
	c := s.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := &sourcepb.ListTabletsResponse{}
	for _, id := range c.order {
		out.Tablets = append(out.Tablets, c.describeTablet(c.tablets[id]))
	}
	return out, nil
}

func (s *topologyService) GetTablet(_ context.Context, req *sourcepb.GetTabletRequest) (*sourcepb.Tablet, error) {
	if err := s.checkKeyspace(req.Keyspace); err != nil {
		return nil, err
	}
	c := s.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.tablets[req.Tablet]
	if t == nil {
		return nil, errUnknownTablet(req.Tablet)
	}
	return c.describeTablet(t), nil
}

// describeTablet renders a tablet with its replicas' current health.
// Callers hold mu (read).
func (c *Cluster) describeTablet(t *tablet) *sourcepb.Tablet {
	now := c.now()
	out := &sourcepb.Tablet{
		Id:       t.id,
		Keyspace: c.cfg.Keyspace,
		KeyRange: &sourcepb.KeyRange{Start: t.keyStart, End: t.keyEnd},
		Parent:   t.parent,
		State:    sourcepb.TabletState_ACTIVE,
		Children: t.children,
	}
	l := t.log
	l.mu.Lock()
	if l.closed {
		out.State = sourcepb.TabletState_SPLIT
		out.SplitCheckpoint = l.position(l.splitAt).String()
	}
	if l.last() > l.start {
		out.FirstPosition = l.position(l.start + 1).String()
		out.LastPosition = l.position(l.last()).String()
	}
	for _, p := range t.replicas {
		serving, healthy, _ := p.server.health(t.id)
		lag := l.lagOf(l.applied(c.replicaLag(t, p), now), now)
		p.server.mu.Lock()
		addr := p.server.advertised
		p.server.mu.Unlock()
		out.Replicas = append(out.Replicas, &sourcepb.Replica{
			Alias:   p.server.alias,
			Cell:    p.server.cell,
			Type:    p.typ,
			Address: addr,
			Serving: serving,
			Healthy: healthy,
			Lag:     durationpb.New(lag),
		})
	}
	l.mu.Unlock()
	return out
}

func (s *topologyService) CreateStream(_ context.Context, req *sourcepb.CreateStreamRequest) (*sourcepb.Stream, error) {
	return s.c.createStream(req)
}

func (s *topologyService) DescribeStream(_ context.Context, req *sourcepb.DescribeStreamRequest) (*sourcepb.Stream, error) {
	c := s.c
	c.mu.Lock() // expiry is brought up to date first
	defer c.mu.Unlock()
	c.expireIdle(c.now())
	st := c.streams[req.Stream]
	if st == nil {
		return nil, errUnknownStream(req.Stream)
	}
	return c.describe(st), nil
}

func (s *topologyService) DeleteStream(_ context.Context, req *sourcepb.DeleteStreamRequest) (*sourcepb.DeleteStreamResponse, error) {
	if req.Stream == "" {
		return nil, errBadRequest("stream", "must not be empty")
	}
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	st, existed := c.streams[req.Stream]
	if existed {
		c.dropCopies(st)
	}
	delete(c.streams, req.Stream)
	return &sourcepb.DeleteStreamResponse{Existed: existed}, nil
}

func (s *topologyService) ResyncStream(_ context.Context, req *sourcepb.ResyncStreamRequest) (*sourcepb.ResyncStreamResponse, error) {
	return s.c.Resync(req.Stream, req.Tablet, req.Id)
}

// adminService drives the test bed.
type adminService struct {
	sourcepb.UnimplementedAdminServer
	c *Cluster
}

func (s *adminService) Workload(_ context.Context, req *sourcepb.WorkloadRequest) (*sourcepb.WorkloadResponse, error) {
	return s.c.workload.control(req)
}

// maxFaultDuration bounds injected latency and lag.
const maxFaultDuration = time.Hour

func (s *adminService) Fault(_ context.Context, req *sourcepb.FaultRequest) (*sourcepb.FaultResponse, error) {
	if req.TopologyDown {
		return s.topologyFault(req)
	}
	if req.Duration != nil {
		return nil, errBadRequest("duration", "bounds topology_down only")
	}
	ts, err := s.c.serverFor(req.Server, req.Tablet)
	if err != nil {
		return nil, err
	}
	if req.Down && req.Tablet != "" {
		return nil, errBadRequest("down", "a whole server goes down; drop --tablet")
	}
	if req.Code != "" && !validCode(req.Code) {
		return nil, errBadRequest("code", "%q is not a gRPC code name (UNAVAILABLE, FAILED_PRECONDITION, ...)", req.Code)
	}
	if req.ErrorRate < 0 || req.ErrorRate > 1 || math.IsNaN(req.ErrorRate) {
		return nil, errBadRequest("error_rate", "%v not in [0, 1]", req.ErrorRate)
	}
	if req.ErrorRate > 0 && req.Code == "" {
		return nil, errBadRequest("error_rate", "needs a code")
	}
	for field, d := range map[string]*durationpb.Duration{"latency": req.Latency, "lag": req.Lag} {
		if d == nil {
			continue
		}
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 || d.AsDuration() > maxFaultDuration {
			return nil, errBadRequest(field, "%v not in [0, %v]", d.AsDuration(), maxFaultDuration)
		}
	}
	if !req.Down && !req.NotServing && !req.PositionMismatch && !req.Unhealthy && req.Code == "" &&
		req.Latency == nil && req.Lag == nil {
		return nil, errBadRequest("fault", "no fault given")
	}
	return &sourcepb.FaultResponse{}, ts.inject(req.Tablet, req)
}

// topologyFault injects topology_down, which takes no server, tablet or
// other fault.
func (s *adminService) topologyFault(req *sourcepb.FaultRequest) (*sourcepb.FaultResponse, error) {
	if req.Server != "" || req.Tablet != "" {
		return nil, errBadRequest("topology_down", "the topology is cluster-wide; give no server or tablet")
	}
	if req.Down || req.NotServing || req.PositionMismatch || req.Unhealthy || req.Code != "" || req.ErrorRate != 0 ||
		req.Latency != nil || req.Lag != nil {
		return nil, errBadRequest("topology_down", "takes no other fault; inject those separately")
	}
	var d time.Duration
	if req.Duration != nil {
		d = req.Duration.AsDuration()
		if err := req.Duration.CheckValid(); err != nil || d <= 0 || d > maxFaultDuration {
			return nil, errBadRequest("duration", "%v not in (0, %v]", d, maxFaultDuration)
		}
	}
	s.c.topologyDown(d)
	return &sourcepb.FaultResponse{}, nil
}

func (s *adminService) Heal(_ context.Context, req *sourcepb.HealRequest) (*sourcepb.HealResponse, error) {
	if req.Topology {
		if req.Server != "" || req.Tablet != "" {
			return nil, errBadRequest("topology", "heals the topology only; give no server or tablet")
		}
		s.c.healTopology()
		return &sourcepb.HealResponse{}, nil
	}
	ts, err := s.c.serverFor(req.Server, req.Tablet)
	if err != nil {
		return nil, err
	}
	return &sourcepb.HealResponse{}, ts.heal(req.Tablet)
}

// serverFor finds a server, and checks that it holds the tablet if given.
func (c *Cluster) serverFor(alias, tabletID string) (*tabletServer, error) {
	c.mu.RLock()
	ts := c.byAlias[alias]
	c.mu.RUnlock()
	if ts == nil {
		return nil, errUnknownServer(alias)
	}
	if tabletID != "" {
		if _, _, err := c.replicaOn(tabletID, ts); err != nil {
			return nil, err
		}
	}
	return ts, nil
}

func (s *adminService) Split(_ context.Context, req *sourcepb.SplitRequest) (*sourcepb.SplitResponse, error) {
	children, handoff, err := s.c.Split(req.Tablet)
	if err != nil {
		return nil, err
	}
	return &sourcepb.SplitResponse{Children: children, HandoffCheckpoint: handoff}, nil
}

func (s *adminService) Digest(_ context.Context, req *sourcepb.DigestRequest) (*sourcepb.DigestResponse, error) {
	per, err := s.c.Digest(req.Stream)
	if err != nil {
		return nil, err
	}
	out := &sourcepb.DigestResponse{Tablets: map[string]*sourcepb.TabletDigest{}}
	for id, d := range per {
		out.Records += d.Records
		out.Hash += d.Hash
		out.Tablets[id] = &sourcepb.TabletDigest{Records: d.Records, Hash: d.Hash}
	}
	return out, nil
}

// Digest returns, per tablet, the digest of every record produced, or with
// a stream ID, of the records that stream is due from its start positions.
func (c *Cluster) Digest(streamID string) (map[string]digest.Digest, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if streamID != "" {
		s := c.streams[streamID]
		if s == nil {
			return nil, errUnknownStream(streamID)
		}
		return c.streamDigest(s), nil
	}
	out := map[string]digest.Digest{}
	for id, t := range c.tablets {
		t.log.mu.Lock()
		out[id] = t.log.digestUpTo(t.log.last(), nil)
		t.log.mu.Unlock()
	}
	return out, nil
}

func (s *adminService) Rows(_ context.Context, req *sourcepb.RowsRequest) (*sourcepb.RowsResponse, error) {
	rows, err := s.c.Rows(req.Table, req.Tablet)
	if err != nil {
		return nil, err
	}
	return &sourcepb.RowsResponse{Rows: rows}, nil
}

func (s *adminService) Tail(req *sourcepb.TailRequest, out grpc.ServerStreamingServer[sourcepb.Record]) error {
	c := s.c
	c.mu.RLock()
	t := c.tablets[req.Tablet]
	c.mu.RUnlock()
	if t == nil {
		return errUnknownTablet(req.Tablet)
	}
	from, err := parseCheckpoint("from", req.From)
	if err != nil {
		return err
	}
	l := t.log
	l.mu.Lock()
	idx := l.last()
	l.mu.Unlock()
	if !from.IsZero() {
		c.mu.RLock()
		idx, err = resolve(t, from)
		c.mu.RUnlock()
		if err != nil {
			return err
		}
	}
	ctx := out.Context()
	for {
		l.mu.Lock()
		idx = max(idx, l.start) // tail is best effort: freed history is skipped
		recs := l.read(idx, l.last(), 1000)
		idx += uint64(len(recs))
		more := len(recs) > 0
		// A resync's copy is its stream's own, not the tablet's changes.
		recs = slices.DeleteFunc(recs, func(r *sourcepb.Record) bool { return isCopyOp(r.Op) })
		ended := l.closed && idx >= l.splitAt
		notify := l.notify
		l.mu.Unlock()
		for _, r := range recs {
			if err := out.Send(r); err != nil {
				return err
			}
		}
		if ended {
			return nil
		}
		if more {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-notify:
		}
	}
}
