package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/workflows"
)

// Live status: a tablet's checkpoint, records and lag in the stream's
// status move when a GetChanges run ends (run.duration, 5 m by default).
// While a run goes on, its heartbeat holds them as of its last commit,
// and the worker sends it to the server at least every --live-every (2 s
// by default). starter status reads each running tablet's pending run
// from its workflow's description and shows the later of the two
// (docs/operating.md#live-status): no history event, one describe per
// running tablet per refresh.

// liveStates are the states whose tablet has a run that may be pending.
var liveStates = []workflows.State{workflows.Streaming, workflows.Retrying}

// liveCalls bounds the describes in flight at once.
const liveCalls = 32

// liveRun is what a tablet's pending run says.
type liveRun struct {
	beat activities.Heartbeat
	at   time.Time // when the server last got its heartbeat
	// started: a worker runs the attempt now (not one waiting for its
	// retry, or for a worker).
	started bool
}

// live returns each running tablet's pending run, by tablet (none: the
// tablet has no pending run with a heartbeat, or its workflow could not be
// described).
func live(ctx context.Context, c client.Client, dc converter.DataConverter, st workflows.StreamStatus) map[string]liveRun {
	if dc == nil {
		dc = converter.GetDefaultDataConverter()
	}
	out := map[string]liveRun{}
	var mu sync.Mutex
	sem := make(chan struct{}, liveCalls)
	var wg sync.WaitGroup
	for _, t := range st.Tablets {
		if !slices.Contains(liveStates, t.State) {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			d, err := c.DescribeWorkflow(ctx, workflows.TabletWorkflowID(st.Stream, t.ID), "")
			if err != nil || d.RawResponse == nil {
				return
			}
			for _, pa := range d.RawResponse.GetPendingActivities() {
				if pa.GetActivityType().GetName() != "GetChanges" || pa.GetHeartbeatDetails() == nil {
					continue
				}
				var hb activities.Heartbeat
				if dc.FromPayloads(pa.GetHeartbeatDetails(), &hb) != nil {
					continue
				}
				mu.Lock()
				out[t.ID] = liveRun{beat: hb, at: pa.GetLastHeartbeatTime().AsTime(), started: pa.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// stallAfter: a Streaming tablet whose running attempt has not committed
// for longer than this is stalled. A run commits after every read, one
// that found nothing too (a read waits batch.maxWait at most: 1 m at the
// most, 5 s by default), so two minutes without a commit mean a read or
// the sink hangs; the stream's own state still says Streaming (a hung run
// fails only when its heartbeat or commit times out, if ever). Not
// flagged: an attempt waiting for its retry or a worker, or a retry
// that has not committed yet (its heartbeat holds its predecessor's last
// commit, and its LastError says why it failed).
const stallAfter = 2 * time.Minute

// stalled reports how long the run has gone without a commit at now, and
// whether that makes it stalled: an attempt a worker runs that has
// committed since it began, its last commit over stallAfter ago.
func (r liveRun) stalled(now time.Time) (time.Duration, bool) {
	since := now.Sub(r.beat.LastSuccess)
	return since, r.started && r.beat.LastError == "" && !r.beat.LastSuccess.IsZero() && since > stallAfter
}

// stalledReason is the reason starter status gives a stalled tablet.
func stalledReason(since time.Duration) string {
	return fmt.Sprintf("stalled: no commit for %s (a read or the sink hangs)", since.Round(time.Second))
}

// withLive shows in st each tablet's pending run where it is past what
// the status holds: its checkpoint, the records of its runs before plus
// the run's, and its lag; age says, per tablet shown live, how old its
// heartbeat is at now. A Streaming tablet whose run's last commit is
// more than stallAfter before now gets stalledReason as its reason.
func withLive(st workflows.StreamStatus, runs map[string]liveRun, now time.Time) (workflows.StreamStatus, map[string]time.Duration) {
	age := map[string]time.Duration{}
	st.Tablets = slices.Clone(st.Tablets)
	for i := range st.Tablets {
		t := &st.Tablets[i]
		r, ok := runs[t.ID]
		if since, stalled := r.stalled(now); ok && stalled && t.State == workflows.Streaming {
			t.Reason = stalledReason(since)
		}
		if !ok || r.beat.Checkpoint.Compare(t.Checkpoint) <= 0 {
			continue // no run, or its heartbeat is not past the status (a run that just reported)
		}
		t.Checkpoint = r.beat.Checkpoint
		t.Records += r.beat.Records
		t.Batches += r.beat.Batches
		t.LagSeconds = r.beat.LagSeconds
		age[t.ID] = max(now.Sub(r.at), 0)
	}
	return st, age
}
