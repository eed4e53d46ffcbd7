package vitess

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"
	queryservicepb "vitess.io/vitess/go/vt/proto/queryservice"
	tabletmanagerdatapb "vitess.io/vitess/go/vt/proto/tabletmanagerdata"
	topodatapb "vitess.io/vitess/go/vt/proto/topodata"
	vtctldatapb "vitess.io/vitess/go/vt/proto/vtctldata"
	vtctlservicepb "vitess.io/vitess/go/vt/proto/vtctlservice"
)

// A fake Vitess over loopback gRPC: a vtctld answering the topology calls
// the adapter makes, and vttablets answering StreamHealth and VStream as
// each test scripts them. It stands for the servers' protocol only; the
// real cluster's behaviour is the e2e tests'.

type fakeVitess struct {
	t        *testing.T
	keyspace string
	vtctld   string
	tables   []string // the keyspace's schema
	mu       sync.Mutex
	shards   map[string]*topodatapb.KeyRange
	tablets  []*fakeTablet
}

// fakeTablet is one vttablet.
type fakeTablet struct {
	queryservicepb.UnimplementedQueryServer
	alias *topodatapb.TabletAlias
	shard string
	addr  string
	srv   *grpc.Server

	mu     sync.Mutex
	typ    topodatapb.TabletType
	health *querypb.StreamHealthResponse
	// vstream answers a VStream (nil: stream nothing until cancelled).
	vstream  func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error
	requests []*binlogdatapb.VStreamRequest
}

func newFakeVitess(t *testing.T, shards ...string) *fakeVitess {
	f := &fakeVitess{t: t, keyspace: "commerce", tables: []string{"customer", "corder"}, shards: map[string]*topodatapb.KeyRange{}}
	for _, s := range shards {
		f.shards[s] = keyRange(s)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	vtctlservicepb.RegisterVtctldServer(srv, &fakeVtctld{f: f})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	f.vtctld = lis.Addr().String()
	return f
}

// keyRange parses a shard name ("-80", "80-", "0") as Vitess does.
func keyRange(shard string) *topodatapb.KeyRange {
	lo, hi, ok := cutDash(shard)
	if !ok {
		return nil
	}
	kr := &topodatapb.KeyRange{}
	if lo != "" {
		kr.Start = hexBytes(lo)
	}
	if hi != "" {
		kr.End = hexBytes(hi)
	}
	return kr
}

func cutDash(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '-' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}

func hexBytes(s string) []byte {
	var b []byte
	for i := 0; i+1 < len(s); i += 2 {
		v, _ := strconv.ParseUint(s[i:i+2], 16, 8)
		b = append(b, byte(v))
	}
	return b
}

// tablet starts a vttablet of a shard, serving and healthy.
func (f *fakeVitess) tablet(cell string, uid uint32, shard string, typ topodatapb.TabletType) *fakeTablet {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(f.t, err)
	ft := &fakeTablet{alias: &topodatapb.TabletAlias{Cell: cell, Uid: uid}, shard: shard, typ: typ, addr: lis.Addr().String(), srv: grpc.NewServer()}
	ft.health = &querypb.StreamHealthResponse{Target: &querypb.Target{Keyspace: f.keyspace, Shard: shard, TabletType: typ},
		Serving: true, TabletAlias: ft.alias, RealtimeStats: &querypb.RealtimeStats{}}
	queryservicepb.RegisterQueryServer(ft.srv, ft)
	go func() { _ = ft.srv.Serve(lis) }()
	f.t.Cleanup(ft.srv.Stop)
	f.mu.Lock()
	f.tablets = append(f.tablets, ft)
	f.mu.Unlock()
	return ft
}

func (ft *fakeTablet) setVStream(fn func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.vstream = fn
}

// tabletType is the vttablet's type now.
func (ft *fakeTablet) tabletType() topodatapb.TabletType {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return ft.typ
}

// setType changes the vttablet's type (a reparent).
func (ft *fakeTablet) setType(typ topodatapb.TabletType) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.typ = typ
	ft.health.Target.TabletType = typ
}

func (ft *fakeTablet) setHealth(fn func(h *querypb.StreamHealthResponse)) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	fn(ft.health)
}

func (ft *fakeTablet) vstreams() []*binlogdatapb.VStreamRequest {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return append([]*binlogdatapb.VStreamRequest(nil), ft.requests...)
}

func (ft *fakeTablet) StreamHealth(_ *querypb.StreamHealthRequest, stream queryservicepb.Query_StreamHealthServer) error {
	ft.mu.Lock()
	h := ft.health.CloneVT()
	ft.mu.Unlock()
	if err := stream.Send(h); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// VStream checks the target as a vttablet does, then runs the script.
func (ft *fakeTablet) VStream(req *binlogdatapb.VStreamRequest, stream queryservicepb.Query_VStreamServer) error {
	ft.mu.Lock()
	ft.requests = append(ft.requests, req.CloneVT())
	fn, typ := ft.vstream, ft.typ
	ft.mu.Unlock()
	if req.GetTarget().GetTabletType() != typ || req.GetTarget().GetShard() != ft.shard {
		return status.Errorf(codes.FailedPrecondition, "invalid target: wrong tablet type: %v, want: %v", req.GetTarget().GetTabletType(), typ)
	}
	if fn == nil {
		<-stream.Context().Done()
		return nil
	}
	err := fn(req, func(evs ...*binlogdatapb.VEvent) error {
		return stream.Send(&binlogdatapb.VStreamResponse{Events: evs})
	})
	if errors.Is(err, errHold) {
		<-stream.Context().Done()
		return nil
	}
	return err
}

// errHold: a script returns it to keep its stream open, sending nothing
// more, until the client goes.
var errHold = errors.New("hold the stream open")

// fakeVtctld answers from the fake's shards and tablets.
type fakeVtctld struct {
	vtctlservicepb.UnimplementedVtctldServer
	f *fakeVitess
}

func (v *fakeVtctld) GetKeyspace(_ context.Context, req *vtctldatapb.GetKeyspaceRequest) (*vtctldatapb.GetKeyspaceResponse, error) {
	if req.Keyspace != v.f.keyspace {
		return nil, status.Errorf(codes.NotFound, "node doesn't exist: keyspaces/%s/Keyspace", req.Keyspace)
	}
	return &vtctldatapb.GetKeyspaceResponse{Keyspace: &vtctldatapb.Keyspace{Name: req.Keyspace, Keyspace: &topodatapb.Keyspace{}}}, nil
}

func (v *fakeVtctld) FindAllShardsInKeyspace(_ context.Context, req *vtctldatapb.FindAllShardsInKeyspaceRequest) (*vtctldatapb.FindAllShardsInKeyspaceResponse, error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	out := &vtctldatapb.FindAllShardsInKeyspaceResponse{Shards: map[string]*vtctldatapb.Shard{}}
	for name, kr := range v.f.shards {
		sh := &topodatapb.Shard{KeyRange: kr, IsPrimaryServing: true}
		for _, t := range v.f.tablets {
			if t.shard == name && t.tabletType() == topodatapb.TabletType_PRIMARY {
				sh.PrimaryAlias = t.alias
			}
		}
		out.Shards[name] = &vtctldatapb.Shard{Keyspace: req.Keyspace, Name: name, Shard: sh}
	}
	return out, nil
}

func (v *fakeVtctld) GetTablets(_ context.Context, req *vtctldatapb.GetTabletsRequest) (*vtctldatapb.GetTabletsResponse, error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	out := &vtctldatapb.GetTabletsResponse{}
	for _, t := range v.f.tablets {
		host, port, _ := net.SplitHostPort(t.addr)
		p, _ := strconv.Atoi(port)
		t.mu.Lock()
		out.Tablets = append(out.Tablets, &topodatapb.Tablet{Alias: t.alias, Hostname: host, Keyspace: req.Keyspace, Shard: t.shard,
			Type: t.typ, PortMap: map[string]int32{"grpc": int32(p), "vt": int32(p + 1)}})
		t.mu.Unlock()
	}
	return out, nil
}

func (v *fakeVtctld) GetSchema(_ context.Context, req *vtctldatapb.GetSchemaRequest) (*vtctldatapb.GetSchemaResponse, error) {
	sd := &tabletmanagerdatapb.SchemaDefinition{}
	for _, t := range v.f.tables {
		sd.TableDefinitions = append(sd.TableDefinitions, &tabletmanagerdatapb.TableDefinition{Name: t})
	}
	return &vtctldatapb.GetSchemaResponse{Schema: sd}, nil
}

// source opens the adapter on the fake.
func (f *fakeVitess) source(tables ...string) *Source {
	s, err := New(Config{Kind: "vitess", VTCtld: f.vtctld, Keyspace: f.keyspace, Tables: tables}, nil)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = s.Close() })
	return s
}
