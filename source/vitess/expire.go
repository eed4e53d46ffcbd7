package vitess

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"

	"github.com/tabletflow/tabletflow/source"
)

// probeTimeout bounds asking one vttablet whether it can stream from a
// position: one that can sends its first events (or a heartbeat, within
// about a second) well within it.
const probeTimeout = 5 * time.Second

// historyGone asks every other vttablet of the shard whether it can
// stream from pos, after failed purged the binary logs holding it. The
// history is gone only when each of them answered so too (BINLOG_PURGED);
// one that streams, or cannot be asked (down, not serving, behind the
// position, slow), keeps the shard readable elsewhere. why names the
// vttablets that answered.
func (s *Source) historyGone(ctx context.Context, failed source.Replica, pos string) (gone bool, why string) {
	tablets, err := s.ListTablets(ctx)
	if err != nil {
		return false, ""
	}
	var others []source.Replica
	for _, t := range tablets {
		if t.ID != failed.Tablet {
			continue
		}
		for _, r := range t.Replicas {
			if r.Alias != failed.Alias {
				others = append(others, r)
			}
		}
	}
	purged := make([]bool, len(others))
	var wg sync.WaitGroup
	for i, r := range others {
		wg.Go(func() { purged[i] = s.purged(ctx, r, pos) })
	}
	wg.Wait()
	if slices.Contains(purged, false) {
		return false, ""
	}
	names := []string{failed.Alias}
	for _, r := range others {
		names = append(names, r.Alias)
	}
	return true, fmt.Sprintf("%s purged the binary logs holding it", strings.Join(names, ", "))
}

// purged reports whether a vttablet answers a VStream from pos with
// purged binary logs.
func (s *Source) purged(ctx context.Context, r source.Replica, pos string) bool {
	if r.Address == "" {
		return false
	}
	vs, err := s.vstream(r, &binlogdatapb.VStreamRequest{Position: pos})
	if err != nil {
		return false
	}
	defer vs.close()
	t := time.NewTimer(probeTimeout)
	defer t.Stop()
	select {
	case _, ok := <-vs.events:
		if ok {
			return false // it streams
		}
		<-vs.done
		return Classify(vs.err).Reason == "BINLOG_PURGED"
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}
