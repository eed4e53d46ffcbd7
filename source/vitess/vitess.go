// Package vitess is the Source adapter for Vitess: each shard of the
// keyspace is a tablet, and the shard's vttablets (PRIMARY, REPLICA,
// RDONLY) are its replicas, named by their tablet alias as `vtctldclient
// GetTablets` prints it ("zone2-0000000101").
//
// Topology comes from vtctld's gRPC API (GetKeyspace,
// FindAllShardsInKeyspace, GetTablets, and GetSchema to check the tables
// a stream names); each vttablet's health and replication lag from its
// own StreamHealth. A replica is read with that vttablet's own VStream
// (queryservice), the target being the keyspace, the shard and the
// tablet's type, so the picker's choice is the tablet that serves.
//
// Positions: a shard's position is its GTID position as Vitess encodes it
// ("MariaDB/0-100-57", "MySQL56/<uuid>:1-57"). A checkpoint keeps it whole
// as its Opaque part, with the number of transactions it holds as Term
// and the records the last transaction delivered as Index
// ("57.3@MariaDB/0-100-57"); a record's position is (Term, its ordinal in
// the transaction from 1), without the GTID. So positions are unique and
// ordered per shard, a checkpoint is always a transaction's end, and it
// means the same on every vttablet of the shard. A checkpoint may also
// advance to (Term, 0) at a transaction that delivered nothing (its rows
// were of other tables) or a DDL.
//
// Nothing is kept on the servers: a stream has no server-side state, so
// DeleteStream has nothing to drop and Ack nothing to tell, and the
// history a stream can read is what each vttablet's binary logs still
// hold. startFrom "latest" starts a shard at its position when its tablet
// is first read; "snapshot" with a copy of its tables (copy.go);
// "earliest" is refused. A Reshard's journal splits a shard into the new
// shards that overlap it (journal.go).
package vitess

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	querypb "vitess.io/vitess/go/vt/proto/query"
	queryservicepb "vitess.io/vitess/go/vt/proto/queryservice"
	topodatapb "vitess.io/vitess/go/vt/proto/topodata"
	vtctldatapb "vitess.io/vitess/go/vt/proto/vtctldata"
	vtctlservicepb "vitess.io/vitess/go/vt/proto/vtctlservice"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// Bounds of the adapter's own calls.
const (
	// topoTimeout bounds one vtctld call.
	topoTimeout = 10 * time.Second
	// healthTimeout bounds waiting for a vttablet's first health message.
	healthTimeout = 2 * time.Second
	// healthTTL: ListTablets answers from its last look for this long
	// (every tablet's selection lists the topology).
	healthTTL = time.Second
	// maxRecvMsgSize: a VStream response holds a packet of events (about
	// 250 KB by default) or one row larger than that.
	maxRecvMsgSize = 256 << 20
)

// Source is a Vitess keyspace. It is safe for concurrent use.
type Source struct {
	cfg    Config
	opts   []grpc.DialOption
	topo   *grpc.ClientConn
	vtctld vtctlservicepb.VtctldClient

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn

	listMu  sync.Mutex
	listing []source.Tablet
	listed  time.Time
}

var _ source.Source = (*Source)(nil)

// dialOptions secure the connections to vtctld and every vttablet alike.
type dialOptions struct {
	tls                tlsfiles.Files
	username, password string
}

// New makes a Source from a validated config, reading the static auth
// password from the environment variable it names (getenv nil:
// os.Getenv). It does not connect.
func New(cfg Config, getenv func(string) string) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, config.InSection("source", err)
	}
	o, err := cfg.options(getenv)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if !o.tls.IsZero() {
		tc, err := o.tls.Client()
		if err != nil {
			return nil, fmt.Errorf("source.tls: %w", err)
		}
		creds = credentials.NewTLS(tc)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// A vttablet that comes back is used again within a second or so.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
	}
	if o.username != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(staticAuth{user: o.username, password: o.password, secure: !o.tls.IsZero()}))
	}
	topo, err := grpc.NewClient(cfg.VTCtld, opts...)
	if err != nil {
		return nil, fmt.Errorf("source.vtctld: %w", err)
	}
	return &Source{cfg: cfg, opts: opts, topo: topo, vtctld: vtctlservicepb.NewVtctldClient(topo), conns: map[string]*grpc.ClientConn{}}, nil
}

// staticAuth sends a user of Vitess's static gRPC authentication with
// every call, as Vitess's own clients do (metadata username, password).
type staticAuth struct {
	user, password string
	secure         bool
}

func (a staticAuth) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"username": a.user, "password": a.password}, nil
}

// RequireTransportSecurity is false without TLS so that static auth still
// works on a trusted plaintext network, as Vitess's clients allow.
func (a staticAuth) RequireTransportSecurity() bool { return a.secure }

// Close closes every connection.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr, c := range s.conns {
		_ = c.Close()
		delete(s.conns, addr)
	}
	return s.topo.Close()
}

// Classify is the package's Classify.
func (s *Source) Classify(err error) source.Classification { return Classify(err) }

// conn returns the shared connection to a vttablet's gRPC address.
func (s *Source) conn(addr string) (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, s.opts...)
	if err != nil {
		return nil, fmt.Errorf("dial vttablet %s: %w", addr, err)
	}
	s.conns[addr] = c
	return c, nil
}

// query returns the queryservice client of a vttablet.
func (s *Source) query(addr string) (queryservicepb.QueryClient, error) {
	c, err := s.conn(addr)
	if err != nil {
		return nil, err
	}
	return queryservicepb.NewQueryClient(c), nil
}

// EnsureStream checks that the keyspace exists and has every table the
// stream names, and returns the stream. Nothing is made on the servers,
// so it is idempotent. startFrom "latest" starts a shard at its position
// when its tablet is first read, "snapshot" with a copy of its tables
// there (see copy.go); "earliest" is refused.
func (s *Source) EnsureStream(ctx context.Context, spec source.StreamSpec) (source.Stream, error) {
	if spec.StartFrom != source.StartLatest && spec.StartFrom != source.StartSnapshot {
		return source.Stream{}, newError(source.Fatal, "START_FROM",
			"startFrom %q: a vitess stream starts from each shard's current position or a copy of its tables: set \"startFrom\": \"latest\" or \"snapshot\" (Vitess keeps no history for a stream: a vttablet's binary logs are purged by its own settings, so the oldest change that can be read differs from one vttablet to the next)", spec.StartFrom)
	}
	tctx, cancel := context.WithTimeout(ctx, topoTimeout)
	defer cancel()
	if _, err := s.vtctld.GetKeyspace(tctx, &vtctldatapb.GetKeyspaceRequest{Keyspace: s.cfg.Keyspace}); err != nil {
		if status.Code(err) == codes.NotFound {
			return source.Stream{}, newError(source.Fatal, "KEYSPACE_NOT_FOUND", "keyspace %q: not in the topology vtctld %s reads", s.cfg.Keyspace, s.cfg.VTCtld)
		}
		return source.Stream{}, fmt.Errorf("get keyspace %s: %w", s.cfg.Keyspace, err)
	}
	if err := s.checkTables(ctx, spec.Tables); err != nil {
		return source.Stream{}, err
	}
	return source.Stream{ID: spec.ID, Tables: spec.Tables, StartFrom: spec.StartFrom, Created: time.Now().UTC().Truncate(time.Second),
		Start: map[string]source.Checkpoint{}}, nil
}

// checkTables fails (TABLE_NOT_FOUND) when a table the stream names is
// not in the keyspace, as one vttablet's schema says (the first of each
// shard's primary, then its other tablets, that answers): a table named
// wrong would otherwise stream nothing, silently.
func (s *Source) checkTables(ctx context.Context, tables []string) error {
	if len(tables) == 0 {
		return nil
	}
	tctx, cancel := context.WithTimeout(ctx, topoTimeout)
	defer cancel()
	shards, err := s.vtctld.FindAllShardsInKeyspace(tctx, &vtctldatapb.FindAllShardsInKeyspaceRequest{Keyspace: s.cfg.Keyspace})
	if err != nil {
		return fmt.Errorf("shards of %s: %w", s.cfg.Keyspace, err)
	}
	ts, err := s.vtctld.GetTablets(tctx, &vtctldatapb.GetTabletsRequest{Keyspace: s.cfg.Keyspace})
	if err != nil {
		return fmt.Errorf("tablets of %s: %w", s.cfg.Keyspace, err)
	}
	var aliases []*topodatapb.TabletAlias
	for _, sh := range shards.GetShards() {
		if p := sh.GetShard().GetPrimaryAlias(); p != nil {
			aliases = append(aliases, p)
		}
	}
	for _, t := range ts.GetTablets() {
		aliases = append(aliases, t.GetAlias())
	}
	lastErr := fmt.Errorf("keyspace %s has no tablet to read its schema from", s.cfg.Keyspace)
	for _, a := range aliases {
		have, err := s.schemaTables(tctx, a)
		if err != nil {
			lastErr = err
			continue
		}
		var missing []string
		for _, t := range tables {
			if !slices.Contains(have, t) {
				missing = append(missing, t)
			}
		}
		if len(missing) > 0 {
			return newError(source.Fatal, "TABLE_NOT_FOUND", "source.tables: %q not in keyspace %s (schema of %s)", missing, s.cfg.Keyspace, aliasString(a))
		}
		return nil
	}
	return lastErr
}

// schemaTables returns the tables (not the views) of the keyspace's
// database on one vttablet, as vtctld reads its schema.
func (s *Source) schemaTables(ctx context.Context, a *topodatapb.TabletAlias) ([]string, error) {
	resp, err := s.vtctld.GetSchema(ctx, &vtctldatapb.GetSchemaRequest{TabletAlias: a, TableNamesOnly: true})
	if err != nil {
		return nil, fmt.Errorf("schema of %s on %s: %w", s.cfg.Keyspace, aliasString(a), err)
	}
	var out []string
	for _, td := range resp.GetSchema().GetTableDefinitions() {
		if td.GetType() == "" || td.GetType() == baseTable {
			out = append(out, td.GetName())
		}
	}
	return out, nil
}

// baseTable is a table's type in a schema, as against a view's.
const baseTable = "BASE TABLE"

// tablesOf returns the tables of the keyspace on a replica's vttablet.
func (s *Source) tablesOf(ctx context.Context, rep source.Replica) ([]string, error) {
	cell, uid, ok := strings.Cut(rep.Alias, "-")
	n, err := strconv.ParseUint(uid, 10, 32)
	if !ok || err != nil {
		return nil, fmt.Errorf("%w: %q is not a Vitess tablet alias", source.ErrUnknownReplica, rep.Alias)
	}
	tctx, cancel := context.WithTimeout(ctx, topoTimeout)
	defer cancel()
	return s.schemaTables(tctx, &topodatapb.TabletAlias{Cell: cell, Uid: uint32(n)})
}

// DeleteStream has nothing to drop: a vitess stream keeps nothing on the
// servers.
func (s *Source) DeleteStream(context.Context, string) error { return nil }

// ListTablets returns the keyspace's shards, each with its vttablets of
// type PRIMARY, REPLICA or RDONLY and their health as each vttablet's
// StreamHealth says now: serving, healthy (no health error), its type
// and replication lag. A vttablet that does not answer is listed not
// serving and unhealthy. A shard whose key range lies inside another
// listed shard's (a Reshard's new shards beside their source) has that
// one as its Parent.
func (s *Source) ListTablets(ctx context.Context) ([]source.Tablet, error) {
	s.listMu.Lock()
	defer s.listMu.Unlock()
	if s.listing != nil && time.Since(s.listed) < healthTTL {
		return cloneTablets(s.listing), nil
	}
	tctx, cancel := context.WithTimeout(ctx, topoTimeout)
	defer cancel()
	shards, err := s.vtctld.FindAllShardsInKeyspace(tctx, &vtctldatapb.FindAllShardsInKeyspaceRequest{Keyspace: s.cfg.Keyspace})
	if err != nil {
		return nil, fmt.Errorf("shards of %s from vtctld %s: %w", s.cfg.Keyspace, s.cfg.VTCtld, err)
	}
	ts, err := s.vtctld.GetTablets(tctx, &vtctldatapb.GetTabletsRequest{Keyspace: s.cfg.Keyspace})
	if err != nil {
		return nil, fmt.Errorf("tablets of %s from vtctld %s: %w", s.cfg.Keyspace, s.cfg.VTCtld, err)
	}
	out := topology(shards.GetShards(), ts.GetTablets())
	var wg sync.WaitGroup
	for i := range out {
		for j := range out[i].Replicas {
			wg.Go(func() { s.health(ctx, &out[i].Replicas[j]) })
		}
	}
	wg.Wait()
	s.listing, s.listed = out, time.Now()
	return cloneTablets(out), nil
}

// topology builds the listing from vtctld's answers, before health: the
// shards in key range order, each with its PRIMARY, REPLICA and RDONLY
// vttablets by alias, listed not serving.
func topology(shards map[string]*vtctldatapb.Shard, tablets []*topodatapb.Tablet) []source.Tablet {
	type shardRange struct {
		name string
		kr   *topodatapb.KeyRange
	}
	var ranges []shardRange
	for name, sh := range shards {
		ranges = append(ranges, shardRange{name, sh.GetShard().GetKeyRange()})
	}
	slices.SortFunc(ranges, func(a, b shardRange) int {
		return cmp.Or(bytes.Compare(a.kr.GetStart(), b.kr.GetStart()), cmp.Compare(a.name, b.name))
	})
	out := make([]source.Tablet, len(ranges))
	index := map[string]int{}
	for i, r := range ranges {
		out[i] = source.Tablet{ID: r.name, Replicas: []source.Replica{}}
		index[r.name] = i
		for _, p := range ranges {
			if p.name != r.name && within(r.kr, p.kr) {
				out[i].Parent = p.name
			}
		}
	}
	for _, t := range tablets {
		i, ok := index[t.GetShard()]
		typ, known := tabletType(t.GetType())
		if !ok || !known {
			continue
		}
		rep := source.Replica{Tablet: t.GetShard(), Alias: aliasString(t.GetAlias()), Cell: t.GetAlias().GetCell(), Type: typ}
		if port, ok := t.GetPortMap()["grpc"]; ok && t.GetHostname() != "" {
			rep.Address = net.JoinHostPort(t.GetHostname(), strconv.Itoa(int(port)))
		}
		out[i].Replicas = append(out[i].Replicas, rep)
	}
	for i := range out {
		slices.SortFunc(out[i].Replicas, func(a, b source.Replica) int { return cmp.Compare(a.Alias, b.Alias) })
	}
	return out
}

// within reports whether key range a lies inside b and is not b: a shard
// of a Reshard beside the one it splits. Vitess's key ranges are
// [start, end), an empty end being the end of the key space.
func within(a, b *topodatapb.KeyRange) bool {
	aStart, aEnd, bStart, bEnd := a.GetStart(), a.GetEnd(), b.GetStart(), b.GetEnd()
	if bytes.Equal(aStart, bStart) && bytes.Equal(aEnd, bEnd) {
		return false
	}
	startOK := bytes.Compare(aStart, bStart) >= 0
	endOK := len(bEnd) == 0 || len(aEnd) != 0 && bytes.Compare(aEnd, bEnd) <= 0
	return startOK && endOK
}

// health fills a replica's health from its vttablet's first StreamHealth
// message (a vttablet sends its current state at once).
func (s *Source) health(ctx context.Context, rep *source.Replica) {
	if rep.Address == "" {
		return
	}
	q, err := s.query(rep.Address)
	if err != nil {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	stream, err := q.StreamHealth(hctx, &querypb.StreamHealthRequest{})
	if err != nil {
		return
	}
	h, err := stream.Recv()
	if err != nil {
		return
	}
	applyHealth(rep, h)
}

// applyHealth sets what a health message says of a replica.
func applyHealth(rep *source.Replica, h *querypb.StreamHealthResponse) {
	rep.Serving = h.GetServing()
	rep.Healthy = h.GetRealtimeStats().GetHealthError() == ""
	rep.Lag = time.Duration(h.GetRealtimeStats().GetReplicationLagSeconds()) * time.Second
	if typ, ok := tabletType(h.GetTarget().GetTabletType()); ok {
		rep.Type = typ
	}
}

// current returns a replica as the latest listing has it (its type may
// have changed since it was picked), or rep if not listed.
func (s *Source) current(ctx context.Context, rep source.Replica) source.Replica {
	tablets, err := s.ListTablets(ctx)
	if err != nil {
		return rep
	}
	for _, t := range tablets {
		if t.ID != rep.Tablet {
			continue
		}
		for _, r := range t.Replicas {
			if r.Alias == rep.Alias && r.Address != "" {
				return r
			}
		}
	}
	return rep
}

func cloneTablets(ts []source.Tablet) []source.Tablet {
	out := make([]source.Tablet, len(ts))
	for i, t := range ts {
		out[i] = t
		out[i].Replicas = slices.Clone(t.Replicas)
	}
	return out
}

// tabletType maps Vitess's tablet types to a replica's; the others (SPARE,
// BACKUP, RESTORE, DRAINED, EXPERIMENTAL) do not serve a stream.
func tabletType(t topodatapb.TabletType) (source.TabletType, bool) {
	switch t {
	case topodatapb.TabletType_PRIMARY:
		return source.TypePrimary, true
	case topodatapb.TabletType_REPLICA:
		return source.TypeReplica, true
	case topodatapb.TabletType_RDONLY:
		return source.TypeRDOnly, true
	}
	return "", false
}

// vitessType is a replica type as Vitess's target names it.
func vitessType(t source.TabletType) topodatapb.TabletType {
	switch t {
	case source.TypePrimary:
		return topodatapb.TabletType_PRIMARY
	case source.TypeRDOnly:
		return topodatapb.TabletType_RDONLY
	}
	return topodatapb.TabletType_REPLICA
}

// aliasString prints a tablet alias as Vitess does: <cell>-<uid>, the uid
// in ten digits ("zone2-0000000101").
func aliasString(a *topodatapb.TabletAlias) string {
	return fmt.Sprintf("%s-%010d", a.GetCell(), a.GetUid())
}

// OpenReplica returns a reader of one vttablet of a shard. It does not
// connect.
func (s *Source) OpenReplica(_ context.Context, rep source.Replica) (source.ReplicaReader, error) {
	if rep.Tablet == "" || rep.Alias == "" {
		return nil, fmt.Errorf("%w: %q of shard %q", source.ErrUnknownReplica, rep.Alias, rep.Tablet)
	}
	return &Reader{src: s, rep: rep}, nil
}

var errNoAddress = errors.New("the topology has no gRPC address for it")
