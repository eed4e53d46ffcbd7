package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/workflows"
)

// replicasOf returns a tablet's replicas from tabletd's topology.
func (e *env) replicasOf(tablet string) []*sourcepb.Replica {
	e.t.Helper()
	t, err := e.topo.GetTablet(context.Background(), &sourcepb.GetTabletRequest{Tablet: tablet})
	require.NoError(e.t, err)
	return t.Replicas
}

// a. YugabyteDB's lesson: one failing tablet never stalls the others nor
// lets them expire; it retries with backoff and catches up after heal.
func TestOneFailingTabletDoesNotStallOrExpireTheOthers(t *testing.T) {
	e := newEnv(t, "--tablets", "8", "--rate", "300", "--retention", "30s")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	e.startStream("iso", e.config(out, map[string]any{"retry": map[string]any{
		"initialInterval": "500ms", "maximumInterval": "4s", "maximumAttempts": 0}}))
	e.waitStatus("iso", "every tablet streaming", time.Minute, allStreaming(8))

	for _, r := range e.replicasOf("t-0004") {
		e.fault(&sourcepb.FaultRequest{Server: r.Alias, Tablet: "t-0004", Code: "UNAVAILABLE"})
	}
	before, err := jsonl.DigestDir(out)
	require.NoError(t, err)
	e.waitStatus("iso", "t-0004 retrying with its error", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0004")
		return b.State == workflows.Retrying && b.Attempt > 1 && strings.Contains(strings.ToUpper(b.LastError), "UNAVAILABLE"), summary(st)
	})
	// For a stretch of the failure the seven others keep writing.
	e.eventually("the healthy tablets advance while t-0004 fails", time.Minute, func() (bool, string) {
		now, err := jsonl.DigestDir(out)
		if err != nil {
			return false, err.Error()
		}
		var moved []string
		for id, d := range now.Tablets {
			if id != "t-0004" && d.Records > before.Tablets[id].Records+50 {
				moved = append(moved, id)
			}
		}
		return len(moved) == 7, fmt.Sprintf("advanced: %v", moved)
	})
	st, err := e.status("iso")
	require.NoError(t, err)
	for _, tab := range st.Tablets {
		if tab.ID != "t-0004" {
			require.Equal(t, workflows.Streaming, tab.State, "tablet %s", tab.ID)
		}
	}
	for _, r := range e.replicasOf("t-0004") {
		e.heal(r.Alias, "t-0004")
	}
	e.waitStatus("iso", "t-0004 streams again", time.Minute, allStreaming(8))
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("iso", out, 2*time.Minute)
}

// b. Vitess's lesson: a replica that lost the history (GTIDSet Mismatch)
// is excluded for that tablet and another cell's replica takes over, in
// place (the run goes on); transient errors are retried on the same
// replica without exclusion.
func TestPositionMismatchMovesTheTabletToAnotherReplica(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "200")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	e.startStream("mismatch", e.config(out, map[string]any{
		"selection": map[string]any{"cells": []string{"zone1"}, "tabletTypes": []string{"REPLICA", "RDONLY", "PRIMARY"}}}))
	st := e.waitStatus("mismatch", "every tablet streaming", time.Minute, allStreaming(4))
	local := tabletStatus(st, "t-0001").Replica
	require.True(t, strings.HasPrefix(local, "zone1-"), "the local cell wins: %s", local)

	e.fault(&sourcepb.FaultRequest{Server: local, Tablet: "t-0001", PositionMismatch: true})
	st = e.waitStatus("mismatch", "t-0001 streams from another replica", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0001")
		return b.State == workflows.Streaming && b.Replica != local && b.Replica != "", summary(st)
	})
	b := tabletStatus(st, "t-0001")
	require.Len(t, b.Excluded, 1, "the alias is in the tablet's own exclude list")
	require.Equal(t, local, b.Excluded[0].Alias)
	require.Equal(t, "POSITION_MISMATCH", b.Excluded[0].Reason)
	require.WithinDuration(t, time.Now().Add(5*time.Minute), b.Excluded[0].Expires, time.Minute, "expires after autoExcludeTTL")
	mid := workflows.TabletWorkflowID("mismatch", "t-0001")
	require.True(t, e.movedInPlace(mid, local), "t-0001 did not move in place: %s", e.lastEvents(mid, 12))

	// UNAVAILABLE on t-0002's replica: retried on it, no exclusion.
	target := tabletStatus(st, "t-0002").Replica
	e.fault(&sourcepb.FaultRequest{Server: target, Tablet: "t-0002", Code: "UNAVAILABLE"})
	e.waitStatus("mismatch", "t-0002 retrying on its replica", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0002")
		return b.State == workflows.Retrying && b.Replica == target, summary(st)
	})
	e.heal(target, "t-0002")
	st = e.waitStatus("mismatch", "t-0002 recovers on the same replica", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0002")
		return b.State == workflows.Streaming && b.Replica == target, summary(st)
	})
	require.Empty(t, tabletStatus(st, "t-0002").Excluded, "retry-same errors exclude nothing")
	e.heal(local, "t-0001")
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("mismatch", out, 2*time.Minute)
	e.signal("mismatch", "stop", `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, e.temporal.GetWorkflow(ctx, "mismatch", "").Get(ctx, nil))
	// tablet-retry-elsewhere.json and tablet-retry-same.json were recorded
	// here before runs moved in place on a mismatch.
	e.recordHistory(mid, "", "tablet-mismatch-in-place")
}

// c. An operator excludes a replica with the Temporal CLI: every tablet on
// it moves off and none selects it until include; a TTL ends by itself; a
// server taken down is left without any exclude-list entry; bad payloads
// are rejected, never a failed workflow.
func TestOperatorExclusionMovesTabletsOffAReplica(t *testing.T) {
	e := newEnv(t, "--tablets", "8", "--rate", "200")
	e.startWorker()
	_, out, st := e.streamAll("opx", 8)
	alias := busiest(st)
	before := st

	e.signal("opx", "exclude", fmt.Sprintf(`{"aliases": [%q], "reason": "maintenance"}`, alias))
	st = e.waitStatus("opx", "no tablet reads "+alias, 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		if !offReplica(st, alias) {
			return false, summary(st)
		}
		return len(st.Exclude) == 1, summary(st)
	})
	require.Equal(t, "maintenance", st.Exclude[0].Reason)
	require.True(t, st.Exclude[0].Expires.IsZero(), "no TTL: until included")
	// The tablets left it in place: their runs moved, with no new run.
	recorded := false
	for _, tab := range before.Tablets {
		if tab.Replica != alias {
			continue
		}
		wid := workflows.TabletWorkflowID("opx", tab.ID)
		require.True(t, e.movedInPlace(wid, alias), "tablet %s did not move in place: %s", tab.ID, e.lastEvents(wid, 12))
		if !recorded {
			recorded = true
			e.recordHistory(wid, "", "tablet-reroute-excluded")
		}
	}
	e.recordHistory("opx", "", "stream-exclusions-memo")

	// A bad payload is rejected and shown; the stream keeps running.
	e.signal("opx", "exclude", `{"aliases": [], "reason": "oops"}`)
	e.signal("opx", "exclude", `{"alias": "zone1-0000000101"}`)
	e.waitStatus("opx", "bad signals rejected", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		return len(st.Rejected) == 2, summary(st)
	})
	// The update form returns the error to the caller.
	h, err := e.temporal.UpdateWorkflow(context.Background(), client.UpdateWorkflowOptions{
		WorkflowID: "opx", UpdateName: "exclude", WaitForStage: client.WorkflowUpdateStageCompleted,
		Args: []any{json.RawMessage(`{"aliases": ["zone9-0000000999"]}`)},
	})
	if err == nil {
		err = h.Get(context.Background(), nil)
	}
	require.ErrorContains(t, err, "not a replica of this stream")

	// A TTL ends by itself.
	other := secondBusiest(st, alias)
	e.signal("opx", "exclude", fmt.Sprintf(`{"aliases": [%q], "ttl": "3s"}`, other))
	e.waitStatus("opx", "the TTL exclusion ends by itself", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		return len(st.Exclude) == 1 && st.Exclude[0].Alias == alias, summary(st)
	})

	// A down server: its tablets leave it with no exclude-list entry.
	e.signal("opx", "include", fmt.Sprintf(`{"aliases": [%q]}`, alias))
	st = e.waitStatus("opx", "the exclusion is lifted", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		return len(st.Exclude) == 0, summary(st)
	})
	down := busiest(st)
	e.fault(&sourcepb.FaultRequest{Server: down, Down: true})
	st = e.waitStatus("opx", "tablets leave the down server", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		if !offReplica(st, down) {
			return false, summary(st)
		}
		return true, ""
	})
	require.Empty(t, st.Exclude)
	for _, tab := range st.Tablets {
		require.Empty(t, tab.Excluded, "tablet %s: a down server needs no exclusion: the health filter skips it", tab.ID)
	}
	e.heal(down, "")
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("opx", out, 2*time.Minute)
}

// movedInPlace reports whether a tablet's latest run heard from its
// GetChanges that it moved off the replica from in place (a progress
// signal naming its new selection) while that activity kept running.
func (e *env) movedInPlace(id, from string) bool {
	open := map[int64]string{} // running GetChanges (scheduled event) → the replica it was given
	for _, ev := range e.history(id, "") {
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil && a.GetActivityType().GetName() == "GetChanges" {
			var in activities.GetChangesInput
			require.NoError(e.t, converter.GetDefaultDataConverter().FromPayloads(a.GetInput(), &in))
			open[ev.GetEventId()] = in.Replica.Alias
		}
		for _, done := range []int64{ev.GetActivityTaskCompletedEventAttributes().GetScheduledEventId(),
			ev.GetActivityTaskFailedEventAttributes().GetScheduledEventId(),
			ev.GetActivityTaskCanceledEventAttributes().GetScheduledEventId()} {
			delete(open, done)
		}
		a := ev.GetWorkflowExecutionSignaledEventAttributes()
		if a == nil || a.GetSignalName() != activities.SignalProgress {
			continue
		}
		var p activities.Progress
		require.NoError(e.t, converter.GetDefaultDataConverter().FromPayloads(a.GetInput(), &p))
		if p.Switched == nil || p.Replica == from {
			continue
		}
		for _, given := range open {
			if given == from {
				return true
			}
		}
	}
	return false
}

// busiest returns the replica most tablets read from.
func busiest(st workflows.StreamStatus) string {
	n := map[string]int{}
	best := ""
	for _, t := range st.Tablets {
		n[t.Replica]++
		if best == "" || n[t.Replica] > n[best] || (n[t.Replica] == n[best] && t.Replica < best) {
			best = t.Replica
		}
	}
	return best
}

func secondBusiest(st workflows.StreamStatus, not string) string {
	for _, t := range st.Tablets {
		if t.Replica != not && t.Replica != "" {
			return t.Replica
		}
	}
	return ""
}

// d. Every replica of a tablet excluded: NoEligibleReplica, in the status
// and the search attribute; including one resumes it.
func TestTabletWithEveryReplicaExcludedWaitsThenResumes(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "100")
	e.startWorker()
	e.streamAll("noel", 4)
	var aliases []string
	for _, r := range e.replicasOf("t-0002") {
		aliases = append(aliases, r.Alias)
	}
	in, _ := json.Marshal(map[string]any{"aliases": aliases, "tablet": "t-0002", "reason": "drain"})
	e.signal("noel", "exclude", string(in))
	e.waitStatus("noel", "t-0002 has no eligible replica", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, "t-0002").State == workflows.NoEligibleReplica, summary(st)
	})
	e.eventually("the search attribute says so", time.Minute, func() (bool, string) {
		resp, err := e.temporal.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{
			Query: `TabletflowStream = "noel" AND TabletflowState = "NoEligibleReplica"`})
		if err != nil {
			return false, err.Error()
		}
		var ids []string
		for _, ex := range resp.Executions {
			ids = append(ids, ex.Execution.WorkflowId)
		}
		return slices.Equal(ids, []string{"noel/tablet/t-0002"}), fmt.Sprint(ids)
	})
	e.signal("noel", "include", fmt.Sprintf(`{"aliases": [%q]}`, aliases[1]))
	st := e.waitStatus("noel", "t-0002 resumes on the included replica", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0002")
		return b.State == workflows.Streaming && b.Replica == aliases[1], summary(st)
	})
	require.Len(t, st.Exclude, 2)
}

// e. A split under load: the children stream from the hand-off; the sink
// is exact and a key's parent records precede its child records.
func TestSplitUnderLoadHandsOffToTheChildren(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "400")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	e.startStream("split", e.config(out, map[string]any{"topologyRefresh": "2s"}))
	e.waitStatus("split", "every tablet streaming", time.Minute, allStreaming(4))
	resp, err := e.admin.Split(context.Background(), &sourcepb.SplitRequest{Tablet: "t-0002"})
	require.NoError(t, err)
	e.waitStatus("split", "the children stream", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		ok := tabletStatus(st, "t-0002").State == workflows.Split
		for _, c := range resp.Children {
			ok = ok && tabletStatus(st, c).State == workflows.Streaming
		}
		return ok, summary(st)
	})
	e.eventually("children receive records", time.Minute, func() (bool, string) {
		r, err := jsonl.DigestDir(out)
		if err != nil {
			return false, err.Error()
		}
		return r.Tablets[resp.Children[0]].Records > 20 && r.Tablets[resp.Children[1]].Records > 20, fmt.Sprint(r.Tablets)
	})
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("split", out, 2*time.Minute)

	// Order per key across the split, by position (not by the source's
	// commit times): the parent's records end at the hand-off, every child
	// record comes after it, so a key's parent records precede its child
	// records.
	handoff, err := source.ParseCheckpoint(resp.HandoffCheckpoint)
	require.NoError(t, err)
	lines, err := jsonl.ReadDir(out)
	require.NoError(t, err)
	lastParent := map[string]source.Checkpoint{}
	for _, l := range lines["t-0002"] {
		pos, err := source.ParseCheckpoint(l.Position)
		require.NoError(t, err)
		require.LessOrEqual(t, pos.Compare(handoff), 0, "parent record %s after the hand-off %s", pos, handoff)
		lastParent[l.Table+string(l.Key)] = pos
	}
	moved := 0
	for _, c := range resp.Children {
		require.NotEmpty(t, lines[c], c)
		first, err := source.ParseCheckpoint(lines[c][0].Position)
		require.NoError(t, err)
		require.Positive(t, first.Compare(handoff), "%s's first position %s follows the hand-off %s", c, first, handoff)
		for _, l := range lines[c] {
			pos, err := source.ParseCheckpoint(l.Position)
			require.NoError(t, err)
			if p, ok := lastParent[l.Table+string(l.Key)]; ok {
				moved++
				require.Positive(t, pos.Compare(p), "key %s: child record %s not after the parent's %s", l.Key, pos, p)
			}
		}
	}
	require.Positive(t, moved, "some keys had records on both sides of the split")
}

// f. A tablet paused past the retention expires, loudly; others go on.
func TestTabletPausedPastRetentionExpires(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "100", "--retention", "8s")
	e.startWorker()
	e.streamAll("pause", 4)
	e.signal("pause", "pause", `{"tablets": ["t-0003"]}`)
	st := e.waitStatus("pause", "t-0003 paused with its retention counting down", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0003")
		return b.State == workflows.Paused && b.RetentionLeft != "", summary(st)
	})
	left, err := time.ParseDuration(tabletStatus(st, "t-0003").RetentionLeft)
	require.NoError(t, err)
	require.LessOrEqual(t, left, 8*time.Second)
	st = e.waitStatus("pause", "t-0003 expired", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, "t-0003").State == workflows.Expired, summary(st)
	})
	require.Contains(t, tabletStatus(st, "t-0003").Reason, "retention")
	for _, id := range []string{"t-0001", "t-0002", "t-0004"} {
		require.Equal(t, workflows.Streaming, tabletStatus(st, id).State, id)
	}
	e.eventually("the search attribute says Expired", time.Minute, func() (bool, string) {
		resp, err := e.temporal.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{
			Query: `TabletflowStream = "pause" AND TabletflowState = "Expired"`})
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Executions) == 1, fmt.Sprint(len(resp.Executions))
	})
}

// g. Continue-as-new (suggested early by the dev server) keeps the
// exclusions, their TTLs and the paused tablets.
func TestContinueAsNewKeepsExclusionsAndPausedTablets(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "100")
	e.startWorker()
	run, _, st := e.streamAll("can", 4)
	alias := busiest(st)
	e.signal("can", "exclude", fmt.Sprintf(`{"aliases": [%q], "reason": "kept", "ttl": "1h"}`, alias))
	e.signal("can", "pause", `{"tablets": ["t-0004"]}`)
	before := e.waitStatus("can", "exclusion and pause in effect", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return len(st.Exclude) == 1 && tabletStatus(st, "t-0004").State == workflows.Paused, summary(st)
	})
	// Push the history past the dev server's suggestion with cheap
	// rejected signals.
	e.eventually("the stream continued as new", 3*time.Minute, func() (bool, string) {
		for range 20 {
			_ = e.temporal.SignalWorkflow(context.Background(), "can", "", "pause", json.RawMessage(`{"tablets": ["nope"]}`))
		}
		d, err := e.temporal.DescribeWorkflow(context.Background(), "can", "")
		if err != nil {
			return false, err.Error()
		}
		return d.RawResponse.WorkflowExecutionInfo.Execution.RunId != run.GetRunID(), "same run"
	})
	after, err := e.status("can")
	require.NoError(t, err)
	require.Equal(t, before.Exclude, after.Exclude, "exclusions and their expiry survive")
	require.Equal(t, workflows.Paused, tabletStatus(after, "t-0004").State)
	require.Equal(t, tabletStatus(before, "t-0004").PausedAt, tabletStatus(after, "t-0004").PausedAt)
	require.NotEmpty(t, after.Rejected, "the rejected list survives too")
	e.recordHistory("can", run.GetRunID(), "stream-continued-as-new")
}

// h. stop with dropSourceStream: every tablet commits and stops, the
// stream completes, and the source-side stream is gone.
func TestStopWithDropSourceStream(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "200")
	e.startWorker()
	run, out, _ := e.streamAll("stopme", 4)
	e.workload(sourcepb.WorkloadRequest_PAUSE)
	e.requireExact("stopme", out, 2*time.Minute)
	e.signal("stopme", "stop", `{"dropSourceStream": true}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, run.Get(ctx, nil), "the stream completes")
	d, err := e.temporal.DescribeWorkflow(context.Background(), "stopme", "")
	require.NoError(t, err)
	require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, d.RawResponse.WorkflowExecutionInfo.Status)
	for _, id := range []string{"t-0001", "t-0002", "t-0003", "t-0004"} {
		d, err := e.temporal.DescribeWorkflow(context.Background(), workflows.TabletWorkflowID("stopme", id), "")
		require.NoError(t, err)
		require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, d.RawResponse.WorkflowExecutionInfo.Status, id)
	}
	_, err = e.topo.DescribeStream(context.Background(), &sourcepb.DescribeStreamRequest{Stream: "stopme"})
	require.Equal(t, codes.NotFound, status.Code(err), "the source-side stream is gone")
	r, err := jsonl.DigestDir(out)
	require.NoError(t, err)
	require.Empty(t, r.Duplicates)
	e.recordHistory("stopme", run.GetRunID(), "stream-stopped")
	e.recordHistory(workflows.TabletWorkflowID("stopme", "t-0001"), "", "tablet-stopped")
}

// A stopped stream's memo (what the Web UI's list shows) counts every
// tablet Stopped, even when its last reports come in one workflow task
// with other signals: here a flood of undecodable reports, each rejected
// and shown, runs through the stop.
func TestStoppedStreamMemoCountsEveryTabletStopped(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "200")
	e.startWorker()
	run, _, _ := e.streamAll("memostop", 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		for ctx.Err() == nil {
			// Fails once the stream is closed: then the flood is over.
			if err := e.temporal.SignalWorkflow(ctx, "memostop", "", workflows.SignalTabletReport, "not a report"); err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	e.signal("memostop", "stop", `{}`)
	require.NoError(t, run.Get(ctx, nil), "the stream completes")
	cancel()
	<-flood
	d, err := e.temporal.DescribeWorkflow(context.Background(), "memostop", "")
	require.NoError(t, err)
	p := d.RawResponse.WorkflowExecutionInfo.GetMemo().GetFields()["tabletStates"]
	require.NotNil(t, p, "the memo has the tablet states")
	var states map[string]int
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(p, &states))
	require.Equal(t, map[string]int{string(workflows.Stopped): 4}, states)
	st, err := e.status("memostop")
	require.NoError(t, err)
	require.NotEmpty(t, st.Rejected, "the undecodable reports were rejected and shown")
	e.recordHistory("memostop", run.GetRunID(), "stream-final-memo-stopped")
}
