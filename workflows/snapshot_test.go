package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// snapshotConfig is streamConfig with a postgres source, whose kind can
// snapshot tables of a running stream (config.Kind.AdhocSnapshot),
// reading public.orders and public.items.
func snapshotConfig(t *testing.T) json.RawMessage {
	var m map[string]any
	require.NoError(t, json.Unmarshal(streamConfig(t), &m))
	m["source"] = bigPostgresSource(1)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

// The tests below run a postgres source, which can snapshot tables of a
// running stream; tabletd's cannot (the refusal is tested).
func TestPostgresSourcesCanSnapshotTabletdOnesCannot(t *testing.T) {
	require.True(t, config.SourceKinds()["postgres"].AdhocSnapshot)
	require.False(t, config.SourceKinds()["tabletd"].AdhocSnapshot)
}

// snapshotStream is a stream (in its state) whose tablet t-0000 has split
// into ids, each streaming.
func snapshotStream(env *testsuite.TestWorkflowEnvironment, ids ...string) *StreamState {
	const alias = "zone1-0000000101"
	rows := map[string]*TabletStatus{"t-0000": {ID: "t-0000", State: Split, Children: ids, Handoff: cp(5), Checkpoint: cp(5), Seq: 4}}
	for _, id := range ids {
		rows[id] = &TabletStatus{ID: id, State: Streaming, Replica: alias, Checkpoint: cp(7), Start: cp(5), Seq: 1}
	}
	w := &streamWith{lists: [][]source.Tablet{snapshotListing(ids...)}}
	w.mock(env)
	return &StreamState{Tablets: rows, Aliases: []string{alias}}
}

// snapshotListing is the topology of snapshotStream: t-0000's children.
func snapshotListing(ids ...string) []source.Tablet {
	var listed []source.Tablet
	for _, id := range ids {
		listed = append(listed, source.Tablet{ID: id, Parent: "t-0000", Replicas: []source.Replica{replica(id, "zone1-0000000101")}})
	}
	return listed
}

// snapshotSource is the Snapshot activity: it records what it is asked
// and takes every job and cancel, but refuses the job on the tablets in
// refuse, with their error; after delays each answer.
type snapshotSource struct {
	mu     sync.Mutex
	asked  []activities.SnapshotInput
	refuse map[string]string
	// down: tablets whose server does not answer for their first n asks.
	down map[string]int
}

func (s *snapshotSource) mock(env *testsuite.TestWorkflowEnvironment, after time.Duration) {
	call := env.OnActivity(a.Snapshot, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.SnapshotInput) (activities.SnapshotResult, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.asked = append(s.asked, in)
			var res activities.SnapshotResult
			for _, id := range in.Tablets {
				if s.down[id] > 0 {
					s.down[id]--
					if res.Later == nil {
						res.Later = map[string]string{}
					}
					res.Later[id] = "connection refused"
					continue
				}
				if why := s.refuse[id]; why != "" && !in.Cancel {
					if res.Failed == nil {
						res.Failed = map[string]string{}
					}
					res.Failed[id] = why
					continue
				}
				res.Done = append(res.Done, id)
			}
			return res, nil
		}).Maybe()
	if after > 0 {
		call.After(after)
	}
}

func (s *snapshotSource) calls() []activities.SnapshotInput {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.asked)
}

// copied is a tablet's report of a streaming tablet whose reader holds
// copy c.
func copied(env *testsuite.TestWorkflowEnvironment, id string, seq int64, c source.CopyProgress) TabletStatus {
	return TabletStatus{ID: id, State: Streaming, Replica: "zone1-0000000101", Checkpoint: cp(uint64(10 + seq)), Seq: seq, Updated: env.Now(), Copy: &c}
}

// copyDone is snapshot-1's copy, complete.
var copyDone = source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 1, TablesDone: 1, Rows: 40, Done: true}

// command sends an operator command as a signal or as an update; an
// update's outcome goes to done (nil: accepted and applied).
func command(t *testing.T, env *testsuite.TestWorkflowEnvironment, how, name, payload string, done func(error)) {
	t.Helper()
	if how == "signal" {
		env.SignalWorkflow(name, json.RawMessage(payload))
		return
	}
	env.UpdateWorkflow(name, name+"-update", &testsuite.TestUpdateCallback{
		OnReject: done, OnAccept: func() {}, OnComplete: func(_ any, err error) { done(err) },
	}, json.RawMessage(payload))
}

// reopens are the reopen commands each tablet was told, by tablet.
func reopens(c *tabletCommands, ids ...string) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, id := range ids {
		for _, cmd := range c.got[TabletWorkflowID("orders", id)] {
			if cmd.Kind == CmdReopen {
				out[id]++
			}
		}
	}
	return out
}

// A snapshot records its job at the source once (Snapshot activity, the
// job's id and tables, on every tablet that has not split or on the ones
// named), then tells those tablets to reopen their readers; it is Running
// until each of them reported its copy of the job done, then Done, with
// its end dated. A report of another tablet's copy, or of a copy still
// under way, does not end it.
func TestASnapshotReopensItsTabletsAndIsDoneOnceEachCopied(t *testing.T) {
	for _, tt := range []struct {
		name, how, payload string
		tables, tablets    []string
	}{
		// By default every tablet that has not split (not t-0000).
		{"all tablets, signalled", "signal", `{"tables": ["public.orders"], "reason": "backfill"}`,
			[]string{"public.orders"}, []string{"t-0001", "t-0002"}},
		// The tablets named; t-0001's done copy is not this one's.
		{"named tablets, as an update", "update", `{"tables": ["public.items", "public.orders"], "tablets": ["t-0002"], "reason": "backfill"}`,
			[]string{"public.items", "public.orders"}, []string{"t-0002"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			st := snapshotStream(env, "t-0001", "t-0002")
			var cmds tabletCommands
			cmds.mock(env)
			var src snapshotSource
			src.mock(env, 0)
			var asked time.Time
			env.RegisterDelayedCallback(func() {
				asked = env.Now()
				command(t, env, tt.how, CmdSnapshot, tt.payload, func(err error) { require.NoError(t, err) })
			}, 5*time.Second)
			var running, half, done StreamStatus
			env.RegisterDelayedCallback(func() { running = queryStatus[StreamStatus](t, env) }, 6*time.Second)
			env.RegisterDelayedCallback(func() {
				under := copyDone
				under.Done, under.TablesDone, under.Table = false, 0, "public.orders"
				env.SignalWorkflow(SignalTabletReport, copied(env, "t-0002", 2, under))
				env.SignalWorkflow(SignalTabletReport, copied(env, "t-0001", 2, copyDone))
			}, 7*time.Second)
			env.RegisterDelayedCallback(func() { half = queryStatus[StreamStatus](t, env) }, 7500*time.Millisecond)
			env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalTabletReport, copied(env, "t-0002", 3, copyDone)) }, 8*time.Second)
			env.RegisterDelayedCallback(func() { done = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 9*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

			calls := src.calls()
			require.Len(t, calls, 1, "the job recorded once: %+v", calls)
			in := calls[0]
			require.Equal(t, "orders", in.Stream)
			require.Equal(t, "postgres", in.Source.Kind)
			require.Equal(t, tt.tablets, in.Tablets)
			require.Equal(t, source.SnapshotJob{ID: "snapshot-1", Tables: tt.tables}, in.Job)
			require.False(t, in.Cancel)

			want := map[string]int{}
			for _, id := range tt.tablets {
				want[id] = 1
			}
			require.Equal(t, want, reopens(&cmds, "t-0000", "t-0001", "t-0002"), "the snapshot's tablets reopen, once each")

			require.Empty(t, running.Rejected)
			sn := running.Snapshot
			require.NotNil(t, sn)
			require.Equal(t, "snapshot-1", sn.ID)
			require.Equal(t, SnapshotRunning, sn.State)
			require.Equal(t, tt.tables, sn.Tables)
			require.Equal(t, tt.tablets, sn.Tablets)
			require.Equal(t, "backfill", sn.Reason)
			require.True(t, sn.Asked.Equal(asked), "asked %v, want %v", sn.Asked, asked)
			require.Zero(t, sn.Ended)
			require.Empty(t, sn.Todo, "the source took the job on every tablet")
			require.Empty(t, sn.Done)

			require.Equal(t, SnapshotRunning, half.Snapshot.State, "t-0002's copy is under way")
			if slices.Contains(tt.tablets, "t-0001") {
				require.Equal(t, []string{"t-0001"}, half.Snapshot.Done)
			} else {
				require.Empty(t, half.Snapshot.Done, "t-0001 is not the snapshot's")
			}

			sn = done.Snapshot
			require.Equal(t, SnapshotDone, sn.State)
			require.Equal(t, tt.tablets, sn.Done)
			require.Empty(t, sn.Failed)
			require.False(t, sn.Ended.IsZero(), "its end is dated")
			require.False(t, sn.Ended.Before(sn.Asked))
		})
	}
}

// A snapshot command that cannot be carried out is refused, as an update
// (its error) and as a signal (shown in the status's Rejected), naming
// what is wrong; nothing is recorded at the source, no tablet is told,
// and the last snapshot stays as it was.
func TestSnapshotCommandsAreRefusedNamingWhatIsWrong(t *testing.T) {
	running := &Snapshot{ID: "snapshot-1", Tables: []string{"public.orders"}, Tablets: []string{"t-0001", "t-0002"}, State: SnapshotRunning}
	done := &Snapshot{ID: "snapshot-1", Tables: []string{"public.orders"}, Tablets: []string{"t-0001", "t-0002"}, State: SnapshotDone,
		Done: []string{"t-0001", "t-0002"}}
	for _, tt := range []struct {
		name     string
		tabletd  bool // the stream reads a tabletd source
		cmd      string
		payload  string
		snapshot *Snapshot // the stream's last snapshot
		want     string
	}{
		// A table the stream does not read.
		{"a table not in source.tables", false, CmdSnapshot, `{"tables": ["public.orders", "public.users"]}`, nil,
			`tables[1]: "public.users" is not a table the stream reads (source.tables [public.orders public.items])`},
		// No tables at all.
		{"no tables", false, CmdSnapshot, `{"tablets": ["t-0001"]}`, nil, "tables: name the tables to copy"},
		{"a table named twice", false, CmdSnapshot, `{"tables": ["public.orders", "public.orders"]}`, nil, `tables[1]: "public.orders" is named twice`},
		// A tablet that has split: its children hold its rows.
		{"a split tablet named", false, CmdSnapshot, `{"tables": ["public.orders"], "tablets": ["t-0001", "t-0000"]}`, nil,
			"tablets[1]: t-0000 has split"},
		{"an unknown tablet named", false, CmdSnapshot, `{"tables": ["public.orders"], "tablets": ["t-0009"]}`, nil,
			`tablets[0]: unknown tablet "t-0009"`},
		// One snapshot at a time.
		{"a second snapshot while one runs", false, CmdSnapshot, `{"tables": ["public.items"]}`, running,
			"snapshot snapshot-1 of [public.orders] is running"},
		{"a cancel with none running", false, CmdSnapshotCancel, `{"reason": "oops"}`, nil, "no snapshot is running"},
		{"a cancel of a snapshot done", false, CmdSnapshotCancel, `{}`, done, "no snapshot is running"},
		// A source kind without config.Kind.AdhocSnapshot.
		{"a source that cannot snapshot", true, CmdSnapshot, `{"tables": ["public.orders"]}`, nil,
			`source kind "tabletd" cannot snapshot tables of a running stream`},
	} {
		for _, how := range []string{"signal", "update"} {
			t.Run(tt.name+", "+how, func(t *testing.T) {
				env := newEnv(t)
				st := snapshotStream(env, "t-0001", "t-0002")
				st.Snapshot = tt.snapshot
				cfg := snapshotConfig(t)
				if tt.tabletd {
					cfg = streamConfig(t)
				}
				var cmds tabletCommands
				cmds.mock(env)
				var src snapshotSource
				src.mock(env, 0)
				var refused error
				env.RegisterDelayedCallback(func() {
					command(t, env, how, tt.cmd, tt.payload, func(err error) { refused = err })
				}, 5*time.Second)
				var status StreamStatus
				env.RegisterDelayedCallback(func() { status = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 7*time.Second)
				env.ExecuteWorkflow(StreamWorkflow, cfg, st)

				if how == "signal" {
					require.Len(t, status.Rejected, 1, "%+v", status.Rejected)
					require.Equal(t, tt.cmd, status.Rejected[0].Signal)
					require.Contains(t, status.Rejected[0].Reason, tt.want)
				} else {
					require.Error(t, refused)
					require.Contains(t, refused.Error(), tt.want)
					require.Empty(t, status.Rejected)
				}
				require.Empty(t, src.calls(), "nothing recorded at the source")
				require.Zero(t, cmds.n, "no tablet told")
				if tt.snapshot == nil {
					require.Nil(t, status.Snapshot)
				} else {
					require.Equal(t, tt.snapshot.State, status.Snapshot.State, "the last snapshot as it was")
					require.Equal(t, tt.snapshot.ID, status.Snapshot.ID)
				}
			})
		}
	}
}

// A tablet whose job the source refused shows in the snapshot's Failed,
// with the source's error, and is not told to reopen; the snapshot is
// Done once the others' copies are.
func TestASnapshotRefusedOnATabletIsDoneOnceTheOthersCopied(t *testing.T) {
	env := newEnv(t)
	st := snapshotStream(env, "t-0001", "t-0002", "t-0003")
	var cmds tabletCommands
	cmds.mock(env)
	src := snapshotSource{refuse: map[string]string{"t-0003": "public.orders has no primary key on shard s3"}}
	src.mock(env, 0)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdSnapshot, json.RawMessage(`{"tables": ["public.orders"]}`)) }, 5*time.Second)
	var running StreamStatus
	env.RegisterDelayedCallback(func() {
		running = queryStatus[StreamStatus](t, env)
		env.SignalWorkflow(SignalTabletReport, copied(env, "t-0001", 2, copyDone))
		env.SignalWorkflow(SignalTabletReport, copied(env, "t-0002", 2, copyDone))
	}, 6*time.Second)
	var done StreamStatus
	env.RegisterDelayedCallback(func() { done = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 8*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

	require.Len(t, src.calls(), 1)
	require.Equal(t, map[string]int{"t-0001": 1, "t-0002": 1}, reopens(&cmds, "t-0001", "t-0002", "t-0003"), "the refused tablet is not told")
	require.Equal(t, SnapshotRunning, running.Snapshot.State)
	require.Equal(t, map[string]string{"t-0003": "public.orders has no primary key on shard s3"}, running.Snapshot.Failed)
	require.Empty(t, running.Snapshot.Todo)
	require.Equal(t, SnapshotDone, done.Snapshot.State)
	require.Equal(t, []string{"t-0001", "t-0002"}, done.Snapshot.Done)
	require.Equal(t, map[string]string{"t-0003": "public.orders has no primary key on shard s3"}, done.Snapshot.Failed)
	require.False(t, done.Snapshot.Ended.IsZero())
}

// snapshot-cancel ends a running snapshot (Cancelled, its end dated, the
// reason kept): the source is told to cancel the job on the tablets whose
// copy is not done (a refused one too), and those reopen without it. A copy
// reported done after the cancel does not make it Done.
func TestSnapshotCancelCancelsTheJobOnTheTabletsNotDone(t *testing.T) {
	for _, how := range []string{"signal", "update"} {
		t.Run(how, func(t *testing.T) {
			env := newEnv(t)
			st := snapshotStream(env, "t-0001", "t-0002", "t-0003")
			var cmds tabletCommands
			cmds.mock(env)
			src := snapshotSource{refuse: map[string]string{"t-0003": "no primary key"}}
			src.mock(env, 0)
			env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdSnapshot, json.RawMessage(`{"tables": ["public.orders"]}`)) }, 5*time.Second)
			env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalTabletReport, copied(env, "t-0001", 2, copyDone)) }, 6*time.Second)
			var cancelled time.Time
			env.RegisterDelayedCallback(func() {
				cancelled = env.Now()
				command(t, env, how, CmdSnapshotCancel, `{"reason": "too slow"}`, func(err error) { require.NoError(t, err) })
			}, 7*time.Second)
			env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalTabletReport, copied(env, "t-0002", 2, copyDone)) }, 8*time.Second)
			var status StreamStatus
			env.RegisterDelayedCallback(func() { status = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 9*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

			calls := src.calls()
			require.Len(t, calls, 2, "%+v", calls)
			require.False(t, calls[0].Cancel)
			require.Equal(t, activities.SnapshotInput{Stream: "orders", Source: calls[1].Source, Tablets: []string{"t-0002", "t-0003"},
				Job: source.SnapshotJob{ID: "snapshot-1", Tables: []string{"public.orders"}}, Cancel: true}, calls[1],
				"cancelled where the copy is not done (t-0001): also where it was refused (t-0003), whose job an earlier attempt may have recorded")
			require.Equal(t, map[string]int{"t-0001": 1, "t-0002": 2, "t-0003": 1}, reopens(&cmds, "t-0001", "t-0002", "t-0003"),
				"t-0002 reopens with the job, then without it; t-0003, refused the job, reopens after its cancel")
			sn := status.Snapshot
			require.Equal(t, SnapshotCancelled, sn.State)
			require.True(t, sn.Ended.Equal(cancelled), "ended %v, cancelled %v", sn.Ended, cancelled)
			require.Equal(t, "too slow", sn.Reason)
			require.Equal(t, []string{"t-0001"}, sn.Done, "t-0002's copy came after the cancel")
			require.Equal(t, map[string]string{"t-0003": "no primary key"}, sn.Failed)
			require.Empty(t, sn.Todo)
			require.Empty(t, status.Rejected)
		})
	}
}

// A cancel that comes while the job is being recorded at the source waits
// for that Snapshot activity, then cancels the job on every tablet (what
// the first one answered is moot), and only then are they told to reopen.
func TestSnapshotCancelledWhileBeingRecordedIsCancelledOnEveryTablet(t *testing.T) {
	env := newEnv(t)
	st := snapshotStream(env, "t-0001", "t-0002")
	var cmds tabletCommands
	cmds.mock(env)
	src := snapshotSource{refuse: map[string]string{"t-0002": "no primary key"}}
	src.mock(env, 3*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdSnapshot, json.RawMessage(`{"tables": ["public.orders"]}`)) }, 5*time.Second)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdSnapshotCancel, nil) }, 6*time.Second)
	var recorded map[string]int
	env.RegisterDelayedCallback(func() { recorded = reopens(&cmds, "t-0001", "t-0002") }, 9500*time.Millisecond)
	var status StreamStatus
	env.RegisterDelayedCallback(func() { status = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 12*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

	calls := src.calls()
	require.Len(t, calls, 2, "%+v", calls)
	require.False(t, calls[0].Cancel)
	require.True(t, calls[1].Cancel)
	require.Equal(t, []string{"t-0001", "t-0002"}, calls[1].Tablets)
	require.Empty(t, recorded, "no reopen for the job that was cancelled meanwhile")
	require.Equal(t, map[string]int{"t-0001": 1, "t-0002": 1}, reopens(&cmds, "t-0001", "t-0002"), "reopened once the cancel is recorded")
	require.Equal(t, SnapshotCancelled, status.Snapshot.State)
	require.Empty(t, status.Snapshot.Failed, "the refusal answered for the cancelled job is not shown")
	require.Empty(t, status.Snapshot.Todo)
}

// A running snapshot whose job the source has not taken yet (its Snapshot
// activity under way when the stream continues as new) rides in the
// state with those tablets in Todo; the next run records it on them, with
// the same id, and tells them to reopen.
func TestContinueAsNewCarriesASnapshotNotRecordedYet(t *testing.T) {
	env := newEnv(t)
	st := snapshotStream(env, "t-0001", "t-0002")
	var cmds tabletCommands
	cmds.mock(env)
	var src snapshotSource
	src.mock(env, time.Hour)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdSnapshot, json.RawMessage(`{"tables": ["public.orders"]}`)) }, 5*time.Second)
	env.RegisterDelayedCallback(func() {
		env.SetContinueAsNewSuggested(true)
		env.SignalWorkflow(SignalTabletReport, copied(env, "t-0001", 2, source.CopyProgress{Kind: source.CopyStart, Done: true}))
	}, 6*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "%v", env.GetWorkflowError())
	var raw json.RawMessage
	var next *StreamState
	require.NoError(t, decodeArgs(can, &raw, &next))
	require.NotNil(t, next.Snapshot)
	require.Equal(t, SnapshotRunning, next.Snapshot.State)
	require.Equal(t, []string{"t-0001", "t-0002"}, next.Snapshot.Todo, "not recorded yet")
	require.Equal(t, 1, next.SnapshotSeq)
	require.Empty(t, reopens(&cmds, "t-0001", "t-0002"), "no tablet reopened before its job is recorded")

	// The next run (the source-side stream made already).
	env = newEnv(t)
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(activities.TopologyOf(snapshotListing("t-0001", "t-0002")), nil)
	env.OnActivity(a.CheckTablets, mock.Anything, mock.Anything).Return([]activities.ClosedTablet(nil), nil).Maybe()
	var cmds2 tabletCommands
	cmds2.mock(env)
	var src2 snapshotSource
	src2.mock(env, 0)
	var status StreamStatus
	env.RegisterDelayedCallback(func() { status = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 5*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, raw, next)

	calls := src2.calls()
	require.Len(t, calls, 1)
	require.Equal(t, []string{"t-0001", "t-0002"}, calls[0].Tablets)
	require.Equal(t, source.SnapshotJob{ID: "snapshot-1", Tables: []string{"public.orders"}}, calls[0].Job)
	require.False(t, calls[0].Cancel)
	require.Equal(t, map[string]int{"t-0001": 1, "t-0002": 1}, reopens(&cmds2, "t-0001", "t-0002"))
	require.Equal(t, SnapshotRunning, status.Snapshot.State)
	require.Empty(t, status.Snapshot.Todo)
}

// A reopen ends the tablet's run (not paused, not stopped) and the next
// one starts at once; the copy the runs report adds up in the tablet's
// status, and the run that finishes it marks it done.
func TestReopenEndsATabletsRunAndItsCopyAddsUpOverRuns(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 2}, nil)
	var mu sync.Mutex
	var starts []time.Time
	runOf := map[string]int{} // by activity id: the run's number
	env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		if info.ActivityType.Name != "GetChanges" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, env.Now())
		runOf[info.ActivityID] = len(starts)
	})
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(ctx context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			mu.Lock()
			n := runOf[activity.GetInfo(ctx).ActivityID]
			mu.Unlock()
			res := activities.GetChangesResult{Checkpoint: cp(in.Checkpoint.Index + 10), Records: 10, Batches: 1, Stopped: activities.StoppedRunEnded}
			c := source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 2, Estimate: 100}
			switch n {
			case 1: // reopened: the test environment drops a cancelled run's result
				c.Rows = 1000
			case 2:
				c.Rows, c.TablesDone, c.Table = 60, 1, "public.items"
			default:
				c.Rows, c.TablesDone, c.Done, c.Estimate = 30, 2, true, 90
			}
			res.Copy = &c
			return res, nil
		}).After(time.Minute)
	reports := recordReports(env)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalTabletCommand, TabletCommand{Kind: CmdReopen}) }, 5*time.Second)
	var st TabletStatus
	env.RegisterDelayedCallback(func() {
		st = queryStatus[TabletStatus](t, env)
		env.SignalWorkflow(SignalTabletCommand, TabletCommand{Kind: CmdStop})
	}, 130*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	require.NoError(t, env.GetWorkflowError())
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(starts), 3)
	require.Less(t, starts[1].Sub(starts[0]), 10*time.Second, "the reopened run ended and the next began at once: %v", starts)
	require.Equal(t, Streaming, st.State, "a reopen neither pauses nor stops the tablet")
	require.Equal(t, &source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 2, TablesDone: 2, Rows: 90, Estimate: 100, Done: true}, st.Copy)
	last := reports.got[len(reports.got)-1]
	require.Equal(t, Stopped, last.State)
	require.Equal(t, st.Copy, last.Copy, "its reports carry the copy")
}

// mergeCopy adds the rows of the runs of one copy, keeps a done copy when
// a reader finds it done again, and takes another copy as it comes.
func TestMergeCopyAddsUpTheRunsOfOneCopy(t *testing.T) {
	snap := func(id string, rows, estimate int64, done bool) *source.CopyProgress {
		return &source.CopyProgress{Kind: source.CopySnapshot, ID: id, Tables: 2, Rows: rows, Estimate: estimate, Done: done}
	}
	for _, tt := range []struct {
		name           string
		prev, now, out *source.CopyProgress
	}{
		// A tablet's first copy.
		{"first", nil, snap("snapshot-1", 5, 100, false), snap("snapshot-1", 5, 100, false)},
		// The next run of the same copy: rows add up, the larger estimate
		// is kept, the rest is the new run's.
		{"next run", snap("snapshot-1", 5, 100, false),
			&source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 2, TablesDone: 1, Table: "public.items", Rows: 7, Estimate: 90},
			&source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 2, TablesDone: 1, Table: "public.items", Rows: 12, Estimate: 100}},
		// The run that finishes it.
		{"finished", snap("snapshot-1", 12, 100, false), snap("snapshot-1", 3, 0, true), snap("snapshot-1", 15, 100, true)},
		// A reader that finds the copy complete at its start reports it
		// done with no rows (and what else it saw then): the done copy
		// stays as it was; so it does when a reader counts rows again.
		{"done again",
			&source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 2, TablesDone: 2, Table: "public.items", Rows: 15, Estimate: 100, Done: true},
			&source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 2, TablesDone: 2, Estimate: 120, Done: true},
			&source.CopyProgress{Kind: source.CopySnapshot, ID: "snapshot-1", Tables: 2, TablesDone: 2, Table: "public.items", Rows: 15, Estimate: 100, Done: true}},
		{"done again, rows counted again", snap("snapshot-1", 15, 100, true), snap("snapshot-1", 6, 0, true), snap("snapshot-1", 15, 100, true)},
		// A run that reported no copy.
		{"none reported", snap("snapshot-1", 15, 100, true), nil, snap("snapshot-1", 15, 100, true)},
		// Another snapshot replaces the last one, done or not.
		{"another id", snap("snapshot-1", 15, 100, true), snap("snapshot-2", 4, 50, false), snap("snapshot-2", 4, 50, false)},
		{"another id, not done", snap("snapshot-1", 8, 100, false), snap("snapshot-2", 4, 50, false), snap("snapshot-2", 4, 50, false)},
		// Another kind of copy, even with the same (empty) id.
		{"another kind", &source.CopyProgress{Kind: source.CopyStart, Rows: 500, Done: true}, &source.CopyProgress{Kind: source.CopyResync, Rows: 9},
			&source.CopyProgress{Kind: source.CopyResync, Rows: 9}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var prev, now *source.CopyProgress
			if tt.prev != nil {
				p := *tt.prev
				prev = &p
			}
			if tt.now != nil {
				n := *tt.now
				now = &n
			}
			require.Equal(t, tt.out, mergeCopy(prev, now))
			require.Equal(t, tt.prev, prev, "prev left as it was")
			require.Equal(t, tt.now, now, "now left as it was")
		})
	}
}

// A tablet whose server the source cannot reach now is told again after
// snapshotRetry (the others are not held up, nor is it listed failed);
// a tablet that ends before its copy is complete is listed failed with
// why, and the snapshot is Done once the others' copies are.
func TestASnapshotTellsAnUnreachableTabletLaterAndListsOneThatEndedFailed(t *testing.T) {
	env := newEnv(t)
	st := snapshotStream(env, "t-0001", "t-0002", "t-0003")
	var cmds tabletCommands
	cmds.mock(env)
	src := snapshotSource{down: map[string]int{"t-0002": 1}}
	src.mock(env, 0)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdSnapshot, json.RawMessage(`{"tables": ["public.orders"]}`)) }, 5*time.Second)
	var first StreamStatus
	env.RegisterDelayedCallback(func() {
		first = queryStatus[StreamStatus](t, env)
		env.SignalWorkflow(SignalTabletReport, copied(env, "t-0001", 2, copyDone))
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0003", State: Expired, Reason: "history gone", Checkpoint: cp(9), Seq: 2, Updated: env.Now()})
	}, 6*time.Second)
	var later StreamStatus
	env.RegisterDelayedCallback(func() {
		later = queryStatus[StreamStatus](t, env)
		env.SignalWorkflow(SignalTabletReport, copied(env, "t-0002", 2, copyDone))
	}, 5*time.Second+snapshotRetry+2*time.Second)
	var done StreamStatus
	env.RegisterDelayedCallback(func() { done = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 5*time.Second+snapshotRetry+4*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

	calls := src.calls()
	require.Len(t, calls, 2, "%+v", calls)
	require.Equal(t, []string{"t-0002"}, calls[1].Tablets, "told again, alone")
	require.Equal(t, []string{"t-0002"}, first.Snapshot.Todo)
	require.Empty(t, first.Snapshot.Failed, "not reached now is not failed")
	require.Empty(t, later.Snapshot.Todo)
	require.Contains(t, later.Snapshot.Failed["t-0003"], "ended Expired before its copy was complete: history gone")
	require.Equal(t, map[string]int{"t-0001": 1, "t-0002": 1, "t-0003": 1}, reopens(&cmds, "t-0001", "t-0002", "t-0003"))
	require.Equal(t, SnapshotDone, done.Snapshot.State)
	require.Equal(t, []string{"t-0001", "t-0002"}, done.Snapshot.Done)
}
