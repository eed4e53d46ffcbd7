package vitess

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"

	"github.com/tabletflow/tabletflow/source"
)

// A Reshard or MoveTables that switches a shard's traffic writes a
// journal on each of its source shards, which their vttablets' VStreams
// send as a JOURNAL event (in a transaction of its own) after the
// shard's last change: the new shards (ShardGtids), each with the GTID
// position of its own server where it takes over, and the source shards
// (Participants).
//
// A Reshard of the stream's keyspace that this shard takes part in ends
// its tablet as Split: its children are the new shards whose key range
// overlaps this shard's, in key order, and they start from the hand-off checkpoint,
// whose Opaque part lists each new shard's position:
//
//	handoff;<shard>=<GTID position>;<shard>=<GTID position>…
//
// (Term 0: a child's positions are its own server's, each after it.) A
// MoveTables of tables the stream reads ends the tablet Failed
// (TABLES_MOVED): they go on in another keyspace, which is another
// stream's; one of other tables changes nothing here.

// handoffMark starts a hand-off checkpoint's Opaque part.
const handoffMark = "handoff"

// journal is what a journal means for the shard's tablet: nil when it
// does not concern the stream, or the Split (or Failed) it ends with.
func (d *decoder) journal(j *binlogdatapb.Journal) (*Error, error) {
	if j.GetMigrationType() == binlogdatapb.MigrationType_TABLES {
		moved := j.GetTables()
		if len(d.streamed) > 0 {
			moved = slices.DeleteFunc(slices.Clone(moved), func(t string) bool { return !slices.Contains(d.streamed, t) })
		}
		if len(moved) == 0 {
			return nil, nil
		}
		var to []string
		for _, sg := range j.GetShardGtids() {
			if !slices.Contains(to, sg.GetKeyspace()) {
				to = append(to, sg.GetKeyspace())
			}
		}
		return newError(source.Fatal, "TABLES_MOVED",
			"shard %s: a MoveTables switched tables %v of the stream to keyspace %v (journal %d): their changes go on there; start a stream on that keyspace",
			d.shard, moved, to, j.GetId()), nil
	}
	if !slices.ContainsFunc(j.GetParticipants(), func(p *binlogdatapb.KeyspaceShard) bool {
		return p.GetKeyspace() == d.keyspace && p.GetShard() == d.shard
	}) {
		return nil, newError(source.Fatal, "JOURNAL", "shard %s sent journal %d, whose participants %v do not include it",
			d.shard, j.GetId(), j.GetParticipants())
	}
	own, err := parseShard(d.shard)
	if err != nil {
		return nil, newError(source.Fatal, "JOURNAL", "journal %d: %v", j.GetId(), err)
	}
	var children []string
	var positions []string
	// In key order: the journal lists them as Vitess found them.
	gtids := slices.Clone(j.GetShardGtids())
	slices.SortStableFunc(gtids, func(a, b *binlogdatapb.ShardGtid) int {
		ka, _ := parseShard(a.GetShard())
		kb, _ := parseShard(b.GetShard())
		return bytes.Compare(ka.start, kb.start)
	})
	for _, sg := range gtids {
		if sg.GetKeyspace() != d.keyspace {
			return nil, newError(source.Fatal, "JOURNAL", "shard %s: journal %d of a Reshard names shard %s/%s of another keyspace",
				d.shard, j.GetId(), sg.GetKeyspace(), sg.GetShard())
		}
		kr, err := parseShard(sg.GetShard())
		if err != nil {
			return nil, newError(source.Fatal, "JOURNAL", "journal %d: %v", j.GetId(), err)
		}
		if !kr.overlaps(own) {
			continue
		}
		if _, err := count(sg.GetGtid()); err != nil || strings.ContainsAny(sg.GetGtid(), ";= ") {
			return nil, newError(source.Fatal, "JOURNAL", "journal %d: position %q of shard %s: not a GTID position", j.GetId(), sg.GetGtid(), sg.GetShard())
		}
		children = append(children, sg.GetShard())
		positions = append(positions, sg.GetShard()+"="+sg.GetGtid())
	}
	if len(children) == 0 {
		return nil, newError(source.Fatal, "JOURNAL", "shard %s: journal %d names no new shard overlapping it (%v)",
			d.shard, j.GetId(), j.GetShardGtids())
	}
	handoff := source.Checkpoint{Opaque: handoffMark + ";" + strings.Join(positions, ";")}
	if _, err := source.ParseCheckpoint(handoff.String()); err != nil {
		return nil, newError(source.Fatal, "JOURNAL", "shard %s: journal %d: the new shards' positions do not fit in a checkpoint: %v", d.shard, j.GetId(), err)
	}
	e := newError(source.Split, "RESHARDED", "shard %s ended: a Reshard switched its traffic (journal %d) to shards %v, from %s",
		d.shard, j.GetId(), children, strings.Join(positions, ", "))
	e.Children, e.Handoff = children, handoff
	return e, nil
}

// handoffPosition is where shard starts from a hand-off checkpoint, or
// false when cp is not one.
func handoffPosition(cp source.Checkpoint, shard string) (string, bool, error) {
	rest, ok := strings.CutPrefix(cp.Opaque, handoffMark+";")
	if !ok {
		return "", false, nil
	}
	for part := range strings.SplitSeq(rest, ";") {
		if s, pos, _ := strings.Cut(part, "="); s == shard {
			return pos, true, nil
		}
	}
	return "", true, fmt.Errorf("%w: hand-off %q names no position for shard %s", source.ErrBadCheckpoint, cp.String(), shard)
}

// shardRange is a shard's key range, [start, end), an empty end being the
// end of the key space.
type shardRange struct{ start, end []byte }

// parseShard reads a shard's name as Vitess names shards: "<start>-<end>"
// in hex, either side empty at the key space's ends ("-80", "80-",
// "40-80"), or "0" or "-" for the whole key space.
func parseShard(shard string) (shardRange, error) {
	if shard == "0" || shard == "-" {
		return shardRange{}, nil
	}
	lo, hi, ok := strings.Cut(shard, "-")
	start, err1 := hex.DecodeString(lo)
	end, err2 := hex.DecodeString(hi)
	if !ok || err1 != nil || err2 != nil {
		return shardRange{}, fmt.Errorf("shard %q: not a key range (<start>-<end> in hex)", shard)
	}
	return shardRange{start, end}, nil
}

// overlaps reports whether two key ranges share a key.
func (a shardRange) overlaps(b shardRange) bool {
	before := func(start, end []byte) bool { return len(end) == 0 || bytes.Compare(start, end) < 0 }
	return before(a.start, b.end) && before(b.start, a.end)
}
