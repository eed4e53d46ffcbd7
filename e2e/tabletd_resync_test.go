package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/workflows"
)

// On tabletd: t-0003, paused past its retention, is Expired; the operator
// resyncs it, and t-0001 while it streams (told to stop first). Both
// stream again; once the workload stops, each tablet's records in the
// sink are exactly what tabletd says the stream is due: for a resynced
// tablet, its records from its last resync-begin on (the copy and the
// changes after it), for the others all of them. No position twice, and
// positions increase in every file across the resyncs.
func TestTabletdResyncRecoversAnExpiredAndARunningTabletExactly(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "100", "--retention", "8s")
	e.startWorker()
	const stream = "tdresync"
	_, out, _ := e.streamAll(stream, 4)
	e.signal(stream, workflows.CmdPause, `{"tablets": ["t-0003"]}`)
	e.waitStatus(stream, "t-0003 expired", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, "t-0003").State == workflows.Expired, summary(st)
	})
	e.signal(stream, workflows.CmdResync, `{"tablets": ["t-0003", "t-0001"], "reason": "e2e"}`)
	resynced := []string{"t-0001", "t-0003"}
	e.waitStatus(stream, "both resynced and streaming", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		for _, id := range resynced {
			if r := tabletStatus(st, id); r.Resyncs != 1 || r.State != workflows.Streaming {
				return false, summary(st)
			}
		}
		return true, ""
	})
	for _, id := range resynced {
		e.eventually(id+"'s copy is in the sink", time.Minute, func() (bool, string) {
			return hasOp(t, out, id, source.ResyncEnd), fmt.Sprintf("%d rows copied", readsAfterBegin(t, out, id))
		})
	}
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.eventually("each tablet holds exactly what the stream is due", 2*time.Minute, func() (bool, string) {
		due, err := e.admin.Digest(context.Background(), &sourcepb.DigestRequest{Stream: stream})
		if err != nil {
			return false, err.Error()
		}
		lines, err := jsonl.ReadDir(out)
		if err != nil {
			return false, err.Error()
		}
		for tablet, want := range due.Tablets {
			ls := lines[tablet]
			if slices.Contains(resynced, tablet) {
				begin := slices.IndexFunc(ls, func(l jsonl.Line) bool { return l.Op == source.ResyncBegin })
				if begin < 0 {
					return false, tablet + ": no resync-begin"
				}
				ls = ls[begin:]
			}
			var got digest.Digest
			for _, l := range ls {
				got.Add(l.Hash())
			}
			if got.Records != want.Records || got.Hash != want.Hash {
				return false, fmt.Sprintf("%s: due %d records hash %s, sink %d hash %s", tablet, want.Records, digest.HashHex(want.Hash),
					got.Records, digest.HashHex(got.Hash))
			}
		}
		return len(due.Tablets) == 4, fmt.Sprintf("%d tablets due", len(due.Tablets))
	})
	r, err := jsonl.DigestDir(out)
	require.NoError(t, err)
	require.Empty(t, r.Duplicates, "no (tablet, position) twice")
	e.requireOrdered(out)
}
