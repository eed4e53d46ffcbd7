package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/tabletd/cluster"
)

// replayTablet applies one tablet's records in order, strictly: a
// resync-begin empties the tablet, a read sets a row it does not have, an
// insert adds a row it does not have (the workload never reuses a key), an
// update or a delete changes a row whose before image is the one it has, a
// resync-end changes nothing. So a copy that held a change written after
// its start, or missed one before, fails. It returns table/key → row.
func replayTablet(t *testing.T, recs []source.Record) map[string]string {
	t.Helper()
	rows := map[string]string{}
	for _, r := range recs {
		k := r.Table + "/" + string(r.Key)
		row, has := rows[k]
		switch r.Op {
		case source.ResyncBegin:
			clear(rows)
		case source.ResyncEnd:
		case source.Read, source.Insert:
			require.False(t, has, "%s of %s at %s: the replay has it (%s)", r.Op, k, r.Position, row)
			rows[k] = string(r.After)
		case source.Update, source.Delete:
			require.True(t, has, "%s of %s at %s: the replay does not have it", r.Op, k, r.Position)
			require.Equal(t, row, string(r.Before), "%s of %s at %s: before is not the row the replay has", r.Op, k, r.Position)
			rows[k] = string(r.After)
			if r.Op == source.Delete {
				delete(rows, k)
			}
		default:
			t.Fatalf("record of op %q at %s", r.Op, r.Position)
		}
	}
	return rows
}

// tabletRows is the Rows RPC's answer for one tablet, as table/key → row.
func (tc *testCluster) tabletRows(t *testing.T, tablet string) map[string]string {
	t.Helper()
	resp, err := tc.admin.Rows(ctx(t), &sourcepb.RowsRequest{Tablet: tablet})
	require.NoError(t, err)
	out := map[string]string{}
	for _, r := range resp.Rows {
		out[r.Table+"/"+string(r.Key)] = string(r.Row)
	}
	require.Len(t, out, len(resp.Rows), "each row once")
	return out
}

// lastPosition is a tablet's last position from the topology.
func lastPosition(t *testing.T, tc *testCluster, id string) source.Checkpoint {
	t.Helper()
	resp, err := tc.client.Topology().GetTablet(ctx(t), &sourcepb.GetTabletRequest{Tablet: id})
	require.NoError(t, err)
	cp, err := source.ParseCheckpoint(resp.LastPosition)
	require.NoError(t, err)
	return cp
}

// requireCopyThenChanges checks that recs (a tablet read from a resync's
// start) are a resync-begin, rows reads, a resync-end, then changes only,
// at increasing positions after the start, and returns the reads.
func requireCopyThenChanges(t *testing.T, recs []source.Record, start source.Checkpoint, rows int) []source.Record {
	t.Helper()
	require.Greater(t, len(recs), rows+1)
	require.Equal(t, source.ResyncBegin, recs[0].Op, "the copy begins with a marker")
	require.Equal(t, source.ResyncEnd, recs[rows+1].Op, "the copy ends with a marker after its %d rows", rows)
	for i, r := range recs[1 : rows+1] {
		require.Equal(t, source.Read, r.Op, "copy record %d", i)
		require.NotEmpty(t, r.Key)
		require.NotEmpty(t, r.After)
		require.Empty(t, r.Before)
	}
	for _, m := range []source.Record{recs[0], recs[rows+1]} {
		require.Empty(t, m.Table, "a marker is not a change")
		require.Empty(t, m.Key)
		require.Empty(t, m.After)
	}
	for _, r := range recs[rows+2:] {
		require.False(t, r.Op == source.Read || r.Op.Marker(), "%s after the copy at %s", r.Op, r.Position)
	}
	prev := start
	for _, r := range recs {
		require.Equal(t, 1, r.Position.Compare(prev), "%s at %s after %s", r.Op, r.Position, prev)
		prev = r.Position
	}
	return recs[1 : rows+1]
}

// A tablet whose stream expired past the retention is resynced: read
// from the checkpoint Resync returns, it gives a resync-begin, its rows
// as reads, a resync-end, then the changes written after; the replay of
// those equals the tablet's rows; every position is after every one the
// tablet had; what the stream is due on the tablet is what it read; and
// another stream of the tablet never sees the copy.
func TestResyncOfAnExpiredTabletCopiesItsRowsBetweenMarkersThenItsChanges(t *testing.T) {
	tc := start(t, func(c *cluster.Config) { c.Retention = 500 * time.Millisecond })
	for _, id := range []string{"s", "other"} {
		_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: id, StartFrom: source.StartEarliest})
		require.NoError(t, err)
	}
	tc.Write(6000) // beyond the live-rows target: updates and deletes of old rows too
	rd := tc.reader(t, tc.replica(t, "t-0001", source.TypeReplica))
	others := newConsumer("other")
	otherCP, err := others.drain(ctx(t), rd, "t-0001", source.Checkpoint{})
	require.NoError(t, err)

	// "other" stays active on t-0001; "s" never reads it and expires.
	eventually(t, "s expires on t-0001", 10*time.Second, func() bool {
		_, err := rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "other", Tablet: "t-0001", From: otherCP, MaxRecords: 1})
		require.NoError(t, err)
		require.NoError(t, rd.Ack(ctx(t), "other", "t-0001", otherCP))
		return streamTablet(t, tc, "s", "t-0001").Expired
	})
	_, err = rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 1})
	requireStatus(t, err, codes.OutOfRange, sourcepb.Reason_STREAM_EXPIRED)

	cp, err := tc.client.Resync(ctx(t), "s", "t-0001", "r1", source.Checkpoint{})
	require.NoError(t, err)
	require.Equal(t, otherCP, cp, "the copy starts after the log's end (where other caught up)")
	st := streamTablet(t, tc, "s", "t-0001")
	require.False(t, st.Expired, "a resync clears the expiry")
	require.Equal(t, cp.String(), st.Start)
	require.Equal(t, cp.String(), st.Acked)
	require.Equal(t, "r1", st.ResyncId)
	require.Equal(t, cp.String(), st.ResyncStart)
	want := tc.tabletRows(t, "t-0001") // the rows at the start
	require.NotEmpty(t, want)
	tc.Write(2000) // changes after the start, t-0001's among them

	s := newConsumer("s")
	_, err = s.drain(ctx(t), rd, "t-0001", cp)
	require.NoError(t, err)
	require.Zero(t, s.dups)
	reads := requireCopyThenChanges(t, s.records, cp, len(want))
	require.Equal(t, want, replayTablet(t, s.records[:len(reads)+2]), "the copy is the rows at the start")
	require.Equal(t, tc.tabletRows(t, "t-0001"), replayTablet(t, s.records), "the copy then the changes are the rows now")

	due, err := tc.Digest("s")
	require.NoError(t, err)
	require.Equal(t, due["t-0001"], s.got, "the stream is due, on the tablet, what it read from the resync's start")

	// The other stream reads on past the copy's positions and gets only
	// changes; the cluster's digest of everything produced holds no copy.
	_, err = others.drain(ctx(t), rd, "t-0001", otherCP)
	require.NoError(t, err)
	for _, r := range others.records {
		require.False(t, r.Op == source.Read || r.Op.Marker(), "stream other got %s at %s", r.Op, r.Position)
	}
	dueOther, err := tc.Digest("other")
	require.NoError(t, err)
	require.Equal(t, dueOther["t-0001"], others.got)
	all, err := tc.Digest("")
	require.NoError(t, err)
	require.Equal(t, uint64(8000), total(all).Records, "every change, and no copy")
}

// streamTablet is a stream's state on a tablet, as DescribeStream says.
func streamTablet(t *testing.T, tc *testCluster, stream, tablet string) *sourcepb.StreamTablet {
	t.Helper()
	s, err := tc.client.Topology().DescribeStream(ctx(t), &sourcepb.DescribeStreamRequest{Stream: stream})
	require.NoError(t, err)
	for _, st := range s.Tablets {
		if st.Tablet == tablet {
			return st
		}
	}
	t.Fatalf("stream %s has no tablet %s", stream, tablet)
	return nil
}

// A reader that resumes from a checkpoint inside the copy (a batch of it
// committed, then a crash) gets the rest of the copy exactly once, from
// any replica; so does one that acknowledged part of it.
func TestResyncCopyResumesFromACheckpointInsideIt(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	tc.Write(3000)
	cp, err := tc.client.Resync(ctx(t), "s", "t-0002", "", source.Checkpoint{}) // not expired: a resync all the same
	require.NoError(t, err)
	tc.Write(500)

	whole := newConsumer("s")
	primary := tc.reader(t, tc.replica(t, "t-0002", source.TypePrimary))
	_, err = whole.drain(ctx(t), primary, "t-0002", cp)
	require.NoError(t, err)
	var copyLen int
	for i, r := range whole.records {
		if r.Op == source.ResyncEnd {
			copyLen = i + 1
		}
	}
	require.Greater(t, copyLen, 20)

	for _, cut := range []int{1, 2, copyLen / 2, copyLen - 1, copyLen} {
		resumed := newConsumer("s")
		resumed.add(whole.records[:cut])
		at := whole.records[cut-1].Position
		require.NoError(t, primary.Ack(ctx(t), "s", "t-0002", at))
		follower := tc.reader(t, tc.replica(t, "t-0002", source.TypeRDOnly))
		_, err := resumed.drain(ctx(t), follower, "t-0002", at)
		require.NoError(t, err)
		require.Zero(t, resumed.dups, "cut after %d", cut)
		require.Equal(t, whole.records, resumed.records, "resumed after record %d (%s)", cut, at)
	}
}

// Resync with the id of the tablet's last resync returns its start and
// copies nothing again; another id starts again after everything before,
// and a reader from the first start is moved to the second.
func TestResyncWithTheSameIDReturnsTheSameStart(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	tc.Write(1000)
	first, err := tc.client.Resync(ctx(t), "s", "t-0003", "a", source.Checkpoint{})
	require.NoError(t, err)
	end := lastPosition(t, tc, "t-0003")
	require.Equal(t, 1, end.Compare(first), "the copy is in the log")
	resp, err := tc.client.Topology().ResyncStream(ctx(t), &sourcepb.ResyncStreamRequest{Stream: "s", Tablet: "t-0003", Id: "a"})
	require.NoError(t, err)
	require.True(t, resp.Existed)
	require.Equal(t, first.String(), resp.Start)
	require.Equal(t, uint64(len(tc.tabletRows(t, "t-0003"))), resp.Rows)
	require.Equal(t, end, lastPosition(t, tc, "t-0003"), "nothing copied again")

	second, err := tc.client.Resync(ctx(t), "s", "t-0003", "b", source.Checkpoint{})
	require.NoError(t, err)
	require.Equal(t, end, second, "a new id starts again after the first copy")
	rd := tc.reader(t, tc.replica(t, "t-0003", source.TypePrimary))
	b, err := rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0003", From: first, MaxRecords: 1})
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	require.Equal(t, source.ResyncBegin, b.Records[0].Op)
	require.Equal(t, 1, b.Records[0].Position.Compare(second), "the first start reads from the second")
	again, err := tc.client.Resync(ctx(t), "s", "t-0003", "a", source.Checkpoint{})
	require.NoError(t, err)
	require.Equal(t, 1, again.Compare(second), "only the last resync's id is remembered")
}

// A stream over some tables copies only those; a split tablet is not
// resynced (its children are); bad requests get a status.
func TestResyncCopiesTheStreamsTablesAndRefusesBadRequests(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s", Tables: []string{"orders"}})
	require.NoError(t, err)
	tc.Write(1500)
	cp, err := tc.client.Resync(ctx(t), "s", "t-0001", "x", source.Checkpoint{})
	require.NoError(t, err)
	c := newConsumer("s")
	_, err = c.drain(ctx(t), tc.reader(t, tc.replica(t, "t-0001", source.TypePrimary)), "t-0001", cp)
	require.NoError(t, err)
	resp, err := tc.admin.Rows(ctx(t), &sourcepb.RowsRequest{Table: "orders", Tablet: "t-0001"})
	require.NoError(t, err)
	reads := requireCopyThenChanges(t, c.records, cp, len(resp.Rows))
	for _, r := range reads {
		require.Equal(t, "orders", r.Table)
	}

	split, err := tc.admin.Split(ctx(t), &sourcepb.SplitRequest{Tablet: "t-0004"})
	require.NoError(t, err)
	topo := tc.client.Topology()
	for _, tt := range []struct {
		name   string
		req    *sourcepb.ResyncStreamRequest
		code   codes.Code
		reason sourcepb.Reason
	}{
		{"empty stream", &sourcepb.ResyncStreamRequest{Tablet: "t-0001"}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"empty tablet", &sourcepb.ResyncStreamRequest{Stream: "s"}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"unknown stream", &sourcepb.ResyncStreamRequest{Stream: "nope", Tablet: "t-0001"}, codes.NotFound, sourcepb.Reason_UNKNOWN_STREAM},
		{"unknown tablet", &sourcepb.ResyncStreamRequest{Stream: "s", Tablet: "t-9999"}, codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET},
		{"split tablet", &sourcepb.ResyncStreamRequest{Stream: "s", Tablet: "t-0004"}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := topo.ResyncStream(ctx(t), tt.req)
			requireStatus(t, err, tt.code, tt.reason)
			require.Equal(t, source.Fatal, tc.client.Classify(err).Action)
		})
	}
	_, err = tc.client.Resync(ctx(t), "s", split.Children[0], "", source.Checkpoint{})
	require.NoError(t, err, "a split's child is resynced")
	_, err = tc.admin.Rows(ctx(t), &sourcepb.RowsRequest{Tablet: "t-9999"})
	requireStatus(t, err, codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET)
}

// A stream deleted and created again under its ID does not read the
// copies of the one it replaces.
func TestAStreamCreatedAgainDoesNotReadTheDeletedOnesCopy(t *testing.T) {
	tc := start(t, nil)
	for _, id := range []string{"s", "holder"} { // holder keeps the history
		_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: id})
		require.NoError(t, err)
	}
	tc.Write(500)
	_, err := tc.client.Resync(ctx(t), "s", "t-0001", "", source.Checkpoint{})
	require.NoError(t, err)
	require.NoError(t, tc.client.DeleteStream(ctx(t), "s"))
	_, err = tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	c := newConsumer("s")
	_, err = c.drain(ctx(t), tc.reader(t, tc.replica(t, "t-0001", source.TypePrimary)), "t-0001", source.Checkpoint{})
	require.NoError(t, err)
	for _, r := range c.records {
		require.False(t, r.Op == source.Read || r.Op.Marker(), "%s at %s", r.Op, r.Position)
	}
	due, err := tc.Digest("s")
	require.NoError(t, err)
	require.Equal(t, due["t-0001"], c.got)
	require.NotEqual(t, digest.Digest{}, c.got)
}

// Resyncs taken while the workload writes copy the rows as the log holds
// them at their start: the strict replay of each copy and the changes
// after it (no change after the start already in the copy, none before it
// missing) ends equal to the tablet's rows. The race it guards against is
// made certain in TestResyncWaitsForAChangeOnItsWayToTheLog.
func TestResyncUnderAWriteWorkloadCopiesExactlyTheRowsAtItsStart(t *testing.T) {
	tc := start(t, func(c *cluster.Config) { c.Rate = 20000; c.Tablets = 2 })
	const streams = 30
	starts := map[string]source.Checkpoint{}
	for i := range streams {
		id := fmt.Sprintf("s%02d", i)
		_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: id})
		require.NoError(t, err)
		time.Sleep(7 * time.Millisecond)
		cp, err := tc.client.Resync(ctx(t), id, "t-0001", "", source.Checkpoint{})
		require.NoError(t, err)
		starts[id] = cp
	}
	_, err := tc.admin.Workload(ctx(t), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STOP})
	require.NoError(t, err)
	want := tc.tabletRows(t, "t-0001")
	rd := tc.reader(t, tc.replica(t, "t-0001", source.TypePrimary))
	for id, cp := range starts {
		c := newConsumer(id)
		_, err := c.drain(ctx(t), rd, "t-0001", cp)
		require.NoError(t, err)
		require.Equal(t, source.ResyncBegin, c.records[0].Op, "stream %s", id)
		require.Equal(t, want, replayTablet(t, c.records), "stream %s from %s", id, cp)
	}
}

// Tail follows a tablet's changes past a resync's copy, however long the
// copy, without showing it.
func TestTailSkipsAResyncsCopy(t *testing.T) {
	tc := start(t, func(c *cluster.Config) { c.Tablets = 2 })
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	tc.Write(6000)
	resp, err := tc.client.Topology().ResyncStream(ctx(t), &sourcepb.ResyncStreamRequest{Stream: "s", Tablet: "t-0001"})
	require.NoError(t, err)
	require.Greater(t, resp.Rows, uint64(1000), "a copy longer than a read of the log")
	tc.Write(200)
	all, err := tc.Digest("")
	require.NoError(t, err)
	changes := all["t-0001"].Records
	last := lastPosition(t, tc, "t-0001")

	tail, err := tc.admin.Tail(ctx(t), &sourcepb.TailRequest{Tablet: "t-0001", From: "1.0"})
	require.NoError(t, err)
	for n := uint64(1); n <= changes; n++ {
		r, err := tail.Recv()
		require.NoError(t, err, "record %d of %d", n, changes)
		require.False(t, isCopy(r.Op), "tail showed %s at %s", r.Op, r.Position)
		if n == changes {
			require.Equal(t, last.String(), r.Position, "the tablet's last change is its last record")
		}
	}
}

func isCopy(op sourcepb.Op) bool {
	return op == sourcepb.Op_READ || op == sourcepb.Op_RESYNC_BEGIN || op == sourcepb.Op_RESYNC_END
}
