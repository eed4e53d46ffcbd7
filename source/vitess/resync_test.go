package vitess

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"

	"github.com/tabletflow/tabletflow/source"
)

// resyncFake is a shard -80 whose primary is at MariaDB/0-1-20 and whose
// replica copies customer (the fake keyspace's tables, corder empty)
// from that position: two rows, then the copy's end.
func resyncFake(t *testing.T) (*Source, *fakeTablet) {
	f := newFakeVitess(t, "-80")
	f.tablet("zone1", 100, "-80", primary).setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if err := send(gtid("MariaDB/0-1-20"), other()); err != nil {
			return err
		}
		return errHold
	})
	rep := f.tablet("zone2", 101, "-80", replica)
	rep.setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if len(req.TableLastPKs) == 0 { // a plain stream, after the copy
			if err := send(begin(), customerFields(), rowEvent("customer", customer("9")), gtid("MariaDB/0-1-21"), commit(1)); err != nil {
				return err
			}
			return errHold
		}
		if err := send(begin(), tableCopied("corder"), commit(0),
			begin(), customerFields(), gtid("MariaDB/0-1-20"), rowEvent("customer", customer("1"), customer("2")), lastPK("customer", "2"), commit(0),
			begin(), tableCopied("customer"), commit(0), copyCompleted()); err != nil {
			return err
		}
		return errHold
	})
	return f.source(), rep
}

// readFrom reads a shard from the replica at from until its checkpoint
// passes copy states, and returns the records and the last checkpoint.
func readFrom(t *testing.T, s *Source, from source.Checkpoint) ([]source.Record, source.Checkpoint) {
	recs, cp, _ := readCopy(t, s, from)
	return recs, cp
}

// readCopy is readFrom with the reader's copy report after the read.
func readCopy(t *testing.T, s *Source, from source.Checkpoint) ([]source.Record, source.Checkpoint, *source.CopyProgress) {
	t.Helper()
	rd, err := s.OpenReplica(context.Background(), replicaOf(t, s, "zone2-0000000101"))
	require.NoError(t, err)
	defer rd.(*Reader).Close()
	b, err := read(t, rd, "-80", from, time.Second)
	require.NoError(t, err)
	return b.Records, b.Checkpoint, rd.(*Reader).Copy()
}

func TestAResyncIsACopyAtThePrimarysPositionBetweenMarkersAfterTheShardsLastCheckpoint(t *testing.T) {
	s, rep := resyncFake(t)
	ctx := context.Background()

	// The shard's last checkpoint is behind the primary: the start is the
	// primary's position, a copy not begun.
	start, err := s.Resync(ctx, "s", "-80", "-80/1", source.Checkpoint{Term: 12, Index: 3, Opaque: "MariaDB/0-1-12"})
	require.NoError(t, err)
	require.Equal(t, "20.0@MariaDB/0-1-20;copy;resync=-80%2F1", start.String())

	recs, cp, progress := readCopy(t, s, start)
	require.Equal(t, &source.CopyProgress{Kind: source.CopyResync, ID: "-80/1", Tables: 2, TablesDone: 2, Rows: 2, Done: true}, progress)
	req := rep.vstreams()[0]
	require.Equal(t, "MariaDB/0-1-20", req.Position, "the copy's catchup starts at the resync's position")
	require.Equal(t, []string{"corder", "customer"}, req.Options.GetTablesToCopy(), "every table is copied")
	var ops []source.Op
	for i, r := range recs {
		ops = append(ops, r.Op)
		require.Equal(t, source.Checkpoint{Term: 20, Index: uint64(i + 1)}, r.Position, "positions follow the start")
		require.Equal(t, "-80", r.Tablet)
	}
	require.Equal(t, []source.Op{source.ResyncBegin, source.Read, source.Read, source.ResyncEnd}, ops)
	require.Equal(t, "20.4@MariaDB/0-1-20", cp.String(), "the copy over, the checkpoint is a plain position")
	require.False(t, recs[0].CommitTime.IsZero(), "a marker has a time (the sink's lag)")
	require.False(t, recs[3].CommitTime.IsZero(), "the end marker too, after rows that have none")

	// Read a transaction at a time: the checkpoints inside the copy carry
	// the resync, so a reader opened at any of them goes on with it.
	rd, err := s.OpenReplica(ctx, replicaOf(t, s, "zone2-0000000101"))
	require.NoError(t, err)
	defer rd.(*Reader).Close()
	var during []string
	for from := start; ; {
		b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: "s", Tablet: "-80", From: from, MaxRecords: 1, MaxWait: time.Second})
		require.NoError(t, err)
		from = b.Checkpoint
		if !strings.Contains(from.Opaque, ";") {
			break
		}
		during = append(during, from.Opaque)
	}
	require.Len(t, during, 2, "after the begin marker, after the rows: %v", during)
	require.Equal(t, "MariaDB/0-1-20;copy;resync=-80%2F1", during[0])
	require.Regexp(t, `^MariaDB/0-1-20;copy=customer;after=[^;]+;resync=-80%2F1$`, during[1])

	// A shard with no transaction since its last checkpoint starts at it.
	again, err := s.Resync(ctx, "s", "-80", "-80/2", source.Checkpoint{Term: 20, Index: 5, Opaque: "MariaDB/0-1-20"})
	require.NoError(t, err)
	require.Equal(t, source.Checkpoint{Term: 20, Index: 5, Opaque: "MariaDB/0-1-20;copy;resync=-80%2F2"}, again)
	recs, _ = readFrom(t, s, again)
	require.Equal(t, source.ResyncBegin, recs[0].Op)
	require.Equal(t, source.Checkpoint{Term: 20, Index: 6}, recs[0].Position, "after the last checkpoint's records")

	// A checkpoint ahead of the primary: the histories differ.
	_, err = s.Resync(ctx, "s", "-80", "-80/3", source.Checkpoint{Term: 30, Opaque: "MariaDB/0-1-30"})
	require.Equal(t, source.Fatal, Classify(err).Action, "%v", err)
	require.Equal(t, "POSITION_ORDER", Classify(err).Reason)
	_, err = s.Resync(ctx, "s", "-40", "x", source.Checkpoint{})
	require.Equal(t, source.Fatal, Classify(err).Action, "%v", err)
	require.Contains(t, err.Error(), `no shard "-40"`)
}

func TestAResyncsCopyGoesOnWithItsMarkersFromItsCheckpoints(t *testing.T) {
	s, rep := resyncFake(t)
	// Inside the copy: no marker again; the end marker at COPY_COMPLETED.
	inside := source.Checkpoint{Term: 20, Index: 2, Opaque: "MariaDB/0-1-20;copied=corder;resync=r"}
	recs, _ := readFrom(t, s, inside)
	rd, err := s.OpenReplica(context.Background(), replicaOf(t, s, "zone2-0000000101"))
	require.NoError(t, err)
	defer rd.(*Reader).Close()
	b, err := rd.GetChanges(context.Background(), source.ChangesRequest{Stream: "s", Tablet: "-80", From: inside, MaxRecords: 1, MaxWait: time.Second})
	require.NoError(t, err)
	require.Len(t, b.Records, 2, "one transaction comes whole")
	require.Equal(t, &source.CopyProgress{Kind: source.CopyResync, ID: "r", Tables: 2, TablesDone: 1, Table: "customer", Rows: 2},
		rd.(*Reader).Copy(), "the copy's report as its last checkpoint says")
	require.Equal(t, []source.Op{source.Read, source.Read, source.ResyncEnd}, []source.Op{recs[0].Op, recs[1].Op, recs[2].Op})
	require.Len(t, recs, 3)
	require.Equal(t, source.Checkpoint{Term: 20, Index: 3}, recs[0].Position)

	// Everything copied but the end marker not delivered: it comes first,
	// then the changes from the position.
	copied := source.Checkpoint{Term: 20, Index: 7, Opaque: "MariaDB/0-1-20;copied=customer;resync=r"}
	recs, cp := readFrom(t, s, copied)
	reqs := rep.vstreams()
	require.Empty(t, reqs[len(reqs)-1].TableLastPKs, "nothing left to copy")
	require.Len(t, recs, 2)
	require.Equal(t, source.ResyncEnd, recs[0].Op)
	require.Equal(t, source.Checkpoint{Term: 20, Index: 8}, recs[0].Position)
	require.Equal(t, source.Insert, recs[1].Op)
	require.Equal(t, "21.1@MariaDB/0-1-21", cp.String())

	// A stream's own snapshot start has no markers.
	recs, _ = readFrom(t, s, source.Checkpoint{Term: 20, Index: 2, Opaque: "MariaDB/0-1-20;copied=corder"})
	for _, r := range recs {
		require.False(t, r.Op.Marker(), "%+v", r)
	}
}

func TestAResyncWithNothingToCopyDeliversBothMarkersInOneTransaction(t *testing.T) {
	d := newDecoder("-80", source.Checkpoint{Term: 20, Index: 2, Opaque: "MariaDB/0-1-20;copy;resync=r"})
	d.gtid = "MariaDB/0-1-20"
	at := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	require.NoError(t, d.resumed(&copyState{resync: "r"}, false, at))
	recs, cp := d.take(1, source.Checkpoint{})
	require.Len(t, recs, 2, "a checkpoint between them would lose the end")
	require.Equal(t, []source.Op{source.ResyncBegin, source.ResyncEnd}, []source.Op{recs[0].Op, recs[1].Op})
	require.Equal(t, source.Checkpoint{Term: 20, Index: 4}, recs[1].Position)
	require.Equal(t, "20.4@MariaDB/0-1-20", cp.String())
}
