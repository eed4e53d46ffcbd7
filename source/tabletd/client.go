// Package tabletd is the Source adapter for tabletd, the reference tablet
// cluster (and any server of proto/source.proto).
package tabletd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// maxRecvMsgSize allows batches of up to 100,000 records of a few hundred
// bytes each.
const maxRecvMsgSize = 256 << 20

// The flow-control windows of a connection to tabletd and of each call
// on it (see dialOptions).
const (
	streamWindow = 8 << 20
	connWindow   = 32 << 20
)

// Client reaches a tabletd cluster: its topology address, and each tablet
// server's own address through one reused connection per address.
type Client struct {
	opts     []grpc.DialOption
	keyspace string
	topoConn *grpc.ClientConn
	topo     sourcepb.TopologyClient

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

var (
	_ source.Source   = (*Client)(nil)
	_ source.Resyncer = (*Client)(nil)
)

// dialOptions cap gRPC's reconnect backoff near 1 s, so that a server that
// comes back is used again quickly.
func dialOptions(creds credentials.TransportCredentials) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   time.Second,
			},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
		// Fixed flow-control windows, larger than any batch but the
		// largest, turn off gRPC's bandwidth-delay estimate, which pings
		// the server on every response received: a write and a read more
		// per read of a tablet, a tenth of an idle worker's CPU.
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
	}
}

// Bearer returns call credentials that send token with every call; secure
// makes gRPC refuse to send it over a plaintext connection.
func Bearer(token string, secure bool) credentials.PerRPCCredentials {
	return bearer{token: token, secure: secure}
}

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false without TLS so that a token still works
// on a trusted plaintext network (loopback, a test bed).
func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Credentials are the transport credentials for files: TLS (mutual when
// they name a client certificate), or plaintext when they name nothing.
func Credentials(files tlsfiles.Files) (credentials.TransportCredentials, error) {
	if files.IsZero() {
		return insecure.NewCredentials(), nil
	}
	cfg, err := files.Client()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// Options secure a client's connections: the same for the topology and
// every tablet server.
type Options struct {
	// TLS files: TLS (mutual with a client certificate) if they name any.
	TLS tlsfiles.Files
	// Token, if set, goes with every call as "authorization: Bearer
	// <token>" (tabletd serve --token-env checks it).
	Token string
}

// Dial returns a client for the cluster whose topology is at addr. It does
// not connect until the first call.
func Dial(addr, keyspace string, o Options) (*Client, error) {
	creds, err := Credentials(o.TLS)
	if err != nil {
		return nil, fmt.Errorf("source.tls: %w", err)
	}
	opts := dialOptions(creds)
	if o.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(Bearer(o.Token, !o.TLS.IsZero())))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial topology %s: %w", addr, err)
	}
	return &Client{
		opts:     opts,
		keyspace: keyspace,
		topoConn: conn,
		topo:     sourcepb.NewTopologyClient(conn),
		conns:    map[string]*grpc.ClientConn{},
	}, nil
}

// Topology returns the raw topology client, for tools.
func (c *Client) Topology() sourcepb.TopologyClient { return c.topo }

// Classify maps an error to an action; see the package function.
func (c *Client) Classify(err error) source.Classification { return Classify(err) }

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, conn := range c.conns {
		_ = conn.Close()
		delete(c.conns, addr)
	}
	return c.topoConn.Close()
}

// conn returns the shared connection to a tablet server.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn := c.conns[addr]; conn != nil {
		return conn, nil
	}
	conn, err := grpc.NewClient(addr, c.opts...)
	if err != nil {
		return nil, fmt.Errorf("dial tablet server %s: %w", addr, err)
	}
	c.conns[addr] = conn
	return conn, nil
}

// EnsureStream creates the stream if absent; tabletd's CreateStream is
// idempotent.
func (c *Client) EnsureStream(ctx context.Context, spec source.StreamSpec) (source.Stream, error) {
	start := sourcepb.StartFrom_EARLIEST
	switch spec.StartFrom {
	case source.StartEarliest, "":
	case source.StartLatest:
		start = sourcepb.StartFrom_LATEST
	default:
		return source.Stream{}, fmt.Errorf("start from: unknown value %q", spec.StartFrom)
	}
	s, err := c.topo.CreateStream(ctx, &sourcepb.CreateStreamRequest{
		Stream: spec.ID, Keyspace: c.keyspace, Tables: spec.Tables, StartFrom: start,
	})
	if err != nil {
		return source.Stream{}, fmt.Errorf("create stream %s: %w", spec.ID, err)
	}
	return fromStream(s)
}

func fromStream(s *sourcepb.Stream) (source.Stream, error) {
	out := source.Stream{
		ID:        s.Id,
		Tables:    s.Tables,
		StartFrom: source.StartEarliest,
		Created:   s.Created.AsTime(),
		Retention: s.Retention.AsDuration(),
		Start:     map[string]source.Checkpoint{},
	}
	if s.StartFrom == sourcepb.StartFrom_LATEST {
		out.StartFrom = source.StartLatest
	}
	for _, t := range s.Tablets {
		cp, err := source.ParseCheckpoint(t.Start)
		if err != nil {
			return source.Stream{}, fmt.Errorf("stream %s tablet %s start: %w", s.Id, t.Tablet, err)
		}
		out.Start[t.Tablet] = cp
	}
	return out, nil
}

// DeleteStream drops the stream; deleting an absent stream is not an error.
func (c *Client) DeleteStream(ctx context.Context, stream string) error {
	if _, err := c.topo.DeleteStream(ctx, &sourcepb.DeleteStreamRequest{Stream: stream}); err != nil {
		return fmt.Errorf("delete stream %s: %w", stream, err)
	}
	return nil
}

// Resync gives the stream a fresh start on the tablet with a copy of its
// rows (tabletd's ResyncStream): read from the returned checkpoint, the
// tablet delivers a ResyncBegin marker, its rows as Read records, a
// ResyncEnd marker, then its changes. The copy is tabletd's: its records
// are positions of the tablet's log, so a read resumes anywhere inside it.
// The id of the tablet's last resync returns that resync's checkpoint.
// An unknown stream or tablet (or one the stream does not cover) is
// NOT_FOUND with UNKNOWN_STREAM or UNKNOWN_TABLET, a split tablet
// INVALID_ARGUMENT: Classify calls both Fatal.
func (c *Client) Resync(ctx context.Context, stream, tablet, id string, _ source.Checkpoint) (source.Checkpoint, error) {
	resp, err := c.topo.ResyncStream(ctx, &sourcepb.ResyncStreamRequest{Stream: stream, Tablet: tablet, Id: id})
	if err != nil {
		return source.Checkpoint{}, fmt.Errorf("resync stream %s on tablet %s: %w", stream, tablet, err)
	}
	cp, err := source.ParseCheckpoint(resp.Start)
	if err != nil || cp.IsZero() {
		return source.Checkpoint{}, fmt.Errorf("resync stream %s on tablet %s: response start %q: %w", stream, tablet, resp.Start, source.ErrBadCheckpoint)
	}
	return cp, nil
}

// ListTablets returns every tablet with its replicas' current health.
func (c *Client) ListTablets(ctx context.Context) ([]source.Tablet, error) {
	resp, err := c.topo.ListTablets(ctx, &sourcepb.ListTabletsRequest{Keyspace: c.keyspace})
	if err != nil {
		return nil, fmt.Errorf("list tablets: %w", err)
	}
	out := make([]source.Tablet, 0, len(resp.Tablets))
	for _, t := range resp.Tablets {
		tab, err := fromTablet(t)
		if err != nil {
			return nil, err
		}
		out = append(out, tab)
	}
	return out, nil
}

// FromTablet converts a protocol tablet.
func fromTablet(t *sourcepb.Tablet) (source.Tablet, error) {
	out := source.Tablet{
		ID:       t.Id,
		Parent:   t.Parent,
		Split:    t.State == sourcepb.TabletState_SPLIT,
		Children: t.Children,
	}
	if out.Split {
		cp, err := source.ParseCheckpoint(t.SplitCheckpoint)
		if err != nil {
			return source.Tablet{}, fmt.Errorf("tablet %s split checkpoint: %w", t.Id, err)
		}
		out.SplitAt = cp
	}
	for _, r := range t.Replicas {
		out.Replicas = append(out.Replicas, source.Replica{
			Tablet:  t.Id,
			Alias:   r.Alias,
			Cell:    r.Cell,
			Type:    source.TabletType(r.Type.String()),
			Address: r.Address,
			Serving: r.Serving,
			Healthy: r.Healthy,
			Lag:     r.Lag.AsDuration(),
		})
	}
	return out, nil
}

// OpenReplica returns a reader on the replica's tablet server.
func (c *Client) OpenReplica(_ context.Context, r source.Replica) (source.ReplicaReader, error) {
	if r.Address == "" {
		return nil, fmt.Errorf("replica %s of tablet %s: %w (no address)", r.Alias, r.Tablet, source.ErrUnknownReplica)
	}
	conn, err := c.conn(r.Address)
	if err != nil {
		return nil, err
	}
	return &replicaReader{alias: r.Alias, conn: conn, client: sourcepb.NewTabletServerClient(conn)}, nil
}

type replicaReader struct {
	alias  string
	conn   *grpc.ClientConn
	client sourcepb.TabletServerClient
}

var _ source.LossWatcher = (*replicaReader)(nil)

// Lost is closed once the connection to the replica's server leaves the
// READY state: a server that stops closes it, and the connection goes
// IDLE at once (a reconnect waits for the next call).
func (r *replicaReader) Lost(ctx context.Context) <-chan struct{} {
	lost := make(chan struct{})
	go func() {
		for st := r.conn.GetState(); st == connectivity.Ready; st = r.conn.GetState() {
			if !r.conn.WaitForStateChange(ctx, st) {
				return // ctx ended
			}
		}
		close(lost)
	}()
	return lost
}

func (r *replicaReader) GetChanges(ctx context.Context, req source.ChangesRequest) (source.Batch, error) {
	resp, err := r.client.GetChanges(ctx, &sourcepb.GetChangesRequest{
		Stream:         req.Stream,
		Tablet:         req.Tablet,
		FromCheckpoint: req.From.String(),
		MaxRecords:     int32(min(req.MaxRecords, 1<<30)),
		MaxWait:        durationpb.New(req.MaxWait),
	})
	if err != nil {
		return source.Batch{}, fmt.Errorf("get changes %s from %s on %s: %w", req.Tablet, req.From, r.alias, err)
	}
	cp, err := source.ParseCheckpoint(resp.Checkpoint)
	if err != nil {
		return source.Batch{}, fmt.Errorf("get changes %s on %s: response: %w", req.Tablet, r.alias, err)
	}
	out := source.Batch{
		Checkpoint: cp,
		CaughtUp:   resp.CaughtUp,
		ReplicaLag: resp.ReplicaLag.AsDuration(),
		Records:    make([]source.Record, len(resp.Records)),
	}
	for i, rec := range resp.Records {
		pos, err := source.ParseCheckpoint(rec.Position)
		if err != nil {
			return source.Batch{}, fmt.Errorf("get changes %s on %s: record %d: %w", req.Tablet, r.alias, i, err)
		}
		out.Records[i] = source.Record{
			Tablet:     rec.Tablet,
			Position:   pos,
			CommitTime: rec.CommitTime.AsTime(),
			Table:      rec.Table,
			Op:         opOf(rec.Op),
			Key:        rec.Key,
			Before:     rec.Before,
			After:      rec.After,
		}
	}
	return out, nil
}

func (r *replicaReader) Ack(ctx context.Context, stream, tablet string, cp source.Checkpoint) error {
	_, err := r.client.Ack(ctx, &sourcepb.AckRequest{Stream: stream, Tablet: tablet, Checkpoint: cp.String()})
	if err != nil {
		return fmt.Errorf("ack %s at %s on %s: %w", tablet, cp, r.alias, err)
	}
	return nil
}

func opOf(op sourcepb.Op) source.Op {
	switch op {
	case sourcepb.Op_INSERT:
		return source.Insert
	case sourcepb.Op_UPDATE:
		return source.Update
	case sourcepb.Op_DELETE:
		return source.Delete
	case sourcepb.Op_READ:
		return source.Read
	case sourcepb.Op_RESYNC_BEGIN:
		return source.ResyncBegin
	case sourcepb.Op_RESYNC_END:
		return source.ResyncEnd
	}
	return source.Op(op.String())
}
