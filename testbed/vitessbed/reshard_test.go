package vitessbed_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"
	queryservicepb "vitess.io/vitess/go/vt/proto/queryservice"
	topodatapb "vitess.io/vitess/go/vt/proto/topodata"

	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

// tabletStream is a VStream opened directly on one vttablet, as the vitess
// source opens it, recording what it receives.
type tabletStream struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	events  []*binlogdatapb.VEvent
	journal *binlogdatapb.VEvent // the first JOURNAL event
	// journalTime is when it was received.
	journalTime time.Time
	// afterJournal are the events received after it.
	afterJournal []*binlogdatapb.VEvent
	err          error // why it ended, once done is closed
	endedAt      time.Time
}

func openTabletStream(t *testing.T, tab *vitessbed.Tablet, typ topodatapb.TabletType, pos string) *tabletStream {
	t.Helper()
	conn, err := grpc.NewClient(tab.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := queryservicepb.NewQueryClient(conn).VStream(ctx, &binlogdatapb.VStreamRequest{
		Target:   &querypb.Target{Keyspace: vitessbed.Keyspace, Shard: tab.Shard, TabletType: typ},
		Position: pos,
		Filter:   &binlogdatapb.Filter{Rules: []*binlogdatapb.Rule{{Match: "/.*/"}}},
	})
	require.NoError(t, err)
	s := &tabletStream{cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { cancel(); <-s.done })
	go func() {
		defer close(s.done)
		for {
			resp, err := stream.Recv()
			s.mu.Lock()
			if err != nil {
				s.err, s.endedAt = err, time.Now()
				s.mu.Unlock()
				return
			}
			for _, ev := range resp.GetEvents() {
				s.events = append(s.events, ev)
				switch {
				case s.journal != nil:
					s.afterJournal = append(s.afterJournal, ev)
				case ev.GetType() == binlogdatapb.VEventType_JOURNAL:
					s.journal, s.journalTime = ev, time.Now()
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// waitJournal waits for the stream's JOURNAL event.
func (s *tabletStream) waitJournal(ctx context.Context) (*binlogdatapb.VEvent, error) {
	for {
		s.mu.Lock()
		j, err := s.journal, s.err
		s.mu.Unlock()
		if j != nil {
			return j, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("the stream ended before a JOURNAL event: %w", err)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// around names the types of the n events before and after ev.
func (s *tabletStream) around(ev *binlogdatapb.VEvent, n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.events, ev)
	if i < 0 {
		return "not received"
	}
	var parts []string
	for _, e := range s.events[max(0, i-n):min(len(s.events), i+n+1)] {
		p := e.GetType().String()
		if e.GetGtid() != "" {
			p += " " + e.GetGtid()
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// received are the events the stream received so far, or only those after
// the JOURNAL.
func (s *tabletStream) received(afterJournal bool) []*binlogdatapb.VEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	if afterJournal {
		return slices.Clone(s.afterJournal)
	}
	return slices.Clone(s.events)
}

// rowKeys are the first column (the primary key) of each row of a table
// the events insert, update or delete, in order.
func rowKeys(events []*binlogdatapb.VEvent, table string) []string {
	var keys []string
	for _, ev := range events {
		if ev.GetType() != binlogdatapb.VEventType_ROW || ev.GetRowEvent().GetTableName() != table {
			continue
		}
		for _, rc := range ev.GetRowEvent().GetRowChanges() {
			row := rc.GetAfter()
			if row == nil {
				row = rc.GetBefore()
			}
			if len(row.GetLengths()) > 0 && row.GetLengths()[0] >= 0 {
				keys = append(keys, string(row.GetValues()[:row.GetLengths()[0]]))
			}
		}
	}
	return keys
}

// acceptsVStream opens a VStream on the tablet at pos and waits for its
// first response: the tablet streams from pos. An error answer (such as
// GTIDSet Mismatch, a position the tablet does not have) is returned.
func acceptsVStream(ctx context.Context, tab *vitessbed.Tablet, typ topodatapb.TabletType, pos string) error {
	conn, err := grpc.NewClient(tab.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := queryservicepb.NewQueryClient(conn).VStream(ctx, &binlogdatapb.VStreamRequest{
		Target:   &querypb.Target{Keyspace: vitessbed.Keyspace, Shard: tab.Shard, TabletType: typ},
		Position: pos,
		Filter:   &binlogdatapb.Filter{Rules: []*binlogdatapb.Rule{{Match: "/.*/"}}},
	})
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

// TestReshardSplitsAShardAndItsReplicaStreamsAJournal splits -80 into -40
// and 40-80 with a real Reshard workflow (vtctldclient Reshard create,
// SwitchTraffic) while a VStream reads -80's replica directly, as the
// vitess source does: the replica's stream sends a JOURNAL naming -80 and
// each new shard at a GTID position of that shard's own, from which a
// VStream of the new shard begins with the first write after the switch;
// the rows are in the new shards by key range and vtgate routes there; and
// the source shard's stream does not end at the JOURNAL: it goes on with
// the new shards' writes, copied back by the reverse workflow.
func TestReshardSplitsAShardAndItsReplicaStreamsAJournal(t *testing.T) {
	begin := time.Now()
	c := vitessbed.StartT(t, vitessbed.Options{})
	ctx := ctxFor(t, 10*time.Minute)
	from, to := "-80", []string{"-40", "40-80"}

	// Rows of both halves of -80 before the copy.
	insert := func(first int64, n int) []int64 {
		var ids []int64
		for id := first; len(ids) < n; id++ {
			if vitessbed.ShardOf(id) != from {
				continue
			}
			_, err := c.Exec(ctx, "INSERT INTO customer (customer_id, email) VALUES (?, ?)", id, fmt.Sprintf("c%d@example.com", id))
			require.NoError(t, err)
			_, err = c.Exec(ctx, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (?, ?, 'sku', ?)", id*10, id, id%1000)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		return ids
	}
	before := insert(1, 40)

	src := c.Replicas(from)[0]
	require.NoError(t, src.WaitCaughtUp(ctx))
	vs := openTabletStream(t, src, topodatapb.TabletType_REPLICA, "current")

	t0 := time.Now()
	r, err := c.Reshard(ctx, from, to)
	require.NoError(t, err)
	copyTook := time.Since(t0)

	// Written after the copy: the target primaries get them by replication.
	during := insert(100_000, 20)
	require.Eventually(t, func() bool { return len(rowKeys(vs.received(false), "customer")) >= len(during) }, time.Minute, 100*time.Millisecond,
		"-80's replica streamed %d customer rows, want %d", len(rowKeys(vs.received(false), "customer")), len(during))
	for _, shard := range to {
		require.Equal(t, "PRIMARY", c.Primary(shard).Type)
		require.Len(t, c.Replicas(shard), len(vitessbed.NewShardCells)-1)
	}

	// Written through vtgate after the switch, to 40-80.
	afterID := int64(200_000)
	for vitessbed.ShardAmong(afterID, to) != to[1] {
		afterID++
	}

	t1 := time.Now()
	require.NoError(t, r.SwitchTraffic(ctx))
	switchTook := time.Since(t1)

	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ev, err := vs.waitJournal(jctx)
	require.NoError(t, err, "the source shard's replica streamed no JOURNAL")
	j := ev.GetJournal()
	t.Logf("JOURNAL event: %s", prototext.Format(ev))
	t.Logf("Id %d, MigrationType %v, Tables %v, LocalPosition %q, SourceWorkflows %v", j.GetId(), j.GetMigrationType(), j.GetTables(), j.GetLocalPosition(), j.GetSourceWorkflows())
	gtids := map[string]string{}
	for _, sg := range j.GetShardGtids() {
		t.Logf("ShardGtid %s/%s at %q", sg.GetKeyspace(), sg.GetShard(), sg.GetGtid())
		gtids[sg.GetShard()] = sg.GetGtid()
	}
	for _, p := range j.GetParticipants() {
		t.Logf("Participant %s/%s", p.GetKeyspace(), p.GetShard())
	}
	t.Logf("around it: %s", vs.around(ev, 3))

	t.Run("the JOURNAL names the source shard and each new shard at a position of its own", func(t *testing.T) {
		require.Equal(t, binlogdatapb.MigrationType_SHARDS, j.GetMigrationType())
		require.NotZero(t, j.GetId())
		// A Reshard moves every table: its filter's one rule.
		require.Equal(t, []string{"/.*"}, j.GetTables())
		// The workflows of the source shard whose streams moved along (none).
		require.Empty(t, j.GetSourceWorkflows())
		require.Len(t, j.GetParticipants(), 1)
		require.Equal(t, vitessbed.Keyspace, j.GetParticipants()[0].GetKeyspace())
		require.Equal(t, from, j.GetParticipants()[0].GetShard())
		// The source primary's position once it stopped taking writes.
		require.True(t, strings.HasPrefix(j.GetLocalPosition(), "MariaDB/"), j.GetLocalPosition())

		var shards []string
		for _, sg := range j.GetShardGtids() {
			require.Equal(t, vitessbed.Keyspace, sg.GetKeyspace())
			require.True(t, strings.HasPrefix(sg.GetGtid(), "MariaDB/"), sg.GetGtid())
			shards = append(shards, sg.GetShard())
			// Each new shard's position is one of its own: a VStream of
			// each of its tablets starts there.
			for _, tab := range c.Tablets() {
				if tab.Shard != sg.GetShard() {
					continue
				}
				typ := topodatapb.TabletType_PRIMARY
				if tab.Type == "REPLICA" {
					typ = topodatapb.TabletType_REPLICA
					require.NoError(t, tab.WaitPosition(jctx, sg.GetGtid()))
				}
				require.NoError(t, acceptsVStream(jctx, tab, typ, sg.GetGtid()), "%s of %s", tab.Alias, sg.GetShard())
			}
		}
		require.ElementsMatch(t, to, shards)
	})

	t.Run("the new shards hold the rows by key range and serve through vtgate", func(t *testing.T) {
		all := append(append([]int64{}, before...), during...)
		got := map[string]map[string]vitessbed.Rows{}
		for _, shard := range to {
			rows, err := c.ShardRows(ctx, shard)
			require.NoError(t, err)
			got[shard] = rows
		}
		for _, id := range all {
			want := vitessbed.ShardAmong(id, to)
			require.NotEmpty(t, want)
			for _, shard := range to {
				key := fmt.Sprint(id)
				if shard == want {
					require.Equal(t, fmt.Sprintf("c%d@example.com", id), got[shard]["customer"][key]["email"], "customer %d on %s", id, shard)
					require.Contains(t, got[shard]["corder"], fmt.Sprint(id*10), "order of %d on %s", id, shard)
				} else {
					require.NotContains(t, got[shard]["customer"], key, "customer %d of %s on %s", id, want, shard)
				}
			}
		}
		require.Equal(t, len(all), len(got[to[0]]["customer"])+len(got[to[1]]["customer"]))
	})

	t.Run("a new shard's stream from the journal's position begins with the first write after the switch", func(t *testing.T) {
		children := map[string]*tabletStream{}
		for _, shard := range to {
			require.NotEmpty(t, gtids[shard], "no position for %s in the journal", shard)
			children[shard] = openTabletStream(t, c.Replicas(shard)[0], topodatapb.TabletType_REPLICA, gtids[shard])
		}
		// Through vtgate: it lands on 40-80's primary and reaches its
		// replica, and nothing of it reaches -40.
		_, err := c.Exec(ctx, "INSERT INTO customer (customer_id, email) VALUES (?, 'after@example.com')", afterID)
		require.NoError(t, err)
		var got []string
		require.Eventually(t, func() bool {
			got = rowKeys(children[to[1]].received(false), "customer")
			return len(got) > 0
		}, time.Minute, 100*time.Millisecond, "%s's replica streamed no customer row from %s", to[1], gtids[to[1]])
		// Not one of the rows the copy or the replication brought before.
		require.Equal(t, []string{fmt.Sprint(afterID)}, got)
		require.Empty(t, rowKeys(children[to[0]].received(false), "customer"))
		rows, err := c.Primary(to[0]).Rows(ctx)
		require.NoError(t, err)
		require.NotContains(t, rows["customer"], fmt.Sprint(afterID))
	})

	t.Run("the source shard's stream goes on after the JOURNAL with the new shards' writes copied back", func(t *testing.T) {
		// The vttablet does not end the stream at the JOURNAL: a reader
		// has to. The stream goes on with the source shard's binary log,
		// which SwitchTraffic's reverse workflow (there so that
		// ReverseTraffic can go back) fills with the new shards' writes.
		var got []string
		require.Eventually(t, func() bool {
			got = rowKeys(vs.received(true), "customer")
			return slices.Contains(got, fmt.Sprint(afterID))
		}, time.Minute, 100*time.Millisecond, "the source shard's stream after the JOURNAL: customer rows %v, want %d (written to %s after the switch)", got, afterID, to[1])
		require.Equal(t, []string{fmt.Sprint(afterID)}, got, "rows after the JOURNAL other than the one written after the switch")
		rows, err := c.Primary(from).Rows(ctx)
		require.NoError(t, err)
		require.Contains(t, rows["customer"], fmt.Sprint(afterID), "the reverse workflow did not copy the new shard's write back")

		// Still open 5 s after the JOURNAL.
		vs.mu.Lock()
		still := time.Until(vs.journalTime.Add(5 * time.Second))
		vs.mu.Unlock()
		select {
		case <-vs.done:
		case <-time.After(still):
		}
		vs.mu.Lock()
		defer vs.mu.Unlock()
		types := map[string]int{}
		for _, ev := range vs.afterJournal {
			types[ev.GetType().String()]++
		}
		t.Logf("after the JOURNAL (%.1fs): %v", time.Since(vs.journalTime).Seconds(), types)
		require.NoError(t, vs.err, "the stream ended %.1fs after the JOURNAL (EOF: %v)", vs.endedAt.Sub(vs.journalTime).Seconds(), vs.err == io.EOF)
	})

	for _, tab := range c.Tablets() {
		if tab.Shard == from {
			v, err := tab.Vars(ctx)
			require.NoError(t, err)
			t.Logf("after the switch, %s of %s: %s %s", tab.Alias, from, v.TabletType, v.TabletStateName)
		}
	}
	var rss float64
	for _, pid := range c.Pids() {
		if r, _, err := testbed.Memory(pid); err == nil {
			rss += r
		}
	}
	t.Logf("bed up, resharded and switched in %.1fs (new shards and copy %.1fs, SwitchTraffic %.1fs); %d processes, %.0f MiB resident",
		time.Since(begin).Seconds(), copyTook.Seconds(), switchTook.Seconds(), len(c.Pids()), rss)
}
