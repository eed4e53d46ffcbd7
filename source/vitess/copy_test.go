package vitess

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"

	"github.com/tabletflow/tabletflow/source"
)

// The copy's events below are in the order a v24 vttablet's uvstreamer
// sends them for a VStream from no position (copy.go in
// go/vt/vttablet/tabletserver/vstreamer): per table BEGIN, FIELD, GTID
// (the snapshot's position) then ROWs, LASTPK and COMMIT per packet, the
// table's end as BEGIN, LASTPK (completed), COMMIT; between tables the
// catchup's transactions; at the end COPY_COMPLETED.

func lastPK(table string, id string) *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_LASTPK, LastPKEvent: &binlogdatapb.LastPKEvent{
		TableLastPK: &binlogdatapb.TableLastPK{TableName: table, Lastpk: &querypb.QueryResult{
			Fields: []*querypb.Field{{Name: "customer_id", Type: querypb.Type_INT64}},
			Rows:   []*querypb.Row{row(id)},
		}}}}
}

func tableCopied(table string) *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_LASTPK, LastPKEvent: &binlogdatapb.LastPKEvent{
		TableLastPK: &binlogdatapb.TableLastPK{TableName: table}, Completed: true}}
}

func copyCompleted() *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_COPY_COMPLETED}
}

func customer(id string) *binlogdatapb.RowChange {
	return &binlogdatapb.RowChange{After: row(id, "c"+id+"@example.com", "1.50", "2026-01-01", `{}`)}
}

func copyingDecoder() *decoder {
	d := newDecoder("-80", source.Checkpoint{})
	d.keyspace, d.copy = "commerce", &copyState{}
	return d
}

func TestACopysRowsAreReadRecordsAndItsCheckpointsSayWhereTheCopyStands(t *testing.T) {
	d := copyingDecoder()
	require.NoError(t, d.add([]*binlogdatapb.VEvent{
		begin(), customerFields(), gtid("MariaDB/0-1-10"),
		rowEvent("customer", customer("1"), customer("2")), lastPK("customer", "2"), commit(0),
		begin(), rowEvent("customer", customer("3")), lastPK("customer", "3"), commit(0),
		begin(), tableCopied("customer"), commit(0),
	}))
	recs, cp := d.take(100, source.Checkpoint{})
	require.Len(t, recs, 3)
	for i, r := range recs {
		require.Equal(t, source.Read, r.Op, "a copied row is a read")
		require.Equal(t, source.Checkpoint{Term: 10, Index: uint64(i + 1)}, r.Position, "numbered at the snapshot's position")
	}
	requireJSON(t, `{"customer_id": 3}`, recs[2].Key)
	back, err := source.ParseCheckpoint(cp.String())
	require.NoError(t, err)
	pos, state, err := positionOf(back)
	require.NoError(t, err)
	require.Equal(t, "MariaDB/0-1-10", pos)
	require.Equal(t, "customer", state.table, "the table's end is not a checkpoint of its own: the last packet's is")
	require.Equal(t, "3", string(state.after.Rows[0].Values))
	require.Equal(t, uint64(3), cp.Index)

	// The catchup before the next table: a change at a later position,
	// then the next table's rows at its snapshot's position, after the
	// catchup's records there.
	require.NoError(t, d.add([]*binlogdatapb.VEvent{
		begin(), rowEvent("customer", &binlogdatapb.RowChange{Before: row("1", "a", "1", "2026-01-01", "{}"), After: row("1", "b", "1", "2026-01-01", "{}")}),
		gtid("MariaDB/0-1-11"), commit(1_800_000_000),
		begin(), customerFields(), rowEvent("customer", customer("4")), lastPK("corder", "4"), commit(0),
	}))
	recs, cp = d.take(100, cp)
	require.Len(t, recs, 2)
	require.Equal(t, source.Update, recs[0].Op, "the catchup's changes are changes")
	require.Equal(t, source.Checkpoint{Term: 11, Index: 1}, recs[0].Position)
	require.Equal(t, source.Read, recs[1].Op)
	require.Equal(t, source.Checkpoint{Term: 11, Index: 2}, recs[1].Position, "after the change delivered at the same position")
	require.Contains(t, cp.String(), "11.2@MariaDB/0-1-11;copy=corder;after=")

	// The end of the copy: checkpoints are plain positions again.
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), tableCopied("corder"), commit(0), copyCompleted(),
		begin(), rowEvent("customer", customer("5")), gtid("MariaDB/0-1-12"), commit(1_800_000_001)}))
	recs, cp = d.take(100, cp)
	require.Len(t, recs, 1)
	require.Equal(t, source.Insert, recs[0].Op)
	require.Equal(t, "12.1@MariaDB/0-1-12", cp.String())
}

func TestACheckpointBetweenTablesOfACopySaysWhichWasCopiedLast(t *testing.T) {
	d := copyingDecoder()
	require.NoError(t, d.add([]*binlogdatapb.VEvent{
		begin(), customerFields(), gtid("MariaDB/0-1-10"), rowEvent("customer", customer("1")), lastPK("customer", "1"), commit(0),
		begin(), tableCopied("customer"), commit(0),
		// a catchup transaction at a later position
		begin(), rowEvent("customer", customer("2")), gtid("MariaDB/0-1-11"), commit(1),
	}))
	_, cp := d.take(100, source.Checkpoint{})
	require.Equal(t, "11.1@MariaDB/0-1-11;copied=customer", cp.String())
	_, state, err := positionOf(cp)
	require.NoError(t, err)
	require.Equal(t, []string{"customer2"}, state.toCopy([]string{"customer2", "corder", "customer", "a"}),
		"the tables after the last copied, in the copy's (name) order")
}

func TestCopyStatesRoundTripAndSayWhatIsLeftToCopy(t *testing.T) {
	pk := &querypb.QueryResult{Fields: []*querypb.Field{{Name: "id", Type: querypb.Type_INT64}}, Rows: []*querypb.Row{row("42")}}
	for _, st := range []*copyState{{}, {table: "t;1=x", after: pk}, {copied: "customer"}} {
		suffix, err := st.suffix()
		require.NoError(t, err)
		cp, err := checkpointAt("MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57"+suffix, 3)
		require.NoError(t, err)
		back, err := source.ParseCheckpoint(cp.String())
		require.NoError(t, err, cp.String())
		pos, got, err := positionOf(back)
		require.NoError(t, err)
		require.Equal(t, "MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57", pos)
		require.Equal(t, st.table, got.table)
		require.Equal(t, st.copied, got.copied)
		if st.after != nil {
			require.True(t, proto.Equal(st.after, got.after))
		}
	}
	tables := []string{"b", "a", "c"}
	require.Equal(t, []string{"a", "b", "c"}, (&copyState{}).toCopy(tables))
	require.Equal(t, []string{"b", "c"}, (&copyState{table: "b", after: pk}).toCopy(tables), "the table in progress goes on")
	require.Equal(t, []string{"c"}, (&copyState{copied: "b"}).toCopy(tables))
	require.Empty(t, (&copyState{copied: "c"}).toCopy(tables))

	for _, bad := range []string{"MariaDB/0-1-5;copy=t", "MariaDB/0-1-5;after=AAAA", "MariaDB/0-1-5;nope=1", "MariaDB/0-1-5;copy=t;after=!!"} {
		_, _, err := positionOf(source.Checkpoint{Term: 5, Opaque: bad})
		require.ErrorIs(t, err, source.ErrBadCheckpoint, bad)
	}
}

func TestALASTPKOutsideACopyIsAnError(t *testing.T) {
	d := newDecoder("-80", source.Checkpoint{})
	require.ErrorContains(t, d.add([]*binlogdatapb.VEvent{begin(), lastPK("customer", "1")}), "outside a copy")
}

func TestACopyStartsWithNoPositionAndGoesOnFromItsCheckpointOnAnyVttablet(t *testing.T) {
	f := newFakeVitess(t, "-80")
	first := f.tablet("zone2", 101, "-80", replica)
	first.setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if err := send(begin(), customerFields(), gtid("MariaDB/0-1-10"), rowEvent("customer", customer("1"), customer("2")), lastPK("customer", "2"), commit(0)); err != nil {
			return err
		}
		return errHold
	})
	second := f.tablet("zone3", 102, "-80", replica)
	second.setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if len(req.TableLastPKs) == 0 { // a plain stream
			if err := send(begin(), customerFields(), rowEvent("customer", customer("4")), gtid("MariaDB/0-1-11"), commit(1)); err != nil {
				return err
			}
			return errHold
		}
		if err := send(begin(), customerFields(), gtid("MariaDB/0-1-10"), rowEvent("customer", customer("3")), lastPK("customer", "3"), commit(0),
			begin(), tableCopied("customer"), commit(0), copyCompleted()); err != nil {
			return err
		}
		return errHold
	})
	s := f.source()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	get := func(alias string, from source.Checkpoint) source.Batch {
		rd, err := s.OpenReplica(ctx, replicaOf(t, s, alias))
		require.NoError(t, err)
		defer rd.(*Reader).Close()
		b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: "s", Tablet: "-80", From: from, MaxRecords: 100, MaxWait: time.Second, StartFrom: source.StartSnapshot})
		require.NoError(t, err)
		return b
	}
	b := get("zone2-0000000101", source.Checkpoint{})
	require.Len(t, b.Records, 2)
	req := first.vstreams()[0]
	require.Empty(t, req.Position, "a snapshot's start is a VStream from no position: the copy phase")
	require.Empty(t, req.TableLastPKs)

	b2 := get("zone3-0000000102", b.Checkpoint)
	require.Len(t, b2.Records, 1)
	require.Equal(t, source.Checkpoint{Term: 10, Index: 3}, b2.Records[0].Position)
	req = second.vstreams()[0]
	require.Equal(t, "MariaDB/0-1-10", req.Position)
	require.Len(t, req.TableLastPKs, 1)
	require.Equal(t, "customer", req.TableLastPKs[0].TableName)
	require.Equal(t, "2", string(req.TableLastPKs[0].Lastpk.Rows[0].Values), "the copy goes on after the last row delivered")
	require.Equal(t, []string{"customer"}, req.Options.GetTablesToCopy(), "the tables copied before are not copied again (the fake's keyspace: corder < customer)")

	// Nothing left to copy: a plain stream from the position.
	b3 := get("zone3-0000000102", source.Checkpoint{Term: 10, Index: 3, Opaque: "MariaDB/0-1-10;copied=customer"})
	req = second.vstreams()[1]
	require.Equal(t, "MariaDB/0-1-10", req.Position)
	require.Empty(t, req.TableLastPKs)
	require.Nil(t, req.Options)
	require.Equal(t, "11.1@MariaDB/0-1-11", b3.Checkpoint.String())
}

func TestACopysRowsAtThePositionOfAnIdleCheckpointFollowIt(t *testing.T) {
	// The catchup ended at a transaction of other tables (an idle
	// checkpoint, no records), and the next table's snapshot is at that
	// same position.
	d := newDecoder("-80", source.Checkpoint{Term: 244, Opaque: "MariaDB/0-1-244;copied=corder"})
	d.keyspace, d.copy, d.gtid = "commerce", &copyState{copied: "corder"}, "MariaDB/0-1-244"
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), customerFields(), rowEvent("customer", customer("1")), lastPK("customer", "1"), commit(0)}))
	recs, cp := d.take(100, source.Checkpoint{})
	require.Len(t, recs, 1)
	require.Equal(t, source.Checkpoint{Term: 244, Index: 1}, recs[0].Position)
	require.Contains(t, cp.String(), "244.1@MariaDB/0-1-244;copy=customer;after=")
}
