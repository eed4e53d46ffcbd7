package vitess

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/source"
)

// A resync gives one shard of a stream a fresh start (source.Resyncer): a
// copy of the stream's tables at the GTID position the shard's primary is
// at when it is asked, made by the copy phase of the vttablet's VStream
// as a stream's snapshot start is (copy.go), from that position rather
// than from none, so that the copy's positions follow the shard's last
// checkpoint. The start is the checkpoint "<position>;copy;resync=<id>":
// a reader opened there delivers a ResyncBegin marker, the rows as Read
// records woven with the changes made meanwhile, a ResyncEnd marker once
// COPY_COMPLETED comes, then the changes. The copy goes on from its
// checkpoints across reader restarts as a snapshot start's does, the
// markers with it. Nothing is kept on the servers: a second call makes a
// new start, and the vttablets need hold no binary logs from before it.

var _ source.Resyncer = (*Source)(nil)

// resyncWait bounds reading the primary's position.
const resyncWait = 10 * time.Second

// Resync returns the shard's fresh start: a copy at its primary's
// position now, after every position of after (the shard's last
// checkpoint) — at it when the shard has had no transaction since.
func (s *Source) Resync(ctx context.Context, stream, tablet, id string, after source.Checkpoint) (source.Checkpoint, error) {
	tablets, err := s.ListTablets(ctx)
	if err != nil {
		return source.Checkpoint{}, err
	}
	var primary *source.Replica
	known := false
	for _, t := range tablets {
		if t.ID != tablet {
			continue
		}
		known = true
		for i, r := range t.Replicas {
			if r.Type == source.TypePrimary && r.Address != "" {
				primary = &t.Replicas[i]
			}
		}
	}
	switch {
	case !known:
		return source.Checkpoint{}, newError(source.Fatal, "UNKNOWN_TABLET", "resync of stream %s: keyspace %s has no shard %q", stream, s.cfg.Keyspace, tablet)
	case primary == nil:
		return source.Checkpoint{}, status.Errorf(codes.Unavailable, "resync of shard %s: the shard has no primary with an address to read its position from", tablet)
	}
	// The position: where a stream started at the primary's current
	// position says it is.
	rd := &Reader{src: s, rep: *primary}
	defer rd.Close()
	b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: tablet, MaxRecords: 1, MaxWait: resyncWait, StartFrom: source.StartLatest})
	if err != nil {
		return source.Checkpoint{}, fmt.Errorf("resync of shard %s: position of its primary %s: %w", tablet, primary.Alias, err)
	}
	pos := b.Checkpoint
	if pos.IsZero() {
		return source.Checkpoint{}, status.Errorf(codes.Unavailable, "resync of shard %s: its primary %s said no position within %s", tablet, primary.Alias, resyncWait)
	}
	if pos.Term < after.Term {
		return source.Checkpoint{}, newError(source.Fatal, "POSITION_ORDER",
			"resync of shard %s: its primary %s is at %s, which holds fewer transactions than the shard's checkpoint %s: the GTID histories differ",
			tablet, primary.Alias, pos.Opaque, after)
	}
	if id == "" {
		id = "resync"
	}
	suffix, err := (&copyState{resync: id}).suffix()
	if err != nil {
		return source.Checkpoint{}, err
	}
	start := source.Checkpoint{Term: pos.Term, Opaque: pos.Opaque + suffix}
	if pos.Term == after.Term {
		start.Index = after.Index
	}
	return start, nil
}
