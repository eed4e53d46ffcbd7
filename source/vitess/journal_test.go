package vitess

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"

	"github.com/tabletflow/tabletflow/source"
)

// A journal as a v24 vttablet's vstreamer sends it: BEGIN, JOURNAL,
// GTID, COMMIT, after the shard's last change.
func journalEvents(j *binlogdatapb.Journal, pos string) []*binlogdatapb.VEvent {
	return []*binlogdatapb.VEvent{begin(), {Type: binlogdatapb.VEventType_JOURNAL, Journal: j}, gtid(pos), commit(2)}
}

// reshard is the journal of a Reshard of commerce's -80 and 80- into
// four shards, as each source shard's journal lists them all.
func reshard() *binlogdatapb.Journal {
	return &binlogdatapb.Journal{
		Id: 7, MigrationType: binlogdatapb.MigrationType_SHARDS, LocalPosition: "MariaDB/0-100-6",
		ShardGtids: []*binlogdatapb.ShardGtid{
			{Keyspace: "commerce", Shard: "-40", Gtid: "MariaDB/0-300-4"},
			{Keyspace: "commerce", Shard: "40-80", Gtid: "MariaDB/0-400-9"},
			{Keyspace: "commerce", Shard: "80-c0", Gtid: "MariaDB/0-500-2"},
			{Keyspace: "commerce", Shard: "c0-", Gtid: "MariaDB/0-600-3"}},
		Participants: []*binlogdatapb.KeyspaceShard{{Keyspace: "commerce", Shard: "-80"}, {Keyspace: "commerce", Shard: "80-"}},
	}
}

func journalDecoder(shard string, streamed ...string) *decoder {
	d := newDecoder(shard, source.Checkpoint{Term: 5, Opaque: "MariaDB/0-100-5"})
	d.keyspace, d.streamed = "commerce", streamed
	return d
}

func TestAReshardJournalSplitsTheShardIntoTheNewShardsOverlappingIt(t *testing.T) {
	for _, tt := range []struct {
		shard    string
		children []string
		handoff  string
	}{
		{"-80", []string{"-40", "40-80"}, "handoff;-40=MariaDB/0-300-4;40-80=MariaDB/0-400-9"},
		{"80-", []string{"80-c0", "c0-"}, "handoff;80-c0=MariaDB/0-500-2;c0-=MariaDB/0-600-3"},
	} {
		d := journalDecoder(tt.shard)
		require.NoError(t, d.add(append([]*binlogdatapb.VEvent{begin(), customerFields(), rowEvent("customer", customer("1")), gtid("MariaDB/0-100-6"), commit(1)},
			journalEvents(reshard(), "MariaDB/0-100-7")...)))
		require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), rowEvent("customer", customer("2")), gtid("MariaDB/0-100-8"), commit(3)}),
			"nothing after the journal is read")
		recs, cp := d.take(100, source.Checkpoint{})
		require.Len(t, recs, 1, "the shard's last change is delivered before it ends")
		require.Equal(t, "7.0@MariaDB/0-100-7", cp.String(), "the journal's own position ends the shard")
		require.NotNil(t, d.end)
		c := Classify(d.end)
		require.Equal(t, source.Split, c.Action)
		require.Equal(t, "RESHARDED", c.Reason)
		require.Equal(t, tt.children, c.Children)
		require.Equal(t, source.Checkpoint{Opaque: tt.handoff}, c.Handoff)
		for _, child := range tt.children {
			pos, ok, err := handoffPosition(c.Handoff, child)
			require.NoError(t, err)
			require.True(t, ok)
			require.Contains(t, tt.handoff, child+"="+pos)
		}
		_, _, err := handoffPosition(c.Handoff, "80-")
		require.ErrorIs(t, err, source.ErrBadCheckpoint, "a shard the hand-off does not name")
	}

	// The children are in key order, whatever the journal's.
	shuffled := reshard()
	slices.Reverse(shuffled.ShardGtids)
	d := journalDecoder("-80")
	require.NoError(t, d.add(journalEvents(shuffled, "MariaDB/0-100-7")))
	require.Equal(t, []string{"-40", "40-80"}, Classify(d.end).Children)
	require.Equal(t, "handoff;-40=MariaDB/0-300-4;40-80=MariaDB/0-400-9", Classify(d.end).Handoff.Opaque)

	// A merge: the one new shard covers both.
	merge := &binlogdatapb.Journal{Id: 8, MigrationType: binlogdatapb.MigrationType_SHARDS,
		ShardGtids:   []*binlogdatapb.ShardGtid{{Keyspace: "commerce", Shard: "0", Gtid: "MariaDB/0-700-1"}},
		Participants: []*binlogdatapb.KeyspaceShard{{Keyspace: "commerce", Shard: "-80"}, {Keyspace: "commerce", Shard: "80-"}}}
	d = journalDecoder("80-")
	require.NoError(t, d.add(journalEvents(merge, "MariaDB/0-100-6")))
	require.Equal(t, []string{"0"}, Classify(d.end).Children)
}

func TestAMoveTablesJournalFailsTheShardOnlyWhenItMovesAStreamedTable(t *testing.T) {
	moved := &binlogdatapb.Journal{Id: 9, MigrationType: binlogdatapb.MigrationType_TABLES, Tables: []string{"corder"},
		ShardGtids:   []*binlogdatapb.ShardGtid{{Keyspace: "orders", Shard: "-80", Gtid: "MariaDB/0-800-1"}},
		Participants: []*binlogdatapb.KeyspaceShard{{Keyspace: "commerce", Shard: "-80"}}}
	d := journalDecoder("-80", "customer")
	require.NoError(t, d.add(journalEvents(moved, "MariaDB/0-100-6")))
	require.Nil(t, d.end, "another table's move changes nothing for the stream")
	require.NoError(t, d.add([]*binlogdatapb.VEvent{begin(), customerFields(), rowEvent("customer", customer("1")), gtid("MariaDB/0-100-7"), commit(1)}))
	recs, _ := d.take(100, source.Checkpoint{})
	require.Len(t, recs, 1)

	for _, streamed := range [][]string{{"customer", "corder"}, nil} {
		d := journalDecoder("-80", streamed...)
		require.NoError(t, d.add(journalEvents(moved, "MariaDB/0-100-6")))
		require.Equal(t, source.Classification{Action: source.Fatal, Reason: "TABLES_MOVED"}, Classify(d.end), "streamed %v", streamed)
		require.ErrorContains(t, d.end, "[corder] of the stream to keyspace [orders]")
	}
}

func TestAJournalTheShardCannotFollowIsAnError(t *testing.T) {
	notMine := reshard()
	notMine.Participants = notMine.Participants[1:]
	otherKeyspace := reshard()
	otherKeyspace.ShardGtids[0].Keyspace = "elsewhere"
	noChild := reshard()
	noChild.ShardGtids = noChild.ShardGtids[2:]
	badPos := reshard()
	badPos.ShardGtids[0].Gtid = "FilePos/binlog.000001:4"
	for name, j := range map[string]*binlogdatapb.Journal{"not a participant": notMine, "other keyspace": otherKeyspace, "no child": noChild, "bad position": badPos} {
		d := journalDecoder("-80")
		err := d.add(journalEvents(j, "MariaDB/0-100-6"))
		require.Equal(t, source.Classification{Action: source.Fatal, Reason: "JOURNAL"}, Classify(err), name)
	}
}

func TestKeyRangesOfShardNamesOverlapAsVitessMeansThem(t *testing.T) {
	overlaps := func(a, b string) bool {
		ka, err := parseShard(a)
		require.NoError(t, err)
		kb, err := parseShard(b)
		require.NoError(t, err)
		return ka.overlaps(kb)
	}
	require.True(t, overlaps("-80", "-40"))
	require.True(t, overlaps("-80", "40-80"))
	require.False(t, overlaps("-80", "80-c0"))
	require.False(t, overlaps("80-", "-80"))
	require.True(t, overlaps("0", "c0-"))
	require.True(t, overlaps("-", "-40"))
	require.True(t, overlaps("40-", "-"))
	_, err := parseShard("zz-80")
	require.Error(t, err)
}

func TestAReaderDeliversEverythingBeforeAJournalThenSplitsAndAChildStartsFromTheHandoff(t *testing.T) {
	f := newFakeVitess(t, "-80", "-40", "40-80")
	parent := f.tablet("zone1", 100, "-80", replica)
	parent.setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if err := send(begin(), customerFields(), rowEvent("customer", customer("1")), gtid("MariaDB/0-100-6"), commit(1)); err != nil {
			return err
		}
		j := reshard()
		j.ShardGtids = j.ShardGtids[:2]
		j.Participants = j.Participants[:1]
		if err := send(journalEvents(j, "MariaDB/0-100-7")...); err != nil {
			return err
		}
		return errHold
	})
	child := f.tablet("zone1", 300, "40-80", replica)
	child.setVStream(func(req *binlogdatapb.VStreamRequest, send func(...*binlogdatapb.VEvent) error) error {
		if err := send(begin(), customerFields(), rowEvent("customer", customer("2")), gtid("MariaDB/0-400-10"), commit(3)); err != nil {
			return err
		}
		return errHold
	})
	s := f.source()
	rd, err := s.OpenReplica(context.Background(), replicaOf(t, s, "zone1-0000000100"))
	require.NoError(t, err)
	defer rd.(*Reader).Close()
	b, err := read(t, rd, "-80", source.Checkpoint{Term: 5, Opaque: "MariaDB/0-100-5"}, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	_, err = read(t, rd, "-80", b.Checkpoint, 5*time.Second)
	c := Classify(err)
	require.Equal(t, source.Split, c.Action, "%v", err)
	require.Equal(t, []string{"-40", "40-80"}, c.Children)

	crd, err := s.OpenReplica(context.Background(), replicaOf(t, s, "zone1-0000000300"))
	require.NoError(t, err)
	defer crd.(*Reader).Close()
	b, err = read(t, crd, "40-80", c.Handoff, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, b.Records, 1)
	require.Equal(t, "10.1@MariaDB/0-400-10", b.Checkpoint.String())
	require.Equal(t, "MariaDB/0-400-9", child.vstreams()[0].Position, "the child starts where the journal says it takes over")
}
