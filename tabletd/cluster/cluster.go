// Package cluster is tabletd's reference tablet cluster: tablet servers in
// cells, each with its own loopback gRPC listener, tablets with key ranges
// and replicas (a leader and lagging followers), a write workload,
// per-stream checkpoints with retention and expiry, splits, fault injection
// and a digest of everything produced. It serves the source protocol in
// proto/source.proto.
package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// Config sizes a cluster. Zero fields take the defaults in DefaultConfig.
type Config struct {
	// Listen is the topology and admin address. Tablet servers listen on
	// free ports of the same host.
	Listen string
	// AdvertiseHost, if set, is the host the topology reports for tablet
	// servers (e.g. a container's name when Listen is 0.0.0.0).
	AdvertiseHost  string
	Keyspace       string
	Cells          []string
	ServersPerCell int
	Tablets        int
	Replicas       int
	// Rate is the workload's records per second; 0 starts it paused.
	Rate float64
	// Lag is how far followers trail the leader.
	Lag time.Duration
	// Retention is how long a (stream, tablet) may stay inactive, and how
	// much history is kept when no stream holds it.
	Retention time.Duration
	// Seed makes the workload reproducible; 0 picks one from the clock.
	Seed   int64
	Logger *zap.Logger
	// TLS, if set, is how the topology, admin and every tablet server
	// serve (with ClientCAs: mutual TLS); nil serves plaintext.
	TLS *tls.Config
	// Token, if set, is the bearer token every call must carry
	// ("authorization: Bearer <Token>"); others get UNAUTHENTICATED.
	Token string
}

// DefaultConfig returns the defaults of `tabletd serve`.
func DefaultConfig() Config {
	return Config{
		Listen:         "127.0.0.1:15991",
		Keyspace:       "commerce",
		Cells:          []string{"zone1", "zone2", "zone3"},
		ServersPerCell: 2,
		Tablets:        8,
		Replicas:       3,
		Rate:           200,
		Lag:            50 * time.Millisecond,
		Retention:      time.Hour,
	}
}

// maxTablets bounds Config.Tablets: IDs t-0001…t-9999 keep four digits
// (and their order); bench/scale runs 5000.
const maxTablets = 9999

// Validate checks a config, naming the field at fault.
func (c Config) Validate() error {
	switch {
	case c.Keyspace == "":
		return errors.New("keyspace: must not be empty")
	case len(c.Cells) == 0:
		return errors.New("cells: must not be empty")
	case c.ServersPerCell < 1 || c.ServersPerCell > 99:
		return fmt.Errorf("servers-per-cell: %d not in [1, 99]", c.ServersPerCell)
	case c.Tablets < 1 || c.Tablets > maxTablets:
		return fmt.Errorf("tablets: %d not in [1, %d]", c.Tablets, maxTablets)
	case c.Replicas < 1 || c.Replicas > len(c.Cells)*c.ServersPerCell:
		return fmt.Errorf("replicas: %d not in [1, cells × servers-per-cell = %d]", c.Replicas, len(c.Cells)*c.ServersPerCell)
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("rate: %v must be a number >= 0", c.Rate)
	case c.Lag < 0:
		return fmt.Errorf("lag: %v must be >= 0", c.Lag)
	case c.Retention <= 0:
		return fmt.Errorf("retention: %v must be > 0", c.Retention)
	}
	seen := map[string]bool{}
	for _, cell := range c.Cells {
		if cell == "" || seen[cell] {
			return fmt.Errorf("cells: %q empty or repeated", cell)
		}
		seen[cell] = true
	}
	return nil
}

// Cluster is a running reference cluster.
type Cluster struct {
	cfg Config
	log *zap.Logger

	mu       sync.RWMutex
	servers  []*tabletServer // ordered by alias
	byAlias  map[string]*tabletServer
	tablets  map[string]*tablet
	order    []string  // tablet IDs in creation order
	active   []*tablet // tablets taking writes, in key order
	nextID   int
	streams  map[string]*stream
	workload *workload

	topoFault topologyFault

	admin    *grpc.Server
	adminLis net.Listener
	stop     chan struct{}
	wg       sync.WaitGroup
	now      func() time.Time
}

// tablet is one partition of the keyspace and the replicas serving it.
type tablet struct {
	id       string
	parent   string
	keyStart uint64
	keyEnd   uint64 // exclusive; 0 = end of the key space
	replicas []replicaPlace
	children []string
	log      *tabletLog
}

// replicaPlace is a replica's server and type.
type replicaPlace struct {
	server *tabletServer
	typ    sourcepb.TabletType
}

func (t *tablet) contains(h uint64) bool {
	return h >= t.keyStart && (t.keyEnd == 0 || h < t.keyEnd)
}

// New builds a cluster from cfg; Start makes it serve.
func New(cfg Config) (*Cluster, error) {
	def := DefaultConfig()
	if cfg.Listen == "" {
		cfg.Listen = def.Listen
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	c := &Cluster{
		cfg:     cfg,
		log:     cfg.Logger,
		byAlias: map[string]*tabletServer{},
		tablets: map[string]*tablet{},
		streams: map[string]*stream{},
		stop:    make(chan struct{}),
		now:     time.Now,
	}
	for ci, cell := range cfg.Cells {
		for s := 1; s <= cfg.ServersPerCell; s++ {
			ts := &tabletServer{
				cluster: c,
				alias:   fmt.Sprintf("%s-%010d", cell, (ci+1)*100+s),
				cell:    cell,
				faults:  map[string]*fault{},
			}
			c.servers = append(c.servers, ts)
			c.byAlias[ts.alias] = ts
		}
	}
	width := math.MaxUint64/uint64(cfg.Tablets) + 1
	for i := 0; i < cfg.Tablets; i++ {
		t := &tablet{
			id:       c.newTabletID(),
			keyStart: uint64(i) * width,
			log:      newTabletLog(1, 0),
		}
		if i < cfg.Tablets-1 {
			t.keyEnd = uint64(i+1) * width
		}
		t.replicas = c.place(i)
		c.addTablet(t)
	}
	c.refreshActive()
	c.workload = newWorkload(c, cfg.Rate, cfg.Seed)
	return c, nil
}

func (c *Cluster) newTabletID() string {
	c.nextID++
	return fmt.Sprintf("t-%04d", c.nextID)
}

func (c *Cluster) addTablet(t *tablet) {
	c.tablets[t.id] = t
	c.order = append(c.order, t.id)
}

// place picks distinct servers for tablet i's replicas, spreading them over
// cells: replica j goes to cell (i+j) mod cells. The first is the PRIMARY;
// odd ones are REPLICA, the others RDONLY.
func (c *Cluster) place(i int) []replicaPlace {
	cells := len(c.cfg.Cells)
	spc := c.cfg.ServersPerCell
	used := map[*tabletServer]bool{}
	var out []replicaPlace
	for j := 0; len(out) < c.cfg.Replicas; j++ {
		cell := (i + j) % cells
		slot := (i/cells + j/cells) % spc
		ts := c.servers[cell*spc+slot]
		for used[ts] { // R <= servers, so a free one exists
			slot = (slot + 1) % spc
			ts = c.servers[cell*spc+slot]
			if slot == (i/cells+j/cells)%spc {
				break
			}
		}
		if used[ts] {
			continue
		}
		used[ts] = true
		typ := sourcepb.TabletType_RDONLY
		switch {
		case len(out) == 0:
			typ = sourcepb.TabletType_PRIMARY
		case len(out)%2 == 1:
			typ = sourcepb.TabletType_REPLICA
		}
		out = append(out, replicaPlace{server: ts, typ: typ})
	}
	return out
}

// Start opens every listener and starts the workload and the retention
// loop. It returns once everything listens.
func (c *Cluster) Start() error {
	lis, err := net.Listen("tcp", c.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", c.cfg.Listen, err)
	}
	c.adminLis = lis
	c.admin = grpc.NewServer(c.serverOptions(
		[]grpc.UnaryServerInterceptor{c.topologyUnary}, []grpc.StreamServerInterceptor{c.topologyStream})...)
	sourcepb.RegisterTopologyServer(c.admin, &topologyService{c: c})
	sourcepb.RegisterAdminServer(c.admin, &adminService{c: c})
	host, _, _ := net.SplitHostPort(lis.Addr().String())
	for _, ts := range c.servers {
		if err := ts.up(net.JoinHostPort(host, "0")); err != nil {
			c.Close()
			return err
		}
	}
	c.wg.Add(2)
	go func() { defer c.wg.Done(); _ = c.admin.Serve(lis) }()
	go func() { defer c.wg.Done(); c.retentionLoop() }()
	c.workload.start()
	c.log.Info("tabletd serving", zap.String("listen", lis.Addr().String()),
		zap.String("keyspace", c.cfg.Keyspace), zap.Int("tablets", c.cfg.Tablets),
		zap.Int("servers", len(c.servers)))
	return nil
}

// Addr returns the topology and admin address.
func (c *Cluster) Addr() string { return c.adminLis.Addr().String() }

// Close stops the workload and every server.
func (c *Cluster) Close() {
	select {
	case <-c.stop:
		return
	default:
	}
	close(c.stop)
	c.workload.close()
	if c.admin != nil {
		c.admin.Stop()
	}
	c.mu.Lock()
	for _, ts := range c.servers {
		ts.down()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// refreshActive recomputes the tablets taking writes, in key order.
// Callers hold mu.
func (c *Cluster) refreshActive() {
	c.active = c.active[:0]
	for _, id := range c.order {
		if t := c.tablets[id]; len(t.children) == 0 {
			c.active = append(c.active, t)
		}
	}
	sort.Slice(c.active, func(i, j int) bool { return c.active[i].keyStart < c.active[j].keyStart })
}

// Write appends n records from the workload's generator at once, whatever
// the workload's state: tests and benchmarks use it for exact volumes.
func (c *Cluster) Write(n int) {
	c.workload.write(n)
}

// WriteTo appends n records to one tablet (keys are drawn until they hash
// into it). It is for benchmarks that read one replica.
func (c *Cluster) WriteTo(tabletID string, n int) error {
	return c.workload.writeTo(tabletID, n)
}

// Split closes a tablet's log and creates two children continuing it.
func (c *Cluster) Split(id string) (children []string, handoff string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.tablets[id]
	if t == nil {
		return nil, "", errUnknownTablet(id)
	}
	if len(t.children) > 0 {
		return nil, "", errf(codeFailedPrecondition, sourcepb.Reason_BAD_REQUEST, "tablet", "tablet %s already split", id)
	}
	// Appends that raced with the close fail and are routed again, to the
	// children, once this lock is released.
	at := t.log.close()
	size := t.keyEnd - t.keyStart // wraps to the right size when keyEnd is 0
	mid := t.keyStart + size/2
	if size == 0 { // the whole key space
		mid = 1 << 63
	}
	left := &tablet{id: c.newTabletID(), parent: id, keyStart: t.keyStart, keyEnd: mid,
		replicas: t.replicas, log: newTabletLog(t.log.term+1, at)}
	right := &tablet{id: c.newTabletID(), parent: id, keyStart: mid, keyEnd: t.keyEnd,
		replicas: t.replicas, log: newTabletLog(t.log.term+1, at)}
	c.addTablet(left)
	c.addTablet(right)
	t.children = []string{left.id, right.id}
	c.refreshActive()
	hand := t.log.position(at)
	for _, s := range c.streams {
		s.addChildren(t, []*tablet{left, right}, hand, c.now())
	}
	c.log.Info("tablet split", zap.String("tablet", id), zap.Strings("children", t.children),
		zap.String("handoff", hand.String()))
	return t.children, hand.String(), nil
}

func timestamp(nanos int64) *timestamppb.Timestamp {
	return &timestamppb.Timestamp{Seconds: nanos / 1e9, Nanos: int32(nanos % 1e9)}
}

// recordHash is the digest hash of a record as tabletd sends it.
func recordHash(r *sourcepb.Record) uint64 {
	return digest.Hash(digest.Fields{
		Tablet:     r.Tablet,
		Position:   r.Position,
		Table:      r.Table,
		Op:         opName(r.Op),
		Key:        r.Key,
		Before:     r.Before,
		After:      r.After,
		CommitTime: r.CommitTime.AsTime(),
	})
}

// opName is the JSONL and digest name of an op.
func opName(op sourcepb.Op) string {
	switch op {
	case sourcepb.Op_INSERT:
		return "insert"
	case sourcepb.Op_UPDATE:
		return "update"
	case sourcepb.Op_DELETE:
		return "delete"
	case sourcepb.Op_READ:
		return string(source.Read)
	case sourcepb.Op_RESYNC_BEGIN:
		return string(source.ResyncBegin)
	case sourcepb.Op_RESYNC_END:
		return string(source.ResyncEnd)
	}
	return "unknown"
}
