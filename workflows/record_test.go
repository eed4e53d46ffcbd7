package workflows_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tabletflow/tabletflow/activities"
	_ "github.com/tabletflow/tabletflow/adapters"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// TestRecordScriptedHistories records replay histories of workflow
// shapes that need a sequence of errors no e2e test produces: the
// workflows run on a Temporal dev server, their activities scripted.
// It runs only with TABLETFLOW_RECORD_HISTORIES set to a directory,
// which it writes the histories into (copy a new one into testdata and
// list it in replay_test.go's recorded), and the Temporal CLI in
// bin/temporal (or TEMPORAL_CLI).
func TestRecordScriptedHistories(t *testing.T) {
	dir := os.Getenv("TABLETFLOW_RECORD_HISTORIES")
	if dir == "" {
		t.Skip("TABLETFLOW_RECORD_HISTORIES is not set")
	}
	cli := os.Getenv("TEMPORAL_CLI")
	if cli == "" {
		cli = "../bin/temporal"
	}
	srv, err := testbed.StartDevServer(cli, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	c, err := client.Dial(client.Options{HostPort: srv.Addr, Logger: temporalclient.Quiet{}})
	require.NoError(t, err)
	t.Cleanup(c.Close)

	const queue = "record"
	f := &scripted{c: c, runs: map[string]int{}, jobs: map[string]source.SnapshotJob{}}
	w := worker.New(c, queue, worker.Options{})
	w.RegisterWorkflow(workflows.StreamWorkflow)
	w.RegisterWorkflow(workflows.TabletWorkflow)
	for name, fn := range map[string]any{
		"EnsureStream": f.EnsureStream, "ReadTopology": f.ReadTopology, "ReadTopologyAndPick": f.ReadTopologyAndPick,
		"CheckTablets": f.CheckTablets, "SelectReplica": f.SelectReplica, "GetChanges": f.GetChanges, "DeleteStream": f.DeleteStream,
		"Resync": f.Resync, "Snapshot": f.Snapshot, "SetTables": f.SetTables, "ReadLiveFigures": f.ReadLiveFigures,
	} {
		w.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	r := &recorder{t: t, c: c, dir: dir, queue: queue}

	// On a second queue the tablet workflows are a fake (fakeTablet),
	// for a stream whose tablet closes slowly after its Failed report.
	const fakeQueue = "record-fake-tablets"
	fw := worker.New(c, fakeQueue, worker.Options{})
	fw.RegisterWorkflow(workflows.StreamWorkflow)
	fw.RegisterWorkflowWithOptions(fakeTablet, workflow.RegisterOptions{Name: "TabletWorkflow"})
	for name, fn := range map[string]any{
		"EnsureStream": f.EnsureStream, "ReadTopology": f.ReadTopology, "ReadTopologyAndPick": f.ReadTopologyAndPick,
		"CheckTablets": (&closedChecker{c: c}).CheckTablets, "DeleteStream": f.DeleteStream,
	} {
		fw.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
	require.NoError(t, fw.Start())
	t.Cleanup(fw.Stop)

	// changeRetryingState: a single-replica tablet whose first runs end
	// with POSITION_MISMATCH is Retrying, and Streaming again once a run
	// commits; then the stream stops.
	t.Run("retrying-state", func(t *testing.T) {
		const stream = "retrying"
		tab := workflows.TabletWorkflowID(stream, "t-0001")
		r.start(stream)
		r.waitTablet(tab, "Retrying after a failed run", func(st workflows.TabletStatus) bool {
			return st.State == workflows.Retrying && st.Attempt > 1
		})
		r.waitTablet(tab, "Streaming once a run committed", func(st workflows.TabletStatus) bool {
			return st.State == workflows.Streaming && st.Records > 0
		})
		r.stop(stream)
		r.record(tab, "tablet-retrying-state-stopped")
	})

	// changeBoundedCommands: a pause and a resume naming the tablet twice
	// tell it once each; a resume signal over the bound is rejected;
	// then the stream stops.
	t.Run("bounded-commands", func(t *testing.T) {
		const stream = "bounded"
		tab := workflows.TabletWorkflowID(stream, "t-0001")
		r.start(stream)
		r.waitTablet(tab, "Streaming", func(st workflows.TabletStatus) bool { return st.State == workflows.Streaming })
		r.signal(stream, workflows.CmdPause, `{"tablets": ["t-0001", "t-0001"]}`)
		r.waitTablet(tab, "Paused", func(st workflows.TabletStatus) bool { return st.State == workflows.Paused })
		r.signal(stream, workflows.CmdResume, `{"tablets": [`+strings.Repeat(`"t-0001", `, 2000)+`"t-0001"]}`)
		r.waitStream(stream, "the oversized resume rejected", func(st workflows.StreamStatus) bool { return len(st.Rejected) == 1 })
		r.signal(stream, workflows.CmdResume, `{"tablets": ["t-0001", "t-0001"]}`)
		r.waitTablet(tab, "Streaming again", func(st workflows.TabletStatus) bool { return st.State == workflows.Streaming })
		r.stop(stream)
		r.record(stream, "stream-bounded-commands-stopped")
	})

	// changeOperatorIntents: a stream started with its tablet's start
	// heard of in its loop; a pause, then a report contradicting it
	// (the tablet streaming, sent here as the tablet's own), which has
	// the stream tell the pause again; a resume; then a stop.
	t.Run("operator-intents", func(t *testing.T) {
		const stream = "intents"
		tab := workflows.TabletWorkflowID(stream, "t-0001")
		r.start(stream)
		r.waitTablet(tab, "Streaming", func(st workflows.TabletStatus) bool { return st.State == workflows.Streaming })
		r.signal(stream, workflows.CmdPause, `{"tablets": ["t-0001"]}`)
		r.waitStream(stream, "t-0001 Paused", func(st workflows.StreamStatus) bool { return st.Tablets[0].State == workflows.Paused })
		contradicting, err := json.Marshal(workflows.TabletStatus{ID: "t-0001", State: workflows.Streaming, Replica: recordAlias, Updated: time.Now()})
		require.NoError(t, err)
		r.signal(stream, workflows.SignalTabletReport, string(contradicting))
		r.waitTablet(tab, "the pause told again", func(workflows.TabletStatus) bool { return r.pausesTold(tab) == 2 })
		r.signal(stream, workflows.CmdResume, `{"tablets": ["t-0001"]}`)
		r.waitTablet(tab, "Streaming again", func(st workflows.TabletStatus) bool { return st.State == workflows.Streaming })
		r.stop(stream)
		r.record(stream, "stream-operator-intents-stopped")
	})

	// changeChargedReplica: a run fails with an error whose details name
	// another replica than the one it was started on (a move in place
	// whose signal was lost): the tablet charges that one; the next run
	// commits; then the stream stops.
	t.Run("charged-replica", func(t *testing.T) {
		const stream = "charged"
		tab := workflows.TabletWorkflowID(stream, "t-0001")
		r.start(stream)
		r.waitTablet(tab, "Retrying on the replica the error names", func(st workflows.TabletStatus) bool {
			return st.State == workflows.Retrying && st.Replica == recordMovedTo
		})
		r.waitTablet(tab, "Streaming once a run committed", func(st workflows.TabletStatus) bool {
			return st.State == workflows.Streaming && st.Records > 0
		})
		r.stop(stream)
		r.record(tab, "tablet-charged-replica-stopped")
	})

	// changeQuietRewording: a tablet with no eligible replica looks
	// again, each look's reason worded anew (a replica's lag), and
	// upserts its search attributes once; then it streams, and the
	// stream stops.
	t.Run("quiet-rewording", func(t *testing.T) {
		const stream = "reworded"
		tab := workflows.TabletWorkflowID(stream, "t-0001")
		r.start(stream)
		r.waitTablet(tab, "Streaming once a replica is eligible", func(st workflows.TabletStatus) bool {
			return st.State == workflows.Streaming && st.Records > 0
		})
		r.stop(stream)
		r.record(tab, "tablet-quiet-rewording-stopped")
	})

	// changeResync: the tablet's first run finds its history expired;
	// the operator resyncs it; the stream makes its fresh start and
	// starts its new workflow, which streams; then the stream stops.
	t.Run("resync", func(t *testing.T) {
		const stream = "resyncme"
		r.start(stream)
		r.waitStream(stream, "t-0001 Expired", func(st workflows.StreamStatus) bool {
			return len(st.Tablets) == 1 && st.Tablets[0].State == workflows.Expired
		})
		r.signal(stream, workflows.CmdResync, `{"tablets": ["t-0001"], "reason": "recorded"}`)
		r.waitStream(stream, "t-0001 resynced and streaming", func(st workflows.StreamStatus) bool {
			return st.Tablets[0].Resyncs == 1 && st.Tablets[0].State == workflows.Streaming
		})
		r.stop(stream)
		r.record(stream, "stream-resync-stopped")
	})

	// changeResync, of a tablet that runs: the stream tells it to stop,
	// and once its Stopped report came makes its fresh start and starts
	// its new workflow, which streams; then the stream stops.
	t.Run("resync-running", func(t *testing.T) {
		const stream = "resyncrun"
		r.start(stream)
		r.waitStream(stream, "t-0001 streaming", func(st workflows.StreamStatus) bool {
			return len(st.Tablets) == 1 && st.Tablets[0].State == workflows.Streaming
		})
		r.signal(stream, workflows.CmdResync, `{"tablets": ["t-0001"], "reason": "recorded"}`)
		r.waitStream(stream, "t-0001 resynced and streaming", func(st workflows.StreamStatus) bool {
			return st.Tablets[0].Resyncs == 1 && st.Tablets[0].State == workflows.Streaming
		})
		r.stop(stream)
		r.record(stream, "stream-resync-running-stopped")
	})

	// changeSnapshot: the operator asks for a snapshot of a table; the
	// stream records it at the source (the Snapshot activity) and tells
	// the tablet to reopen its reader; the run ends, the next one copies
	// the table, and the tablet's report of its copy done makes the
	// snapshot Done; then the stream stops. The stream's source is a
	// postgres one (a kind that can snapshot; the scripted activities
	// ignore it). A tablet reports its finished copy at once
	// (changeCopyReports).
	t.Run("snapshot", func(t *testing.T) {
		const stream = "snapme"
		tab := workflows.TabletWorkflowID(stream, "t-0001")
		r.startConfig(stream, snapshotRecordConfig)
		r.waitStream(stream, "t-0001 streaming", func(st workflows.StreamStatus) bool {
			return len(st.Tablets) == 1 && st.Tablets[0].State == workflows.Streaming
		})
		r.signal(stream, workflows.CmdSnapshot, `{"tables": ["public.orders"], "reason": "recorded"}`)
		r.waitStreamWithin(3*time.Minute, stream, "the snapshot Done", func(st workflows.StreamStatus) bool {
			return st.Snapshot != nil && st.Snapshot.State == workflows.SnapshotDone
		})
		r.stop(stream)
		r.record(stream, "stream-snapshot-stopped")
		r.record(tab, "tablet-snapshot-reopen-stopped")
	})

	// changeSourceTables: the operator adds a table with configure's
	// source.tables; the stream makes the change at the source (the
	// SetTables activity), then backfills the table with a snapshot,
	// which the tablet copies; then the operator removes it again (no
	// backfill), and the stream stops.
	t.Run("source-tables", func(t *testing.T) {
		const stream = "tableme"
		r.startConfig(stream, snapshotRecordConfig)
		r.waitStream(stream, "t-0001 streaming", func(st workflows.StreamStatus) bool {
			return len(st.Tablets) == 1 && st.Tablets[0].State == workflows.Streaming
		})
		r.update(stream, workflows.CmdConfigure, "add", `{"source": {"tables": ["public.orders", "public.items", "public.extra"]}, "reason": "recorded"}`)
		r.waitStreamWithin(3*time.Minute, stream, "the table added and backfilled", func(st workflows.StreamStatus) bool {
			return st.TablesChange != nil && st.TablesChange.State == workflows.TablesDone &&
				st.Snapshot != nil && st.Snapshot.State == workflows.SnapshotDone
		})
		r.update(stream, workflows.CmdConfigure, "remove", `{"source": {"tables": ["public.orders", "public.items"]}}`)
		r.waitStream(stream, "the table removed", func(st workflows.StreamStatus) bool {
			return st.TablesChange.ID == "tables-2" && st.TablesChange.State == workflows.TablesDone
		})
		r.stop(stream)
		r.record(stream, "stream-source-tables-stopped")
	})

	// changeLiveStatus: the stream reads its running tablet's live
	// figures beside its loop, shows them in its status and its memo;
	// then it stops.
	t.Run("live-status", func(t *testing.T) {
		const stream = "liveme"
		r.start(stream)
		r.waitStream(stream, "t-0001 streaming with live figures", func(st workflows.StreamStatus) bool {
			return len(st.Tablets) == 1 && st.Tablets[0].State == workflows.Streaming && st.Tablets[0].Live != nil &&
				st.Live != nil && st.Live.Records > 0
		})
		r.stop(stream)
		r.record(stream, "stream-live-status-stopped")
	})

	// changeRetryAfterClose: the operator retries a tablet that reported
	// Failed while its workflow has not closed yet; the stream starts its
	// new workflow once the old one closed; then the stream stops.
	t.Run("retry-after-close", func(t *testing.T) {
		const stream = "retryclose"
		fr := &recorder{t: t, c: c, dir: dir, queue: fakeQueue}
		fr.start(stream)
		fr.waitStream(stream, "t-0001 Failed", func(st workflows.StreamStatus) bool {
			return len(st.Tablets) == 1 && st.Tablets[0].State == workflows.Failed
		})
		fr.signal(stream, workflows.CmdRetry, `{"tablets": ["t-0001"]}`)
		fr.waitStream(stream, "the retry waiting for the old workflow to close", func(st workflows.StreamStatus) bool {
			return strings.Contains(st.Tablets[0].Reason, "waits for its previous workflow")
		})
		fr.waitStream(stream, "the new workflow streaming", func(st workflows.StreamStatus) bool {
			return st.Tablets[0].State == workflows.Streaming
		})
		fr.stop(stream)
		fr.record(stream, "stream-retry-after-close-stopped")
	})
}

// recorder starts streams on the dev server and records their histories.
type recorder struct {
	t     *testing.T
	c     client.Client
	dir   string
	queue string
}

// pausesTold counts the pause commands in a tablet workflow's history.
func (r *recorder) pausesTold(id string) int {
	r.t.Helper()
	it := r.c.GetWorkflowHistory(context.Background(), id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	n := 0
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(r.t, err)
		a := ev.GetWorkflowExecutionSignaledEventAttributes()
		if a.GetSignalName() != workflows.SignalTabletCommand {
			continue
		}
		var cmd workflows.TabletCommand
		if err := converter.GetDefaultDataConverter().FromPayloads(a.GetInput(), &cmd); err == nil && cmd.Kind == workflows.CmdPause {
			n++
		}
	}
	return n
}

// recordConfig is the config of every recorded stream: the scripted
// activities ignore the source and the sink.
const recordConfig = `{
  "source": {"kind": "tabletd", "address": "127.0.0.1:15991", "keyspace": "commerce"},
  "sink": {"kind": "jsonl", "path": "/tmp/out"},
  "run": {"duration": "2s", "heartbeatTimeout": "2s"},
  "batch": {"maxWait": "1s"},
  "retry": {"initialInterval": "200ms", "maximumInterval": "1s", "maximumAttempts": 3}
}`

// snapshotRecordConfig is recordConfig with a source that can snapshot
// tables of a running stream.
const snapshotRecordConfig = `{
  "source": {"kind": "postgres", "tables": ["public.orders", "public.items"],
    "shards": [{"id": "s1", "replicas": [{"alias": "zone1-0000000101", "cell": "zone1", "type": "PRIMARY", "dsnEnv": "S1_DSN"}]}]},
  "sink": {"kind": "jsonl", "path": "/tmp/out"},
  "run": {"duration": "2s", "heartbeatTimeout": "2s"},
  "batch": {"maxWait": "1s"},
  "retry": {"initialInterval": "200ms", "maximumInterval": "1s", "maximumAttempts": 3}
}`

func (r *recorder) start(stream string) {
	r.t.Helper()
	r.startConfig(stream, recordConfig)
}

func (r *recorder) startConfig(stream, cfg string) {
	r.t.Helper()
	_, err := r.c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: stream, TaskQueue: r.queue},
		workflows.StreamWorkflow, json.RawMessage(cfg), (*workflows.StreamState)(nil))
	require.NoError(r.t, err)
}

// waitTablet polls a tablet's status query until cond holds, for up to a
// minute.
func (r *recorder) waitTablet(id, what string, cond func(workflows.TabletStatus) bool) {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last workflows.TabletStatus
	for {
		v, err := r.c.QueryWorkflow(context.Background(), id, "", workflows.QueryStatus)
		if err == nil && v.Get(&last) == nil && cond(last) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: %s not within a minute; last saw %+v (%v)", id, what, last, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *recorder) signal(stream, name, payload string) {
	r.t.Helper()
	require.NoError(r.t, r.c.SignalWorkflow(context.Background(), stream, "", name, json.RawMessage(payload)))
}

// update sends an operator command as an update, of id, and waits for
// it to be applied.
func (r *recorder) update(stream, name, id, payload string) {
	r.t.Helper()
	h, err := r.c.UpdateWorkflow(context.Background(), client.UpdateWorkflowOptions{
		WorkflowID: stream, UpdateID: id, UpdateName: name, Args: []any{json.RawMessage(payload)}, WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	require.NoError(r.t, err)
	require.NoError(r.t, h.Get(context.Background(), nil))
}

// waitStream polls a stream's status query until cond holds, for up to a
// minute.
func (r *recorder) waitStream(id, what string, cond func(workflows.StreamStatus) bool) {
	r.t.Helper()
	r.waitStreamWithin(time.Minute, id, what, cond)
}

// waitStreamWithin is waitStream for up to d.
func (r *recorder) waitStreamWithin(d time.Duration, id, what string, cond func(workflows.StreamStatus) bool) {
	r.t.Helper()
	deadline := time.Now().Add(d)
	var last workflows.StreamStatus
	for {
		v, err := r.c.QueryWorkflow(context.Background(), id, "", workflows.QueryStatus)
		if err == nil && v.Get(&last) == nil && cond(last) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: %s not within %v; last saw %+v (%v)", id, what, d, last, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop stops a stream and waits for it to complete.
func (r *recorder) stop(stream string) {
	r.t.Helper()
	require.NoError(r.t, r.c.SignalWorkflow(context.Background(), stream, "", workflows.CmdStop, json.RawMessage(`{}`)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(r.t, r.c.GetWorkflow(ctx, stream, "").Get(ctx, nil))
}

// record writes a workflow's history (its last run) as name.json, in
// the format of `temporal workflow show -o json`.
func (r *recorder) record(id, name string) {
	r.t.Helper()
	it := r.c.GetWorkflowHistory(context.Background(), id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	h := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(r.t, err)
		h.Events = append(h.Events, ev)
	}
	b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(h)
	require.NoError(r.t, err)
	require.NoError(r.t, os.WriteFile(filepath.Join(r.dir, name+".json"), b, 0o644))
}

// scripted are the activities of recorded streams: one tablet, t-0001,
// on one replica; GetChanges fails its first runs of stream "retrying"
// with POSITION_MISMATCH and otherwise reads until its run is up or it
// is cancelled.
type scripted struct {
	c    client.Client
	mu   sync.Mutex
	runs map[string]int // GetChanges runs by tablet workflow ID
	// jobs are the snapshots recorded, by stream/tablet: a run that
	// starts after one copies its tables.
	jobs map[string]source.SnapshotJob
}

const recordAlias = "zone1-0000000101"

// recordMovedTo is the replica a "charged" run's error names.
const recordMovedTo = "zone2-0000000201"

func recordReplica() source.Replica {
	return source.Replica{Tablet: "t-0001", Alias: recordAlias, Cell: "zone1", Type: source.TypeReplica, Serving: true, Healthy: true}
}

func recordTopology() activities.Topology {
	return activities.TopologyOf([]source.Tablet{{ID: "t-0001", Replicas: []source.Replica{recordReplica()}}})
}

func (f *scripted) EnsureStream(_ context.Context, in activities.EnsureStreamInput) (source.Stream, error) {
	return source.Stream{ID: in.Stream}, nil
}

func (f *scripted) ReadTopology(context.Context, config.Source) (activities.Topology, error) {
	return recordTopology(), nil
}

func (f *scripted) ReadTopologyAndPick(_ context.Context, in activities.PickInput) (activities.Topology, error) {
	topo := recordTopology()
	topo.Picks = map[string]activities.Selection{}
	if _, excluded := in.Operator.Excludes(recordAlias, "t-0001", time.Now()); !excluded && in.Stream != "reworded" {
		topo.Picks["t-0001"] = activities.Selection{Replica: recordReplica(), Candidates: 1}
	}
	return topo, nil
}

func (f *scripted) CheckTablets(context.Context, activities.CheckTabletsInput) ([]activities.ClosedTablet, error) {
	return nil, nil
}

func (f *scripted) SelectReplica(_ context.Context, in activities.SelectReplicaInput) (activities.Selection, error) {
	if in.Stream == "reworded" {
		f.mu.Lock()
		f.runs["select "+in.Stream]++
		n := f.runs["select "+in.Stream]
		f.mu.Unlock()
		if n <= 3 {
			return activities.Selection{}, temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("no eligible replica: %s lagging %ds (maxLag 30s)", recordAlias, 30+n), activities.ErrNoEligibleReplica, nil)
		}
	}
	if _, excluded := append(in.Exclude, in.Operator...).Excludes(recordAlias, in.Tablet, time.Now()); excluded {
		return activities.Selection{}, temporal.NewNonRetryableApplicationError(recordAlias+": excluded", activities.ErrNoEligibleReplica, nil)
	}
	return activities.Selection{Replica: recordReplica(), Candidates: 1}, nil
}

func (f *scripted) Resync(context.Context, activities.ResyncInput) (source.Checkpoint, error) {
	return source.Checkpoint{Term: 2}, nil
}

// SetTables takes every change.
func (f *scripted) SetTables(context.Context, activities.SetTablesInput) error { return nil }

// Snapshot takes every job (and cancel).
func (f *scripted) Snapshot(_ context.Context, in activities.SnapshotInput) (activities.SnapshotResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range in.Tablets {
		if in.Cancel {
			delete(f.jobs, in.Stream+"/"+t)
		} else {
			f.jobs[in.Stream+"/"+t] = in.Job
		}
	}
	return activities.SnapshotResult{Done: in.Tablets}, nil
}

func (f *scripted) DeleteStream(context.Context, activities.DeleteStreamInput) error { return nil }

// ReadLiveFigures says each tablet's run is far past its reports.
func (f *scripted) ReadLiveFigures(_ context.Context, in activities.ReadLiveInput) ([]activities.LiveFigures, error) {
	var out []activities.LiveFigures
	for _, id := range in.Tablets {
		now := time.Now()
		out = append(out, activities.LiveFigures{Tablet: id, Checkpoint: source.Checkpoint{Term: 1, Index: 1 << 40}, Records: 7, Batches: 1,
			LastCommit: now, At: now, Running: true})
	}
	return out, nil
}

func (f *scripted) GetChanges(ctx context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
	info := activity.GetInfo(ctx)
	f.mu.Lock()
	f.runs[info.WorkflowExecution.ID]++
	n := f.runs[info.WorkflowExecution.ID]
	job, copying := f.jobs[in.Stream+"/"+in.Tablet]
	f.mu.Unlock()
	if in.Stream == "charged" && n == 1 {
		return activities.GetChangesResult{Checkpoint: in.Checkpoint}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("position %s is not held by this replica", in.Checkpoint), activities.ErrRetryElsewhere, nil,
			activities.ErrorDetails{Reason: "POSITION_MISMATCH", Replica: recordMovedTo, Checkpoint: in.Checkpoint})
	}
	if in.Stream == "resyncme" && n == 1 {
		return activities.GetChangesResult{Checkpoint: in.Checkpoint}, temporal.NewNonRetryableApplicationError(
			"the stream's history on this tablet is gone", activities.ErrStreamExpired, nil,
			activities.ErrorDetails{Reason: "STREAM_EXPIRED", Replica: in.Replica.Alias, Checkpoint: in.Checkpoint})
	}
	if in.Stream == "retrying" && n <= 3 {
		return activities.GetChangesResult{Checkpoint: in.Checkpoint}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("position %s is not held by this replica", in.Checkpoint), activities.ErrRetryElsewhere, nil,
			activities.ErrorDetails{Reason: "POSITION_MISMATCH", Replica: in.Replica.Alias, Checkpoint: in.Checkpoint})
	}
	res := activities.GetChangesResult{Checkpoint: source.Checkpoint{Term: 1, Index: in.Checkpoint.Index + 10}, Records: 10, Batches: 1, CaughtUp: true}
	if copying {
		// The reader opened after the job was recorded copies its tables.
		res.Copy = &source.CopyProgress{Kind: source.CopySnapshot, ID: job.ID, Tables: len(job.Tables), TablesDone: len(job.Tables), Rows: 3, Done: true}
	}
	if in.Recovering {
		// The first commit of a run after a failed one, as GetChanges
		// signals it.
		if err := f.c.SignalWorkflow(ctx, info.WorkflowExecution.ID, "", activities.SignalProgress,
			activities.Progress{State: "Streaming", Attempt: info.Attempt, Replica: in.Replica.Alias}); err != nil {
			return activities.GetChangesResult{}, err
		}
	}
	end := time.NewTimer(in.RunFor.D())
	defer end.Stop()
	beat := time.NewTicker(200 * time.Millisecond)
	defer beat.Stop()
	for {
		activity.RecordHeartbeat(ctx, activities.Heartbeat{Checkpoint: res.Checkpoint, Records: res.Records, Batches: res.Batches})
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				res.Stopped = "cancelled"
				return res, nil
			}
			return res, ctx.Err()
		case <-end.C:
			res.Stopped = activities.StoppedRunEnded
			return res, nil
		case <-beat.C:
		}
	}
}

// fakeTablet stands for TabletWorkflow in the retry-after-close
// recording: its first run reports Failed and closes 8 s later (a slow
// confirmation); a later run reports Streaming, and Stopped when told to
// stop.
func fakeTablet(ctx workflow.Context, in workflows.TabletInput, st *workflows.TabletState) error {
	report := func(s workflows.TabletStatus) error {
		s.ID, s.Updated = in.Tablet, workflow.Now(ctx)
		return workflow.SignalExternalWorkflow(ctx, in.Stream, "", workflows.SignalTabletReport, s).Get(ctx, nil)
	}
	if st == nil {
		if err := workflow.Sleep(ctx, time.Second); err != nil {
			return err
		}
		if err := report(workflows.TabletStatus{State: workflows.Failed, Reason: "sink: SINK_CORRUPT", Seq: 1}); err != nil {
			return err
		}
		return workflow.Sleep(ctx, 8*time.Second)
	}
	seq := st.Status.Seq
	if err := report(workflows.TabletStatus{State: workflows.Streaming, Replica: recordAlias, Checkpoint: st.Checkpoint, Seq: seq + 1}); err != nil {
		return err
	}
	commands := workflow.GetSignalChannel(ctx, workflows.SignalTabletCommand)
	for {
		var cmd workflows.TabletCommand
		commands.Receive(ctx, &cmd)
		if cmd.Kind == workflows.CmdStop {
			return report(workflows.TabletStatus{State: workflows.Stopped, Replica: recordAlias, Checkpoint: st.Checkpoint, Seq: seq + 2})
		}
	}
}

// closedChecker is CheckTablets as the activity does it, over the dev
// server: a tablet whose workflow is not running is closed (its final
// status is not needed here).
type closedChecker struct{ c client.Client }

func (k *closedChecker) CheckTablets(ctx context.Context, in activities.CheckTabletsInput) ([]activities.ClosedTablet, error) {
	var closed []activities.ClosedTablet
	for _, t := range in.Tablets {
		d, err := k.c.DescribeWorkflow(ctx, t.WorkflowID, "")
		if err != nil {
			return nil, err
		}
		if s := d.RawResponse.GetWorkflowExecutionInfo().GetStatus(); s != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
			closed = append(closed, activities.ClosedTablet{Tablet: t.Tablet, Status: s.String()})
		}
	}
	return closed, nil
}
