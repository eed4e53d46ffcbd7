package cluster_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/tabletd/cluster"
)

// total sums a per-tablet digest.
func total(per map[string]digest.Digest) digest.Digest {
	var d digest.Digest
	for _, x := range per {
		d = d.Plus(x)
	}
	return d
}

func TestGetChangesReturnsEveryRecordInOrderAndTheDigestMatches(t *testing.T) {
	tc := start(t, nil)
	tc.Write(2000)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s1", StartFrom: source.StartEarliest})
	require.NoError(t, err)
	tc.Write(500) // written after the stream began: due too

	c := newConsumer("s1")
	tc.drainAll(t, c)
	require.Zero(t, c.dups)
	require.Len(t, c.records, 2500)

	// Positions within a tablet are contiguous and increasing.
	last := map[string]uint64{}
	for _, r := range c.records {
		require.Equal(t, last[r.Tablet]+1, r.Position.Index, "tablet %s", r.Tablet)
		last[r.Tablet] = r.Position.Index
		require.NotEmpty(t, r.Key)
		var key map[string]any
		require.NoError(t, json.Unmarshal(r.Key, &key))
		switch r.Op {
		case source.Insert:
			require.Empty(t, r.Before)
			require.NotEmpty(t, r.After)
		case source.Update:
			require.NotEmpty(t, r.Before)
			require.NotEmpty(t, r.After)
		case source.Delete:
			require.NotEmpty(t, r.Before)
			require.Empty(t, r.After)
		}
	}
	want, err := tc.Digest("s1")
	require.NoError(t, err)
	require.Equal(t, total(want), c.got)
	all, err := tc.Digest("")
	require.NoError(t, err)
	require.Equal(t, total(all), c.got, "earliest with nothing freed: the stream is due everything")
}

func TestStreamFromLatestIsDueOnlyLaterRecords(t *testing.T) {
	tc := start(t, nil)
	tc.Write(300)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "late", StartFrom: source.StartLatest})
	require.NoError(t, err)
	tc.Write(200)
	c := newConsumer("late")
	for _, id := range []string{"t-0001", "t-0002", "t-0003", "t-0004"} {
		_, err := c.drain(ctx(t), tc.reader(t, tc.replica(t, id, source.TypePrimary)), id, source.Checkpoint{})
		require.NoError(t, err)
	}
	require.Len(t, c.records, 200)
	want, err := tc.Digest("late")
	require.NoError(t, err)
	require.Equal(t, total(want), c.got)
}

func TestCreateStreamIsIdempotentAndRejectsOtherParameters(t *testing.T) {
	tc := start(t, nil)
	a, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s", Tables: []string{"orders"}})
	require.NoError(t, err)
	tc.Write(100)
	b, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s", Tables: []string{"orders"}})
	require.NoError(t, err)
	require.Equal(t, a.Start, b.Start, "ensuring again keeps the start positions")
	_, err = tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s", Tables: []string{"customers"}})
	requireStatus(t, err, codes.AlreadyExists, sourcepb.Reason_BAD_REQUEST)

	require.NoError(t, tc.client.DeleteStream(ctx(t), "s"))
	require.NoError(t, tc.client.DeleteStream(ctx(t), "s"), "deleting an absent stream is not an error")
}

func TestStreamOverTablesGetsOnlyThoseTables(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "o", Tables: []string{"orders"}})
	require.NoError(t, err)
	tc.Write(600)
	c := newConsumer("o")
	for _, id := range []string{"t-0001", "t-0002", "t-0003", "t-0004"} {
		_, err := c.drain(ctx(t), tc.reader(t, tc.replica(t, id, source.TypePrimary)), id, source.Checkpoint{})
		require.NoError(t, err)
	}
	require.NotEmpty(t, c.records)
	for _, r := range c.records {
		require.Equal(t, "orders", r.Table)
	}
	want, err := tc.Digest("o")
	require.NoError(t, err)
	require.Equal(t, total(want), c.got)
}

func TestGetChangesLongPollsUntilARecordExists(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	rd := tc.reader(t, tc.replica(t, "t-0001", source.TypePrimary))

	// Nothing to read: it waits max_wait, then returns empty and caught up.
	b, err := rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 10, MaxWait: 100 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, b.Records)
	require.True(t, b.CaughtUp)

	// A write during the wait ends it with the record, long before max_wait.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = tc.WriteTo("t-0001", 1)
	}()
	began := time.Now()
	b, err = rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 10, MaxWait: 20 * time.Second})
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	require.Less(t, time.Since(began), 20*time.Second, "returned when the record came, not at max_wait")
}

func TestFollowerServesOnlyWhatItHasApplied(t *testing.T) {
	tc := start(t, func(c *cluster.Config) { c.Lag = 300 * time.Millisecond })
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 5))

	follower := tc.reader(t, tc.replica(t, "t-0001", source.TypeReplica))
	req := source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 10}
	b, err := follower.GetChanges(ctx(t), req)
	require.NoError(t, err)
	require.Empty(t, b.Records, "written just now: the follower has not applied it")

	// The long poll ends once the follower applies what was written (the
	// five writes are applied one by one, each its lag after it was made:
	// a poll may end with the first few).
	req.MaxWait = 10 * time.Second
	var got []source.Record
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 5 && time.Now().Before(deadline) {
		b, err = follower.GetChanges(ctx(t), req)
		require.NoError(t, err)
		require.NotEmpty(t, b.Records, "the long poll ends with what the follower applied")
		got = append(got, b.Records...)
		req.From = b.Checkpoint
	}
	require.Len(t, got, 5, "the follower serves every record once it has applied them")
}

func TestAckFreesHistoryAndReadingBelowItExpiresTheStream(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 50))
	rd := tc.reader(t, tc.replica(t, "t-0001", source.TypePrimary))
	c := newConsumer("s")
	cp, err := c.drain(ctx(t), rd, "t-0001", source.Checkpoint{})
	require.NoError(t, err)
	require.Equal(t, uint64(50), cp.Index)

	require.NoError(t, rd.Ack(ctx(t), "s", "t-0001", source.Checkpoint{Term: 1, Index: 40}))
	eventually(t, "history up to the ack is freed", 5*time.Second, func() bool {
		return tc.tablet(t, "t-0001").Replicas != nil && firstPosition(t, tc, "t-0001") == "1.41"
	})
	// From the acknowledged checkpoint: fine.
	b, err := rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", From: source.Checkpoint{Term: 1, Index: 40}, MaxRecords: 100})
	require.NoError(t, err)
	require.Len(t, b.Records, 10)
	// From below it: that history is gone, the stream expired on the tablet.
	_, err = rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", From: source.Checkpoint{Term: 1, Index: 10}, MaxRecords: 100})
	requireStatus(t, err, codes.OutOfRange, sourcepb.Reason_STREAM_EXPIRED)
	require.Equal(t, source.Expired, tc.client.Classify(err).Action)
	// And it stays expired.
	_, err = rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", From: source.Checkpoint{Term: 1, Index: 40}, MaxRecords: 100})
	requireStatus(t, err, codes.OutOfRange, sourcepb.Reason_STREAM_EXPIRED)
}

func firstPosition(t *testing.T, tc *testCluster, id string) string {
	resp, err := tc.client.Topology().GetTablet(ctx(t), &sourcepb.GetTabletRequest{Tablet: id})
	require.NoError(t, err)
	return resp.FirstPosition
}

func TestIdleStreamExpiresPerTabletAfterRetention(t *testing.T) {
	tc := start(t, func(c *cluster.Config) { c.Retention = 500 * time.Millisecond })
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	active := tc.reader(t, tc.replica(t, "t-0001", source.TypePrimary))
	// Keep t-0001 active; leave every other tablet idle.
	deadline := time.Now().Add(10 * time.Second)
	var idleExpired bool
	for !idleExpired && time.Now().Before(deadline) {
		_, err := active.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 10, MaxWait: 50 * time.Millisecond})
		require.NoError(t, err, "an active tablet never expires")
		s, err := tc.client.Topology().DescribeStream(ctx(t), &sourcepb.DescribeStreamRequest{Stream: "s"})
		require.NoError(t, err)
		for _, st := range s.Tablets {
			if st.Tablet == "t-0002" && st.Expired {
				idleExpired = true
				require.Contains(t, st.ExpiredReason, "inactive")
			}
			if st.Tablet == "t-0001" {
				require.False(t, st.Expired)
			}
		}
	}
	require.True(t, idleExpired, "idle tablet t-0002 expired within the deadline")
	idle := tc.reader(t, tc.replica(t, "t-0002", source.TypePrimary))
	_, err = idle.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0002", MaxRecords: 10})
	requireStatus(t, err, codes.OutOfRange, sourcepb.Reason_STREAM_EXPIRED)
}

func TestSplitHandsOffToChildrenWithNothingLostOrRepeated(t *testing.T) {
	tc := start(t, func(c *cluster.Config) { c.Tablets = 2 })
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	tc.Write(1000)

	c := newConsumer("s")
	parent := tc.reader(t, tc.replica(t, "t-0001", source.TypeReplica))
	// Read part of the parent, split, write more (into the children), then
	// finish the parent: the end of its log hands off to the children.
	b, err := parent.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 100})
	require.NoError(t, err)
	c.add(b.Records)
	resp, err := tc.admin.Split(ctx(t), &sourcepb.SplitRequest{Tablet: "t-0001"})
	require.NoError(t, err)
	tc.Write(1000)
	_, err = c.drain(ctx(t), parent, "t-0001", b.Checkpoint)
	requireStatus(t, err, codes.OutOfRange, sourcepb.Reason_TABLET_SPLIT)
	cl := tc.client.Classify(err)
	require.Equal(t, source.Split, cl.Action)
	require.Equal(t, resp.Children, cl.Children)
	require.Equal(t, resp.HandoffCheckpoint, cl.Handoff.String())

	for _, child := range cl.Children {
		_, err := c.drain(ctx(t), tc.reader(t, tc.replica(t, child, source.TypePrimary)), child, cl.Handoff)
		require.NoError(t, err)
	}
	_, err = c.drain(ctx(t), tc.reader(t, tc.replica(t, "t-0002", source.TypePrimary)), "t-0002", source.Checkpoint{})
	require.NoError(t, err)

	require.Zero(t, c.dups)
	want, err := tc.Digest("s")
	require.NoError(t, err)
	require.Equal(t, total(want), c.got)
	require.Equal(t, uint64(2000), c.got.Records)

	// Per-key order: a key's records in the parent all precede its records
	// in a child (the consumer read them in that order).
	lastTablet := map[string]string{}
	for _, r := range c.records {
		k := r.Table + string(r.Key)
		if prev, ok := lastTablet[k]; ok && prev != r.Tablet {
			require.Equal(t, "t-0001", prev, "key %s moved from %s to %s", k, prev, r.Tablet)
		}
		lastTablet[k] = r.Tablet
	}
	// The topology shows the split.
	tab := tc.tablet(t, "t-0001")
	require.True(t, tab.Split)
	require.Equal(t, resp.Children, tab.Children)
	_, err = tc.admin.Split(ctx(t), &sourcepb.SplitRequest{Tablet: "t-0001"})
	requireStatus(t, err, codes.FailedPrecondition, sourcepb.Reason_BAD_REQUEST)
}

// The Rows RPC answers what a consumer applying every change in order
// holds: each tablet's log read from the start, inserts and updates
// setting a row by (table, key), deletes removing it.
func TestRowsAreWhatApplyingEveryChangeHolds(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s1", StartFrom: source.StartEarliest})
	require.NoError(t, err)
	tc.Write(9000) // beyond the live-rows target: deletes and updates of old rows too

	c := newConsumer("s1")
	tc.drainAll(t, c)
	applied := map[string]string{} // table/key → row
	deletes := 0
	for _, r := range c.records {
		k := r.Table + "/" + string(r.Key)
		if r.Op == source.Delete {
			require.Contains(t, applied, k, "a delete of a row that exists")
			delete(applied, k)
			deletes++
			continue
		}
		applied[k] = string(r.After)
	}
	require.NotZero(t, deletes)

	resp, err := tc.admin.Rows(ctx(t), &sourcepb.RowsRequest{})
	require.NoError(t, err)
	got := map[string]string{}
	for _, row := range resp.Rows {
		got[row.Table+"/"+string(row.Key)] = string(row.Row)
	}
	require.Len(t, resp.Rows, len(got), "each row once")
	require.Equal(t, applied, got)

	one, err := tc.admin.Rows(ctx(t), &sourcepb.RowsRequest{Table: "orders"})
	require.NoError(t, err)
	require.NotEmpty(t, one.Rows)
	for _, row := range one.Rows {
		require.Equal(t, "orders", row.Table)
	}
	_, err = tc.admin.Rows(ctx(t), &sourcepb.RowsRequest{Table: "nope"})
	requireStatus(t, err, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST)
}
