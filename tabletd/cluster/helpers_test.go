package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/tabletd/cluster"
)

// testCluster is a running cluster on loopback with a client on it.
type testCluster struct {
	*cluster.Cluster
	client *tabletd.Client
	admin  sourcepb.AdminClient
}

// start runs a cluster with the workload paused (tests write exact volumes
// with Write) unless cfg says otherwise.
func start(t *testing.T, mutate func(*cluster.Config)) *testCluster {
	t.Helper()
	cfg := cluster.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Rate = 0
	cfg.Tablets = 4
	cfg.Lag = 0
	cfg.Seed = 42
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := cluster.New(cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start())
	t.Cleanup(c.Close)
	client, err := tabletd.Dial(c.Addr(), cfg.Keyspace, tabletd.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	conn := adminConn(t, c.Addr())
	return &testCluster{Cluster: c, client: client, admin: sourcepb.NewAdminClient(conn)}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// tablet returns a tablet by ID from a fresh listing.
func (tc *testCluster) tablet(t *testing.T, id string) source.Tablet {
	t.Helper()
	return tabletOf(t, tc.client, id)
}

// tabletOf is a tablet by ID from client's listing.
func tabletOf(t *testing.T, client *tabletd.Client, id string) source.Tablet {
	t.Helper()
	tablets, err := client.ListTablets(ctx(t))
	require.NoError(t, err)
	for _, tab := range tablets {
		if tab.ID == id {
			return tab
		}
	}
	t.Fatalf("no tablet %s in %v", id, tablets)
	return source.Tablet{}
}

// replica returns a tablet's replica of the given type.
func (tc *testCluster) replica(t *testing.T, tabletID string, typ source.TabletType) source.Replica {
	t.Helper()
	for _, r := range tc.tablet(t, tabletID).Replicas {
		if r.Type == typ {
			return r
		}
	}
	t.Fatalf("tablet %s has no %s replica", tabletID, typ)
	return source.Replica{}
}

func (tc *testCluster) reader(t *testing.T, r source.Replica) source.ReplicaReader {
	t.Helper()
	rd, err := tc.client.OpenReplica(ctx(t), r)
	require.NoError(t, err)
	return rd
}

// consumer reads a stream like tabletflow will, and keeps what it got.
type consumer struct {
	stream  string
	records []source.Record
	seen    map[string]bool // tablet/position
	dups    int
	got     digest.Digest
}

func newConsumer(stream string) *consumer {
	return &consumer{stream: stream, seen: map[string]bool{}}
}

func (c *consumer) add(recs []source.Record) {
	for _, r := range recs {
		k := r.Tablet + "/" + r.Position.String()
		if c.seen[k] {
			c.dups++
		}
		c.seen[k] = true
		c.records = append(c.records, r)
		c.got.Add(hashOf(r))
	}
}

// drain reads a tablet from cp until the replica is caught up, and returns
// the checkpoint reached (or the error that stopped it).
func (c *consumer) drain(ctx context.Context, rd source.ReplicaReader, tablet string, cp source.Checkpoint) (source.Checkpoint, error) {
	for {
		b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: c.stream, Tablet: tablet, From: cp, MaxRecords: 100})
		if err != nil {
			return cp, err
		}
		c.add(b.Records)
		cp = b.Checkpoint
		if b.CaughtUp && len(b.Records) == 0 {
			return cp, nil
		}
	}
}

// drainAll drains every tablet of the cluster into c, each from its
// first replica, from the start.
func (tc *testCluster) drainAll(t *testing.T, c *consumer) {
	t.Helper()
	tablets, err := tc.client.ListTablets(ctx(t))
	require.NoError(t, err)
	for _, tab := range tablets {
		_, err := c.drain(ctx(t), tc.reader(t, tab.Replicas[0]), tab.ID, source.Checkpoint{})
		require.NoError(t, err)
	}
}

func hashOf(r source.Record) uint64 {
	return digest.Hash(digest.Fields{
		Tablet: r.Tablet, Position: r.Position.String(), Table: r.Table, Op: string(r.Op),
		Key: r.Key, Before: r.Before, After: r.After, CommitTime: r.CommitTime,
	})
}

// requireStatus checks an error's code and ErrorInfo reason.
func requireStatus(t *testing.T, err error, code codes.Code, reason sourcepb.Reason) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, code, st.Code(), "%v", err)
	var got sourcepb.Reason
	for _, d := range st.Details() {
		if info, ok := d.(*sourcepb.ErrorInfo); ok {
			got = info.Reason
		}
	}
	require.Equal(t, reason, got, "%v", err)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
func adminConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
