package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/workflows"
)

// The durability tests: an operator's commands are never lost across
// continue-as-new, a tablet workflow closed by hand is restarted from its
// checkpoint, and the stream takes commands while the topology is down.

// describe describes a workflow's run ("": its latest).
func (e *env) describe(id, runID string) *workflowservice.DescribeWorkflowExecutionResponse {
	e.t.Helper()
	d, err := e.temporal.DescribeWorkflow(context.Background(), id, runID)
	require.NoError(e.t, err, "describe %s", id)
	return d.RawResponse
}

// history reads a workflow run's events ("": its latest run).
func (e *env) history(id, runID string) []*historypb.HistoryEvent {
	e.t.Helper()
	it := e.temporal.GetWorkflowHistory(context.Background(), id, runID, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var out []*historypb.HistoryEvent
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(e.t, err, "history of %s", id)
		out = append(out, ev)
	}
	return out
}

// lastEvents describes the last n events of a workflow's latest run and
// its pending work, for a failure message.
func (e *env) lastEvents(id string, n int) string {
	var b strings.Builder
	events := e.history(id, "")
	for _, ev := range events[max(0, len(events)-n):] {
		fmt.Fprintf(&b, "\n    %d %s %s", ev.GetEventId(), ev.GetEventTime().AsTime().Format("15:04:05.000"), ev.GetEventType())
		if a := ev.GetWorkflowTaskFailedEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s %s", a.GetCause(), a.GetFailure().GetMessage())
		}
		if a := ev.GetWorkflowTaskTimedOutEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s", a.GetTimeoutType())
		}
	}
	d := e.describe(id, "")
	if wt := d.GetPendingWorkflowTask(); wt != nil {
		fmt.Fprintf(&b, "\n    pending workflow task: %s attempt %d scheduled %s started %s", wt.GetState(), wt.GetAttempt(),
			wt.GetScheduledTime().AsTime().Format("15:04:05.000"), wt.GetStartedTime().AsTime().Format("15:04:05.000"))
	}
	for _, a := range d.GetPendingActivities() {
		fmt.Fprintf(&b, "\n    pending activity %s: %s attempt %d last failure %s", a.GetActivityType().GetName(), a.GetState(), a.GetAttempt(), a.GetLastFailure().GetMessage())
	}
	return b.String()
}

// runsOf lists a workflow's runs, oldest first, following the
// continue-as-new chain back from the latest run.
func (e *env) runsOf(id string) []string {
	e.t.Helper()
	var runs []string
	run := e.describe(id, "").WorkflowExecutionInfo.Execution.RunId
	for run != "" {
		runs = append(runs, run)
		first := e.history(id, run)[0].GetWorkflowExecutionStartedEventAttributes()
		run = first.GetContinuedExecutionRunId()
	}
	slices.Reverse(runs)
	return runs
}

// startInput decodes argument i of a run's start event.
func startInput(t *testing.T, events []*historypb.HistoryEvent, i int, v any) {
	t.Helper()
	p := events[0].GetWorkflowExecutionStartedEventAttributes().GetInput().GetPayloads()
	require.Greater(t, len(p), i, "start input %d", i)
	require.NoError(t, json.Unmarshal(p[i].GetData(), v))
}

// signalled reports whether events hold a signal name whose input
// contains part.
func signalled(events []*historypb.HistoryEvent, name, part string) bool {
	for _, ev := range events {
		a := ev.GetWorkflowExecutionSignaledEventAttributes()
		if a == nil || a.GetSignalName() != name {
			continue
		}
		for _, p := range a.GetInput().GetPayloads() {
			if strings.Contains(string(p.GetData()), part) {
				return true
			}
		}
	}
	return false
}

// tabletOwnStatus queries a tablet workflow (its latest run) for its own
// status.
func (e *env) tabletOwnStatus(stream, tablet string) (workflows.TabletStatus, error) {
	var st workflows.TabletStatus
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := e.temporal.QueryWorkflow(ctx, workflows.TabletWorkflowID(stream, tablet), "", workflows.QueryStatus)
	if err != nil {
		return st, err
	}
	return st, v.Get(&st)
}

// explainTablets logs, for tablets found in the wrong state, how their
// workflow got there: its runs, and the state its latest run started
// with (what the previous run carried across continue-as-new).
func (e *env) explainTablets(stream string, ids []string) {
	e.t.Helper()
	status, _ := e.status(stream)
	for _, id := range ids {
		for _, row := range status.Tablets {
			if row.ID == id {
				e.t.Logf("%s/%s: the stream's row: %s %q seq %d updated %s", stream, id, row.State, row.Reason, row.Seq, row.Updated.Format("15:04:05.000000"))
			}
		}
		wid := workflows.TabletWorkflowID(stream, id)
		runs := e.runsOf(wid)
		events := e.history(wid, "")
		var st *workflows.TabletState
		startInput(e.t, events, 1, &st)
		carried := "nil"
		if st != nil {
			carried = fmt.Sprintf("pause=%v stop=%v status.state=%s status.reason=%q", st.Pause, st.Stop, st.Status.State, st.Status.Reason)
		}
		var kinds []string
		for _, ev := range events {
			if a := ev.GetWorkflowExecutionSignaledEventAttributes(); a != nil {
				for _, p := range a.GetInput().GetPayloads() {
					kinds = append(kinds, a.GetSignalName()+":"+string(p.GetData()))
				}
			}
		}
		own, err := e.tabletOwnStatus(stream, id)
		e.t.Logf("%s: %d runs; latest run started with state {%s}; %d events; signals in it: %v; its own status: %s %q seq %d (%v)",
			wid, len(runs), carried, len(events), kinds, own.State, own.Reason, own.Seq, err)
		// The reports the stream received from it, in the order it took
		// them, over its last two runs.
		sruns := e.runsOf(stream)
		for _, run := range sruns[max(0, len(sruns)-2):] {
			for _, ev := range e.history(stream, run) {
				a := ev.GetWorkflowExecutionSignaledEventAttributes()
				if a == nil || a.GetSignalName() != workflows.SignalTabletReport {
					continue
				}
				for _, p := range a.GetInput().GetPayloads() {
					var r workflows.TabletStatus
					if json.Unmarshal(p.GetData(), &r) == nil && r.ID == id {
						e.t.Logf("  stream run %s (%d of %d) event %d at %s: report %s %q seq %d updated %s",
							run[:8], slices.Index(sruns, run)+1, len(sruns), ev.GetEventId(), ev.GetEventTime().AsTime().Format("15:04:05.000"), r.State, r.Reason, r.Seq, r.Updated.Format("15:04:05.000000"))
					}
				}
			}
		}
	}
}

// waitTablets waits until every one of n tablets of each stream is in
// one of states (the stream's rows).
func (e *env) waitTablets(streams []string, n int, within time.Duration, states ...workflows.State) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for _, s := range streams {
		var st workflows.StreamStatus
		var err error
		for {
			var wrong []string
			st, err = e.status(s)
			for _, t := range st.Tablets {
				if !slices.Contains(states, t.State) {
					wrong = append(wrong, t.ID)
				}
			}
			if err == nil && len(wrong) == 0 && len(st.Tablets) == n {
				break
			}
			if time.Now().After(deadline) {
				e.explainTablets(s, wrong)
				e.t.Fatalf("stream %s: not every tablet %v within %v (err %v); last saw: %s", s, states, within, err, summary(st))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
}

// 1. Operator commands under frequent continue-as-new. A dev server of the
// test's own suggests continue-as-new after 40 events, and runs last 1s,
// so every tablet continues as new every few seconds while pause, resume
// and stop fan out to it: a command that lands in the workflow task that
// continues as new must ride in the state, and a stop must end the run
// that received it. 3 streams × 24 tablets: 72 tablet workflows, each
// with a GetChanges activity every second, continuing as new every ~5s;
// on 2 cores, beside this dev server, the shared one and tabletd, the
// whole test takes one to two minutes (with 16 tablets per stream fewer
// tablets cross continue-as-new while a command goes out).
func TestStopPauseResumeUnderFrequentContinueAsNew(t *testing.T) {
	const tablets = 24
	// How long a command may take to reach all 72 tablets and their
	// reports the streams. This test is about commands taking effect, not
	// their speed: unloaded, it takes seconds; on a CI machine losing CPU to
	// steal, tablets' workflow tasks take up to 10 s each and a pause of
	// all of them took over a minute.
	const commandWithin = 3 * time.Minute
	addr := startDevServer(t, "--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=40")
	e := newEnvOn(t, addr, "--tablets", fmt.Sprint(tablets), "--rate", "200")
	e.startWorker()
	began := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), what) }
	streams := []string{"dur-a", "dur-b", "dur-c"}
	outs := map[string]string{}
	first := map[string]string{}
	for _, s := range streams {
		outs[s] = filepath.Join(e.dir, s)
		run := e.startStream(s, e.config(outs[s], map[string]any{"run": map[string]any{"duration": "1s", "heartbeatTimeout": "5s"}}))
		first[s] = run.GetRunID()
	}
	// Running: streaming, or retrying for a moment (a busy machine times
	// out a selection now and then; runs of 1s churn all the time).
	running := []workflows.State{workflows.Streaming, workflows.Retrying}
	e.waitTablets(streams, tablets, 2*time.Minute, running...)
	phase("every tablet streaming")
	var ids []string
	st := e.waitStatus(streams[0], "the stream's status", commandWithin, func(workflows.StreamStatus) (bool, string) { return true, "" })
	for _, tab := range st.Tablets {
		ids = append(ids, tab.ID)
	}

	// Every tablet has continued as new: its current run is not its first,
	// and its first closed as ContinuedAsNew.
	done := map[string]bool{}
	e.eventually("every tablet workflow continued as new", 2*time.Minute, func() (bool, string) {
		var not []string
		for _, s := range streams {
			for _, id := range ids {
				wid := workflows.TabletWorkflowID(s, id)
				if done[wid] {
					continue
				}
				info := e.describe(wid, "").WorkflowExecutionInfo
				if info.Execution.RunId == info.FirstRunId {
					not = append(not, wid)
					continue
				}
				done[wid] = true
			}
		}
		return len(not) == 0, fmt.Sprintf("not yet: %v", not)
	})
	for _, s := range streams {
		wid := workflows.TabletWorkflowID(s, ids[0])
		info := e.describe(wid, "").WorkflowExecutionInfo
		require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW, e.describe(wid, info.FirstRunId).WorkflowExecutionInfo.Status, wid)
	}
	phase("every tablet workflow continued as new")
	tab := workflows.TabletWorkflowID(streams[0], ids[0])
	e.recordHistory(tab, e.describe(tab, "").WorkflowExecutionInfo.FirstRunId, "tablet-durable-continued-as-new")
	require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW, e.describe(streams[0], first[streams[0]]).WorkflowExecutionInfo.Status,
		"the stream's first run (starting %d tablets) continued as new", tablets)
	e.recordHistory(streams[0], first[streams[0]], "stream-durable-continued-as-new")
	// The runs each tablet is on now: how many continued as new while the
	// commands went out is logged below.
	runsAt := func() map[string]string {
		out := map[string]string{}
		for _, s := range streams {
			for _, id := range ids {
				wid := workflows.TabletWorkflowID(s, id)
				out[wid] = e.describe(wid, "").WorkflowExecutionInfo.Execution.RunId
			}
		}
		return out
	}
	crossed := func(before map[string]string) int {
		n := 0
		for wid, run := range runsAt() {
			if run != before[wid] {
				n++
			}
		}
		return n
	}

	// ownState waits until every tablet workflow's own (latest) run says
	// one of states too, not only the stream's rows.
	ownState := func(states ...workflows.State) {
		// A tablet seen in one of states once stays there (no command
		// follows): a query a busy workflow does not answer in time is
		// asked again, without asking the tablets already seen again.
		seen := map[string]bool{}
		e.eventually(fmt.Sprintf("every tablet workflow's own status is one of %v", states), commandWithin, func() (bool, string) {
			var not []string
			var last string
			for _, s := range streams {
				for _, id := range ids {
					wid := workflows.TabletWorkflowID(s, id)
					if seen[wid] {
						continue
					}
					ts, err := e.tabletOwnStatus(s, id)
					if err == nil && slices.Contains(states, ts.State) {
						seen[wid] = true
						continue
					}
					not = append(not, wid)
					last = fmt.Sprintf("%s: %s %v; %s", wid, ts.State, err, e.lastEvents(wid, 12))
				}
			}
			return len(not) == 0, fmt.Sprintf("not yet %v; the last: %s", not, last)
		})
	}

	// Pause every tablet, then resume every tablet. (One round: most of
	// the 72 tablets cross continue-as-new with each command in flight; a
	// second round doubled the test's time and caught nothing more.)
	before := runsAt()
	for _, s := range streams {
		e.signal(s, "pause", `{}`)
	}
	e.waitTablets(streams, tablets, commandWithin, workflows.Paused)
	ownState(workflows.Paused)
	phase(fmt.Sprintf("paused: %d of %d tablet workflows continued as new meanwhile", crossed(before), len(before)))

	before = runsAt()
	for _, s := range streams {
		e.signal(s, "resume", `{}`)
	}
	e.waitTablets(streams, tablets, commandWithin, running...)
	ownState(running...)
	phase(fmt.Sprintf("resumed: %d of %d tablet workflows continued as new meanwhile", crossed(before), len(before)))

	e.workload(sourcepb.WorkloadRequest_STOP)
	for _, s := range streams {
		e.requireExact(s, outs[s], 2*time.Minute)
	}
	phase("every stream's sink exact")

	// Stop: every stream completes, every row is Stopped, every tablet
	// workflow completed, and in the very run that received the stop (a
	// stop is never carried into a new run).
	before = runsAt()
	for _, s := range streams {
		e.signal(s, "stop", `{}`)
	}
	for _, s := range streams {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := e.temporal.GetWorkflow(ctx, s, "").Get(ctx, nil)
		cancel()
		if err != nil {
			st, _ := e.status(s)
			t.Fatalf("stream %s did not complete: %v; last status: %s", s, err, summary(st))
		}
		require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, e.describe(s, "").WorkflowExecutionInfo.Status, s)
		st, err := e.status(s)
		require.NoError(t, err)
		ok, seen := inState(tablets, workflows.Stopped)(st)
		require.True(t, ok, "stream %s: every tablet Stopped: %s", s, seen)
		for _, id := range ids {
			wid := workflows.TabletWorkflowID(s, id)
			// Its terminal report reached the stream before it completes:
			// it still waits for the report's confirmation (a workflow task).
			e.eventually(wid+" completed", 30*time.Second, func() (bool, string) {
				status := e.describe(wid, "").WorkflowExecutionInfo.Status
				return status == enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, status.String()
			})
			require.True(t, signalled(e.history(wid, ""), workflows.SignalTabletCommand, `"stop"`),
				"%s: its completed run received the stop itself", wid)
		}
	}
	phase(fmt.Sprintf("stopped: %d of %d tablet workflows continued as new meanwhile", crossed(before), len(before)))
	for _, s := range streams {
		runs := e.runsOf(s)
		require.Greater(t, len(runs), 1, "stream %s continued as new too", s)
		t.Logf("stream %s: %d runs", s, len(runs))
	}
	for _, s := range streams {
		r, err := jsonl.DigestDir(outs[s])
		require.NoError(t, err)
		require.Empty(t, r.Duplicates, "stream %s: no (tablet, position) twice", s)
		e.requireExact(s, outs[s], 10*time.Second) // nothing more arrived after the stop
	}

	e.recordHistory(streams[0], "", "stream-durable-stopped")
	e.recordHistory(tab, "", "tablet-durable-stopped")
}

// 2. A tablet workflow terminated by hand (no terminal report) is found
// closed on the next topology read and restarted from its checkpoint; its
// row counts the restart; the sink stays exact and ordered.
func TestTerminatedTabletIsRestartedAndItsDataStaysExact(t *testing.T) {
	e := newEnv(t, "--tablets", "8", "--rate", "300")
	worker := e.startWorker()
	out := filepath.Join(e.dir, "out")
	const stream = "restart"
	e.startStream(stream, e.config(out, map[string]any{"topologyRefresh": "2s"}))
	e.waitStatus(stream, "every tablet streaming", time.Minute, allStreaming(8))
	// Terminated after a run has ended, so the workflow holds a checkpoint
	// the restart must start from.
	var cp source.Checkpoint
	e.eventually("t-0002's workflow holds a checkpoint", time.Minute, func() (bool, string) {
		ts, err := e.tabletOwnStatus(stream, "t-0002")
		if err != nil {
			return false, err.Error()
		}
		cp = ts.Checkpoint
		return !cp.IsZero(), fmt.Sprintf("%s checkpoint %q", ts.State, cp)
	})

	wid := workflows.TabletWorkflowID(stream, "t-0002")
	killed := e.describe(wid, "").WorkflowExecutionInfo.Execution.RunId
	require.NoError(t, e.temporal.TerminateWorkflow(context.Background(), wid, "", "terminated by hand in a test"))
	require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, e.describe(wid, killed).WorkflowExecutionInfo.Status)
	atKill := sinkRecordsOf(out, "t-0002")

	st := e.waitStatus(stream, "t-0002 restarted and streaming", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		b := tabletStatus(st, "t-0002")
		return b.Restarts >= 1 && b.State == workflows.Streaming, summary(st) + fmt.Sprintf(" t-0002 restarts=%d", b.Restarts)
	})
	require.Equal(t, 1, tabletStatus(st, "t-0002").Restarts, "restarted once")
	for _, tab := range st.Tablets {
		if tab.ID != "t-0002" {
			require.Zero(t, tab.Restarts, "tablet %s was not restarted", tab.ID)
			require.Equal(t, workflows.Streaming, tab.State, tab.ID)
		}
	}
	info := e.describe(wid, "").WorkflowExecutionInfo
	require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_RUNNING, info.Status, "the tablet workflow runs again")
	restarted := info.Execution.RunId
	require.NotEqual(t, killed, restarted)

	// The new workflow started from the stream's row: the restart counted,
	// the reason saying so, the checkpoint kept.
	var in workflows.TabletInput
	var carried *workflows.TabletState
	events := e.history(wid, restarted)
	startInput(t, events, 0, &in)
	startInput(t, events, 1, &carried)
	require.NotNil(t, carried, "a restart carries the tablet's state")
	require.Equal(t, 1, carried.Status.Restarts)
	require.Contains(t, carried.Status.Reason, "restarted")
	require.Contains(t, carried.Status.Reason, "Terminated")
	require.GreaterOrEqual(t, carried.Checkpoint.Compare(cp), 0, "restarted from its checkpoint (%s), not before it (%s)", cp, carried.Checkpoint)
	require.True(t, in.Start.IsZero(), "the restart keeps the tablet's own start (the stream's start for t-0002), not its checkpoint")
	require.Equal(t, in.Start, carried.Status.Start)
	require.False(t, carried.Pause || carried.Stop, "no operator intent to carry")
	e.eventually("the worker log says why", 30*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(worker.Log())
		return strings.Contains(string(b), "tablet workflow closed without a terminal report; restarting it"), "no such line"
	})

	e.eventually("t-0002 writes again", time.Minute, func() (bool, string) {
		n := sinkRecordsOf(out, "t-0002")
		return n > atKill+100, fmt.Sprintf("%d records, %d at the kill", n, atKill)
	})
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact(stream, out, 2*time.Minute)
	st, err := e.status(stream)
	require.NoError(t, err)
	require.Equal(t, 1, tabletStatus(st, "t-0002").Restarts, "the count stays (no second restart)")

	e.signal(stream, "stop", `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, e.temporal.GetWorkflow(ctx, stream, "").Get(ctx, nil), "the stream completes")
	st, err = e.status(stream)
	require.NoError(t, err)
	require.Equal(t, 1, tabletStatus(st, "t-0002").Restarts)
	// The stream's run that restarted the tablet: the one holding the
	// second start of t-0002's workflow.
	e.recordHistory(stream, e.runWith(stream, 2, func(ev *historypb.HistoryEvent) bool {
		a := ev.GetStartChildWorkflowExecutionInitiatedEventAttributes()
		return a != nil && a.GetWorkflowId() == wid
	}), "stream-durable-restarted-tablet")
	e.recordHistory(wid, restarted, "tablet-durable-restarted")
}

// 3. A topology outage: the stream takes an exclude (signalled with the
// CLI) and answers queries at once, says the topology is unreadable while
// it is, and recovers by itself when the outage ends.
func TestStreamTakesCommandsWhileTheTopologyIsDown(t *testing.T) {
	e := newEnv(t, "--tablets", "8", "--rate", "200")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	const stream = "topodown"
	e.startStream(stream, e.config(out, map[string]any{"topologyRefresh": "2s"}))
	st := e.waitStatus(stream, "every tablet streaming", time.Minute, allStreaming(8))
	require.Nil(t, st.Topology)
	alias := busiest(st)
	var moved string // a tablet that must leave alias during the outage
	for _, tab := range st.Tablets {
		if tab.Replica == alias {
			moved = tab.ID
			break
		}
	}

	const outage = 30 * time.Second
	e.fault(&sourcepb.FaultRequest{TopologyDown: true, Duration: durationpb.New(outage)})
	downAt := time.Now()
	upAt := downAt.Add(outage)
	_, err := e.topo.ListTablets(context.Background(), &sourcepb.ListTabletsRequest{Keyspace: "commerce"})
	require.Equal(t, codes.Unavailable, status.Code(err), "the topology is down")
	atFault := sinkRecords(out)

	// The stream is inside a failing topology read (a ReadTopology past its
	// first attempt): a loop blocked on that read would take no signal now.
	e.eventually("the stream's topology read is failing", 15*time.Second, func() (bool, string) {
		for _, a := range e.describe(stream, "").PendingActivities {
			if name := a.GetActivityType().GetName(); (name == "ReadTopology" || name == "ListTablets") && a.GetAttempt() >= 2 {
				return true, ""
			}
		}
		return false, "no topology read retrying"
	})
	e.signal(stream, "exclude", fmt.Sprintf(`{"aliases": [%q], "reason": "excluded during the outage"}`, alias))
	st = e.waitStatus(stream, "the exclusion shows at once", 5*time.Second, func(st workflows.StreamStatus) (bool, string) {
		return len(st.Exclude) == 1 && st.Exclude[0].Alias == alias, summary(st)
	})
	require.Equal(t, "excluded during the outage", st.Exclude[0].Reason)
	require.True(t, time.Now().Before(upAt), "the exclusion showed while the topology was down")

	// Reads go on without the topology.
	e.eventually("tablets keep writing during the outage", time.Until(upAt), func() (bool, string) {
		n := sinkRecords(out)
		return n > atFault+500, fmt.Sprintf("%d records, %d at the fault", n, atFault)
	})
	st = e.waitStatus(stream, "the status says the topology is unreadable", time.Until(upAt), func(st workflows.StreamStatus) (bool, string) {
		return st.Topology != nil && st.Topology.Error != "", fmt.Sprintf("topology %+v", st.Topology)
	})
	require.True(t, time.Now().Before(upAt), "shown during the outage")
	require.WithinRange(t, st.Topology.Since, downAt.Add(-time.Second), time.Now(), "since the outage")
	t.Logf("during the outage: topology %q since %s (fault at %s)", st.Topology.Error, st.Topology.Since.Format(time.RFC3339Nano), downAt.Format(time.RFC3339Nano))

	// After the outage (it ends by itself): the trouble is cleared, every
	// tablet streams, none from the excluded replica.
	st = e.waitStatus(stream, "recovered: topology cleared, every tablet streaming off "+alias, 90*time.Second, func(st workflows.StreamStatus) (bool, string) {
		return st.Topology == nil && len(st.Tablets) == 8 && offReplica(st, alias), summary(st) + fmt.Sprintf(" topology=%+v", st.Topology)
	})
	require.False(t, time.Now().Before(upAt.Add(-time.Second)), "cleared only after the outage")
	require.Len(t, st.Exclude, 1)
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact(stream, out, 2*time.Minute)

	e.signal(stream, "stop", `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, e.temporal.GetWorkflow(ctx, stream, "").Get(ctx, nil), "the stream completes")
	// The stream's run that took the exclude during the outage.
	e.recordHistory(stream, e.runWith(stream, 1, func(ev *historypb.HistoryEvent) bool {
		return ev.GetWorkflowExecutionSignaledEventAttributes().GetSignalName() == "exclude"
	}), "stream-durable-topology-down")
	// A tablet moved off the excluded replica: its selection failed while
	// the topology was down; its last run ends with the stop.
	e.recordHistory(workflows.TabletWorkflowID(stream, moved), "", "tablet-durable-topology-down")
}

// TestStreamStartedWhileTheSourceIsDownTakesAStopAndStartsOnceItIsUp: a
// stream cannot make its source-side stream while the source is down (its
// topology service refuses every call), yet its loop runs: a second
// stream takes a stop and completes during the outage, the first says in
// its status since when the source-side stream cannot be made, and once
// the source is back its tablets start and deliver exactly.
func TestStreamStartedWhileTheSourceIsDownTakesAStopAndStartsOnceItIsUp(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "200")
	e.startWorker()
	// Longer than one try at making the source-side stream (a minute), so
	// that the status shows the trouble before the source comes back.
	const outage = 75 * time.Second
	e.fault(&sourcepb.FaultRequest{TopologyDown: true, Duration: durationpb.New(outage)})
	downAt := time.Now()
	upAt := downAt.Add(outage)
	out := filepath.Join(e.dir, "out")
	const stream, stopped = "srcdown", "srcdown-stop"
	e.startStream(stream, e.config(out, map[string]any{"topologyRefresh": "2s"}))
	e.startStream(stopped, e.config(filepath.Join(e.dir, "out-stop"), nil))

	e.eventually("the second stream's source-side stream is being retried", 30*time.Second, func() (bool, string) {
		for _, a := range e.describe(stopped, "").PendingActivities {
			if a.GetActivityType().GetName() == "EnsureStream" && a.GetAttempt() >= 2 {
				return true, ""
			}
		}
		return false, "no EnsureStream retrying"
	})
	e.signal(stopped, "stop", `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.temporal.GetWorkflow(ctx, stopped, "").Get(ctx, nil), "the stop ends the stream while the source is down")
	require.True(t, time.Now().Before(upAt), "stopped during the outage")

	st := e.waitStatus(stream, "the status says the source-side stream cannot be made", time.Until(upAt), func(st workflows.StreamStatus) (bool, string) {
		return st.Topology != nil && strings.Contains(st.Topology.Error, "create the source-side stream"), fmt.Sprintf("topology %+v", st.Topology)
	})
	require.True(t, time.Now().Before(upAt), "shown during the outage")
	require.WithinRange(t, st.Topology.Since, downAt, time.Now(), "since the outage")
	require.Empty(t, st.Tablets, "no tablet before the source-side stream exists")

	st = e.waitStatus(stream, "after the outage: every tablet streaming, the trouble cleared", time.Until(upAt)+90*time.Second, func(st workflows.StreamStatus) (bool, string) {
		ok, why := allStreaming(4)(st)
		return ok && st.Topology == nil, why + fmt.Sprintf(" topology=%+v", st.Topology)
	})
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact(stream, out, 2*time.Minute)
	e.signal(stream, "stop", `{}`)
	require.NoError(t, e.temporal.GetWorkflow(context.Background(), stream, "").Get(context.Background(), nil), "the stream completes")
	e.recordHistory(stopped, "", "stream-ensure-beside-stopped")
	e.recordHistory(stream, "", "stream-ensure-beside-started")
}

// runWith returns the run of workflow id holding the nth event (counted
// across runs, oldest first) that match holds for.
func (e *env) runWith(id string, nth int, match func(*historypb.HistoryEvent) bool) string {
	e.t.Helper()
	n := 0
	for _, run := range e.runsOf(id) {
		for _, ev := range e.history(id, run) {
			if match(ev) {
				n++
				if n == nth {
					return run
				}
			}
		}
	}
	e.t.Fatalf("%s: fewer than %d matching events", id, nth)
	return ""
}

// sinkRecordsOf counts one tablet's committed records.
func sinkRecordsOf(dir, tablet string) uint64 {
	r, err := jsonl.DigestDir(dir)
	if err != nil {
		return 0
	}
	return r.Tablets[tablet].Records
}

// 4. Reports are paced: when every tablet of a stream changes state at
// once, the stream receives their reports spread over the window of
// tablets/reportRate (each tablet in a slot of its own), not all at once;
// every tablet's Paused still arrives, and the stop after it completes
// the stream with every tablet Stopped.
func TestAPauseOfEveryTabletReachesTheStreamPaced(t *testing.T) {
	const tablets, rate = 48, 4.0 // a window of 12 s
	window := time.Duration(tablets / rate * float64(time.Second))
	e := newEnv(t, "--tablets", fmt.Sprint(tablets), "--rate", "200")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	const stream = "paced"
	e.startStream(stream, e.config(out, map[string]any{"reportRate": rate, "topologyRefresh": "5s"}))
	e.waitStatus(stream, "every tablet streaming", 2*time.Minute, allStreaming(tablets))

	e.signal(stream, "pause", `{}`)
	e.waitStatus(stream, "every tablet paused", 2*time.Minute, inState(tablets, workflows.Paused))

	// The reports the stream received after the pause, from every run.
	type report struct {
		at     time.Time
		status workflows.TabletStatus
	}
	var paused []report
	var all = map[string][]time.Time{}
	var pausedAt time.Time
	for _, run := range e.runsOf(stream) {
		for _, ev := range e.history(stream, run) {
			a := ev.GetWorkflowExecutionSignaledEventAttributes()
			if a == nil {
				continue
			}
			if a.GetSignalName() == workflows.CmdPause && pausedAt.IsZero() {
				pausedAt = ev.GetEventTime().AsTime()
			}
			if a.GetSignalName() != workflows.SignalTabletReport || pausedAt.IsZero() {
				continue
			}
			var ts workflows.TabletStatus
			require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(a.GetInput(), &ts))
			at := ev.GetEventTime().AsTime()
			all[ts.ID] = append(all[ts.ID], at)
			if ts.State == workflows.Paused {
				paused = append(paused, report{at, ts})
			}
		}
	}
	require.False(t, pausedAt.IsZero(), "the stream received the pause")
	seen := map[string]bool{}
	for _, r := range paused {
		seen[r.status.ID] = true
	}
	require.Len(t, seen, tablets, "every tablet reported Paused")
	first, last := paused[0].at, paused[len(paused)-1].at
	busiest := 0
	for i, r := range paused {
		n := 0
		for _, s := range paused[i:] {
			if s.at.Sub(r.at) < time.Second {
				n++
			}
		}
		busiest = max(busiest, n)
	}
	t.Logf("%d Paused reports over %v (window %v), at most %d in one second; first %v after the pause",
		len(paused), last.Sub(first), window, busiest, first.Sub(pausedAt))
	require.LessOrEqual(t, busiest, tablets/2, "at most half the tablets report in any one second (about %v are expected)", rate)
	// Each report reached the stream just after its tablet's slot: the
	// offset within the window from an FNV-1a hash of the tablet's ID
	// (workflows.paceDelay), plus the time a workflow task and a signal
	// take. Unpaced reports would land anywhere in the window.
	late, inSlot := []string{}, 0
	reports := 0
	for id, times := range all {
		h := fnv.New64a()
		h.Write([]byte(id))
		offset := int64(h.Sum64() % uint64(window))
		for i, at := range times {
			reports++
			lag := time.Duration(((at.UnixNano()-offset)%int64(window) + int64(window)) % int64(window))
			if lag < 2*time.Second {
				inSlot++
			} else {
				late = append(late, fmt.Sprintf("%s#%d +%v", id, i, lag.Round(time.Millisecond)))
			}
			if i > 0 {
				require.GreaterOrEqual(t, at.Sub(times[i-1]), window/4, "tablet %s reported twice within %v", id, at.Sub(times[i-1]))
			}
		}
	}
	t.Logf("%d of %d reports within 2s after their tablet's slot; the others: %v", inSlot, reports, late)
	require.GreaterOrEqual(t, float64(inSlot), 0.9*float64(reports), "reports arrive in their tablets' slots")

	e.workload(sourcepb.WorkloadRequest_STOP)
	e.signal(stream, "resume", `{}`)
	e.requireExact(stream, out, 2*time.Minute)
	e.signal(stream, "stop", `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, e.temporal.GetWorkflow(ctx, stream, "").Get(ctx, nil), "the stream completes")
	st, err := e.status(stream)
	require.NoError(t, err)
	ok, states := inState(tablets, workflows.Stopped)(st)
	require.True(t, ok, "every tablet Stopped: %s", states)

	e.recordHistory(stream, "", "stream-paced-stopped")
	e.recordHistory(workflows.TabletWorkflowID(stream, "t-0001"), "", "tablet-paced-stopped")
}
