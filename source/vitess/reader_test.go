package vitess

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"
	topodatapb "vitess.io/vitess/go/vt/proto/topodata"

	"github.com/tabletflow/tabletflow/source"
)

var (
	primary = topodatapb.TabletType_PRIMARY
	replica = topodatapb.TabletType_REPLICA
	rdonly  = topodatapb.TabletType_RDONLY
)

// replicaOf is the listing's entry for a tablet.
func replicaOf(t *testing.T, s *Source, alias string) source.Replica {
	t.Helper()
	tablets, err := s.ListTablets(context.Background())
	require.NoError(t, err)
	for _, tab := range tablets {
		for _, r := range tab.Replicas {
			if r.Alias == alias {
				return r
			}
		}
	}
	t.Fatalf("%s not listed in %+v", alias, tablets)
	return source.Replica{}
}

func read(t *testing.T, rd source.ReplicaReader, shard string, from source.Checkpoint, wait time.Duration) (source.Batch, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return rd.GetChanges(ctx, source.ChangesRequest{Stream: "s", Tablet: shard, From: from, MaxRecords: 100, MaxWait: wait})
}

func TestListTabletsNamesEveryVttabletByItsAliasWithItsHealth(t *testing.T) {
	f := newFakeVitess(t, "-80", "80-", "-40")
	f.tablet("zone1", 100, "-80", primary)
	f.tablet("zone2", 101, "-80", replica).setHealth(func(h *querypb.StreamHealthResponse) { h.RealtimeStats.ReplicationLagSeconds = 7 })
	f.tablet("zone3", 102, "-80", rdonly).setHealth(func(h *querypb.StreamHealthResponse) {
		h.Serving = false
		h.RealtimeStats.HealthError = "replication is not running"
	})
	down := f.tablet("zone2", 201, "80-", replica)
	down.srv.Stop()
	f.tablet("zone1", 300, "-40", replica) // a Reshard's new shard beside -80
	f.tablet("zone1", 999, "80-", topodatapb.TabletType_BACKUP)

	tablets, err := f.source().ListTablets(context.Background())
	require.NoError(t, err)
	require.Len(t, tablets, 3)
	require.Equal(t, []string{"-40", "-80", "80-"}, []string{tablets[0].ID, tablets[1].ID, tablets[2].ID}, "in key range order")
	require.Equal(t, "-80", tablets[0].Parent, "a shard inside another's key range is its child")
	require.Empty(t, tablets[1].Parent)
	byAlias := map[string]source.Replica{}
	for _, tab := range tablets {
		for _, r := range tab.Replicas {
			require.Equal(t, tab.ID, r.Tablet)
			byAlias[r.Alias] = r
		}
	}
	require.NotContains(t, byAlias, "zone1-0000000999", "a BACKUP tablet serves no stream")
	p := byAlias["zone1-0000000100"]
	require.Equal(t, source.Replica{Tablet: "-80", Alias: "zone1-0000000100", Cell: "zone1", Type: source.TypePrimary, Address: p.Address, Serving: true, Healthy: true}, p)
	require.NotEmpty(t, p.Address)
	r := byAlias["zone2-0000000101"]
	require.Equal(t, 7*time.Second, r.Lag)
	require.True(t, r.Serving && r.Healthy)
	require.Equal(t, source.TypeReplica, r.Type)
	ro := byAlias["zone3-0000000102"]
	require.Equal(t, source.TypeRDOnly, ro.Type)
	require.False(t, ro.Serving)
	require.False(t, ro.Healthy, "a health error makes it unhealthy")
	d := byAlias["zone2-0000000201"]
	require.False(t, d.Serving || d.Healthy, "a vttablet that does not answer")
}

func TestGetChangesStartsAtTheCurrentPositionThenReadsWholeTransactions(t *testing.T) {
	f := newFakeVitess(t, "-80")
	f.tablet("zone1", 100, "-80", primary)
	rep := f.tablet("zone2", 101, "-80", replica)
	rep.setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if err := send(gtid("MariaDB/0-100-41"), other()); err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
		if err := send(heartbeat()); err != nil {
			return err
		}
		if err := send(begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a", "1.00", "2026-01-01", "{}")})); err != nil {
			return err
		}
		if err := send(gtid("MariaDB/0-100-42"), commit(1_800_000_000)); err != nil {
			return err
		}
		return errHold
	})
	s := f.source("customer")
	rd, err := s.OpenReplica(context.Background(), replicaOf(t, s, "zone2-0000000101"))
	require.NoError(t, err)
	defer rd.(*Reader).Close()

	began := time.Now()
	b, err := read(t, rd, "-80", source.Checkpoint{}, 5*time.Second)
	require.NoError(t, err)
	require.Less(t, time.Since(began), 2*time.Second, "a new stream's start comes back at once, not after maxWait")
	require.Empty(t, b.Records)
	start := source.Checkpoint{Term: 41, Opaque: "MariaDB/0-100-41"}
	require.Equal(t, start, b.Checkpoint)

	b, err = read(t, rd, "-80", b.Checkpoint, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	require.Equal(t, "42.1@MariaDB/0-100-42", b.Checkpoint.String())
	require.True(t, b.CaughtUp)

	reqs := rep.vstreams()
	require.Len(t, reqs, 1, "one stream goes on between reads")
	require.Equal(t, "current", reqs[0].Position)
	require.Equal(t, &querypb.Target{Keyspace: "commerce", Shard: "-80", TabletType: replica}, reqs[0].Target, "the vttablet's own target")
	require.Equal(t, "/^(customer)$/", reqs[0].Filter.Rules[0].Match)

	// A reader that starts from a checkpoint streams from its GTID position.
	rd2, err := s.OpenReplica(context.Background(), replicaOf(t, s, "zone2-0000000101"))
	require.NoError(t, err)
	defer rd2.(*Reader).Close()
	b, err = read(t, rd2, "-80", start, 200*time.Millisecond)
	require.NoError(t, err)
	reqs = rep.vstreams()
	require.Equal(t, "MariaDB/0-100-41", reqs[len(reqs)-1].Position)
	require.Len(t, b.Records, 1)
}

func TestAReplicaBehindThePositionAnswersMismatchAndOneThatPurgedItReadsElsewhere(t *testing.T) {
	f := newFakeVitess(t, "-80")
	prim := f.tablet("zone1", 100, "-80", primary)
	behind := f.tablet("zone2", 101, "-80", replica)
	purged := f.tablet("zone3", 102, "-80", replica)
	behind.setVStream(func(req *binlogdatapb.VStreamRequest, _ func(...*binlogdatapb.VEvent) error) error {
		return status.Errorf(codes.InvalidArgument, "GTIDSet Mismatch: requested source position:%s, current target vrep position: MariaDB/0-100-3", req.Position)
	})
	purgedErr := func(*binlogdatapb.VStreamRequest, func(...*binlogdatapb.VEvent) error) error {
		return status.Error(codes.Unknown, "stream (at source tablet) error: Could not find GTID state requested by slave in any binlog files (errno 1236) (sqlstate HY000)")
	}
	purged.setVStream(purgedErr)
	prim.setVStream(func(_ *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if err := send(heartbeat()); err != nil {
			return err
		}
		return errHold
	})
	s := f.source()
	from := source.Checkpoint{Term: 9, Index: 2, Opaque: "MariaDB/0-100-9"}

	rd, _ := s.OpenReplica(context.Background(), replicaOf(t, s, "zone2-0000000101"))
	_, err := read(t, rd, "-80", from, time.Second)
	require.Equal(t, source.Classification{Action: source.RetryElsewhere, Reason: "POSITION_MISMATCH"}, Classify(err), "%v", err)
	require.ErrorContains(t, err, "zone2-0000000101")

	rd, _ = s.OpenReplica(context.Background(), replicaOf(t, s, "zone3-0000000102"))
	_, err = read(t, rd, "-80", from, time.Second)
	require.Equal(t, source.Classification{Action: source.RetryElsewhere, Reason: "BINLOG_PURGED"}, Classify(err),
		"the primary still streams from the position: %v", err)

	// Once no vttablet of the shard has it: Expired, naming them.
	prim.setVStream(purgedErr)
	behind.setVStream(purgedErr)
	rd, _ = s.OpenReplica(context.Background(), replicaOf(t, s, "zone3-0000000102"))
	_, err = read(t, rd, "-80", from, time.Second)
	require.Equal(t, source.Classification{Action: source.Expired, Reason: "HISTORY_GONE"}, Classify(err), "%v", err)
	require.ErrorContains(t, err, "no vttablet of shard -80 holds position MariaDB/0-100-9 any more: zone3-0000000102, zone1-0000000100, zone2-0000000101 purged")
}

func TestAVttabletThatChangedTypeIsReadWithItsTypeNow(t *testing.T) {
	f := newFakeVitess(t, "0")
	tab := f.tablet("zone1", 100, "0", replica)
	tab.setVStream(func(_ *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if err := send(gtid("MariaDB/0-100-5"), other()); err != nil {
			return err
		}
		return errHold
	})
	s := f.source()
	picked := replicaOf(t, s, "zone1-0000000100")
	tab.setType(primary) // promoted after it was picked
	time.Sleep(healthTTL + 100*time.Millisecond)
	rd, _ := s.OpenReplica(context.Background(), picked)
	b, err := read(t, rd, "0", source.Checkpoint{}, time.Second)
	require.NoError(t, err)
	require.Equal(t, "5.0@MariaDB/0-100-5", b.Checkpoint.String())
	reqs := tab.vstreams()
	require.Equal(t, primary, reqs[len(reqs)-1].Target.TabletType)
}

func TestEnsureStreamChecksTheKeyspaceAndTablesAndTakesLatestOrSnapshot(t *testing.T) {
	f := newFakeVitess(t, "-80", "80-")
	f.tablet("zone1", 100, "-80", primary)
	ctx := context.Background()
	s := f.source("customer")

	_, err := s.EnsureStream(ctx, source.StreamSpec{ID: "s", Tables: []string{"customer"}, StartFrom: source.StartEarliest})
	require.Equal(t, source.Classification{Action: source.Fatal, Reason: "START_FROM"}, Classify(err))
	require.ErrorContains(t, err, `set "startFrom": "latest" or "snapshot"`)
	for _, from := range []source.StartFrom{source.StartLatest, source.StartSnapshot} {
		st, err := s.EnsureStream(ctx, source.StreamSpec{ID: "s", Tables: []string{"customer"}, StartFrom: from})
		require.NoError(t, err)
		require.Equal(t, from, st.StartFrom)
	}
	_, err = s.EnsureStream(ctx, source.StreamSpec{ID: "s", StartFrom: source.StartLatest})
	require.NoError(t, err, "no tables: every table of the keyspace")

	_, err = s.EnsureStream(ctx, source.StreamSpec{ID: "s", Tables: []string{"customer", "custmer"}, StartFrom: source.StartLatest})
	require.Equal(t, source.Classification{Action: source.Fatal, Reason: "TABLE_NOT_FOUND"}, Classify(err))
	require.ErrorContains(t, err, `["custmer"] not in keyspace commerce`)

	other, err := New(Config{Kind: "vitess", VTCtld: f.vtctld, Keyspace: "nope"}, nil)
	require.NoError(t, err)
	defer other.Close()
	_, err = other.EnsureStream(ctx, source.StreamSpec{ID: "s", StartFrom: source.StartLatest})
	require.Equal(t, source.Classification{Action: source.Fatal, Reason: "KEYSPACE_NOT_FOUND"}, Classify(err))

	require.NoError(t, s.DeleteStream(ctx, "s"), "nothing to drop")
}

func TestAStreamThatEndsIsAnErrorAndTheNextReadStartsAgainWhereTheLastEnded(t *testing.T) {
	f := newFakeVitess(t, "0")
	tab := f.tablet("zone1", 100, "0", replica)
	calls := 0
	tab.setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		calls++
		if calls == 1 {
			// A transaction, then half of another, then the vttablet goes.
			if err := send(begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a", "1", "2026-01-01", "1")}),
				gtid("MariaDB/0-100-8"), commit(1)); err != nil {
				return err
			}
			if err := send(begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{After: row("2", "b", "1", "2026-01-01", "1")})); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
			return status.Error(codes.Unavailable, "vttablet is shutting down")
		}
		if err := send(begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{After: row("2", "b", "1", "2026-01-01", "1")}),
			gtid("MariaDB/0-100-9"), commit(2)); err != nil {
			return err
		}
		return errHold
	})
	s := f.source()
	rd, _ := s.OpenReplica(context.Background(), replicaOf(t, s, "zone1-0000000100"))
	defer rd.(*Reader).Close()
	from := source.Checkpoint{Term: 7, Opaque: "MariaDB/0-100-7"}
	b, err := read(t, rd, "0", from, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	require.Equal(t, "8.1@MariaDB/0-100-8", b.Checkpoint.String())
	_, err = read(t, rd, "0", b.Checkpoint, 5*time.Second)
	require.Equal(t, source.RetrySame, Classify(err).Action, "%v", err)
	b, err = read(t, rd, "0", b.Checkpoint, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	require.Equal(t, "9.1@MariaDB/0-100-9", b.Checkpoint.String())
	reqs := tab.vstreams()
	require.Equal(t, "MariaDB/0-100-8", reqs[len(reqs)-1].Position, "the half transaction is read again from the last checkpoint")

	// Asked for an earlier checkpoint than it reached, the reader streams
	// again from there.
	b, err = read(t, rd, "0", source.Checkpoint{Term: 8, Index: 1, Opaque: "MariaDB/0-100-8"}, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "9.1@MariaDB/0-100-9", b.Checkpoint.String())
	reqs = tab.vstreams()
	require.Len(t, reqs, 3)
	require.Equal(t, "MariaDB/0-100-8", reqs[2].Position)
}

func TestAVttabletThatSendsNothingNotEvenHeartbeatsIsTakenForLost(t *testing.T) {
	defer func(d time.Duration) { silence = d }(silence)
	silence = 300 * time.Millisecond
	f := newFakeVitess(t, "0")
	tab := f.tablet("zone1", 100, "0", replica)
	beats := true
	var mu sync.Mutex
	tab.setVStream(func(_ *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		for {
			mu.Lock()
			b := beats
			mu.Unlock()
			if b {
				if err := send(heartbeat()); err != nil {
					return err
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	s := f.source()
	rd, _ := s.OpenReplica(context.Background(), replicaOf(t, s, "zone1-0000000100"))
	defer rd.(*Reader).Close()
	from := source.Checkpoint{Term: 7, Opaque: "MariaDB/0-100-7"}
	b, err := read(t, rd, "0", from, time.Second)
	require.NoError(t, err, "heartbeats: an idle vttablet")
	require.Equal(t, from, b.Checkpoint)
	mu.Lock()
	beats = false // the vttablet hangs
	mu.Unlock()
	_, err = read(t, rd, "0", from, time.Second)
	require.Equal(t, source.Classification{Action: source.RetrySame, Reason: "UNAVAILABLE"}, Classify(err), "%v", err)
	require.ErrorContains(t, err, "not even a heartbeat")
}

func TestAReadOfABacklogIsNotCaughtUpThoughNothingMoreWasReceivedYet(t *testing.T) {
	f := newFakeVitess(t, "-80")
	rep := f.tablet("zone2", 101, "-80", replica)
	release := make(chan struct{})
	rep.setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		old := commit(1_800_000_000)
		old.CurrentTime = (1_800_000_000 + 60) * int64(time.Second) // sent a minute after its commit
		if err := send(begin(), customerFields(), rowEvent("customer", &binlogdatapb.RowChange{After: row("1", "a", "1.00", "2026-01-01", "{}")}),
			gtid("MariaDB/0-100-42"), old); err != nil {
			return err
		}
		<-release
		recent := commit(1_800_000_100)
		recent.CurrentTime = 1_800_000_100*int64(time.Second) + int64(300*time.Millisecond)
		if err := send(begin(), rowEvent("customer", &binlogdatapb.RowChange{After: row("2", "b", "1.00", "2026-01-01", "{}")}),
			gtid("MariaDB/0-100-43"), recent); err != nil {
			return err
		}
		return errHold
	})
	s := f.source("customer")
	rd, err := s.OpenReplica(context.Background(), replicaOf(t, s, "zone2-0000000101"))
	require.NoError(t, err)
	defer rd.(*Reader).Close()
	b, err := read(t, rd, "-80", source.Checkpoint{Term: 41, Opaque: "MariaDB/0-100-41"}, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	require.False(t, b.CaughtUp, "a transaction sent a minute after its commit is part of a backlog: more is on its way")
	close(release)
	b, err = read(t, rd, "-80", b.Checkpoint, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	require.True(t, b.CaughtUp, "one sent as it was committed, and nothing more: caught up")
}
