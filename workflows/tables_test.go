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
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// tablesSource is the SetTables activity: it records what it is asked and
// answers err (nil: done) after after.
type tablesSource struct {
	mu    sync.Mutex
	asked []activities.SetTablesInput
	err   error
	// down: a list naming it is answered with a retryable error.
	down string
}

func (s *tablesSource) mock(env *testsuite.TestWorkflowEnvironment, after time.Duration) {
	call := env.OnActivity(a.SetTables, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.SetTablesInput) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.asked = append(s.asked, in)
			if s.down != "" && slices.Contains(in.Tables, s.down) {
				return errors.New("connection refused")
			}
			return s.err
		}).Maybe()
	if after > 0 {
		call.After(after)
	}
}

func (s *tablesSource) calls() []activities.SetTablesInput {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.asked)
}

// configured counts the configure commands the tablets were told.
func configured(c *tabletCommands) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, cmds := range c.got {
		for _, cmd := range cmds {
			if cmd.Kind == CmdConfigure {
				n++
			}
		}
	}
	return n
}

// secondUpdate sends a second configure, which must be applied: an
// update of its own id (command's would be taken for the first).
func secondUpdate(t *testing.T, env *testsuite.TestWorkflowEnvironment, payload string) {
	env.UpdateWorkflow(CmdConfigure, "configure-2", &testsuite.TestUpdateCallback{
		OnReject: func(err error) { require.NoError(t, err) }, OnAccept: func() {},
		OnComplete: func(_ any, err error) { require.NoError(t, err) },
	}, json.RawMessage(payload))
}

// configure's source.tables: the change is made at the source first
// (SetTables, with the whole new list), Publishing until then; then the
// stream reads the new list (a snapshot of an added table is taken) and
// backfills the added tables with a snapshot of them on every running
// tablet. A second change removes tables: no backfill. Neither tells the
// tablets a configure (their tunables did not change), and the status
// records each change.
func TestConfigureTablesPublishesThenBackfillsTheAddedOnes(t *testing.T) {
	env := newEnv(t)
	st := snapshotStream(env, "t-0001", "t-0002")
	var cmds tabletCommands
	cmds.mock(env)
	var snaps snapshotSource
	snaps.mock(env, 0)
	var tabs tablesSource
	tabs.mock(env, 2*time.Second)
	var publishing, added, removed StreamStatus
	copiedEarly := -1
	env.RegisterDelayedCallback(func() {
		command(t, env, "update", CmdConfigure, `{"source": {"tables": ["public.orders", "public.items", "public.extra"]}, "reason": "e2e: add extra"}`,
			func(err error) { require.NoError(t, err) })
	}, 5*time.Second)
	env.RegisterDelayedCallback(func() {
		publishing, copiedEarly = queryStatus[StreamStatus](t, env), len(snaps.calls())
		command(t, env, "update", CmdSnapshot, `{"tables": ["public.orders"]}`, func(err error) {
			require.ErrorContains(t, err, "the tables the stream reads are changing (tables-1)")
		})
	}, 6*time.Second)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, copied(env, "t-0001", 2, copyDone))
		env.SignalWorkflow(SignalTabletReport, copied(env, "t-0002", 2, copyDone))
	}, 9*time.Second)
	env.RegisterDelayedCallback(func() {
		added = queryStatus[StreamStatus](t, env)
		secondUpdate(t, env, `{"source": {"tables": ["public.orders"]}}`)
	}, 10*time.Second)
	env.RegisterDelayedCallback(func() { removed = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 14*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

	tc := publishing.TablesChange
	require.NotNil(t, tc)
	require.Equal(t, TablesPublishing, tc.State)
	require.Equal(t, "tables-1", tc.ID)
	require.Equal(t, []string{"public.orders", "public.items"}, tc.From)
	require.Equal(t, []string{"public.extra"}, tc.Added)
	require.Empty(t, tc.Removed)
	require.Equal(t, "e2e: add extra", tc.Reason)
	require.Zero(t, copiedEarly, "nothing copied before the source publishes the table")

	tc = added.TablesChange
	require.Equal(t, TablesDone, tc.State)
	require.False(t, tc.Ended.IsZero())
	require.Equal(t, "snapshot-1", tc.Backfill)
	require.NotNil(t, added.Snapshot)
	require.Equal(t, []string{"public.extra"}, added.Snapshot.Tables, "the backfill copies the added table only")
	require.Equal(t, []string{"t-0001", "t-0002"}, added.Snapshot.Tablets)
	require.Equal(t, SnapshotDone, added.Snapshot.State)
	require.Contains(t, added.Snapshot.Reason, "tables-1")

	tc = removed.TablesChange
	require.Equal(t, "tables-2", tc.ID, "%+v %+v", tc, removed.Rejected)
	require.Equal(t, TablesDone, tc.State)
	require.Equal(t, []string{"public.orders", "public.items", "public.extra"}, tc.From)
	require.Equal(t, []string{"public.items", "public.extra"}, tc.Removed)
	require.Empty(t, tc.Backfill)

	calls := tabs.calls()
	require.Len(t, calls, 2)
	require.Equal(t, []string{"public.orders", "public.items", "public.extra"}, calls[0].Tables)
	require.Equal(t, "orders", calls[0].Stream)
	require.Equal(t, "postgres", calls[0].Source.Kind)
	require.Equal(t, []string{"public.orders"}, calls[1].Tables)
	require.Equal(t, []string{"public.orders", "public.items", "public.extra"}, calls[1].Source.Tables, "the stream's source reads the tables of the change before")
	require.Contains(t, string(calls[1].Source.Spec), `"tables":["public.orders","public.items","public.extra"]`)
	require.Len(t, snaps.calls(), 1, "one backfill, for the tables added")
	require.Equal(t, source.SnapshotJob{ID: "snapshot-1", Tables: []string{"public.extra"}}, snaps.calls()[0].Job)
	require.Zero(t, configured(&cmds), "the tunables did not change: no tablet told a configure")
}

// A change the source refuses (a table it does not have) is Failed with
// the source's error, and the stream reads what it read: a snapshot of
// the table is refused. A run started from a state whose last change is
// Done reads that change's tables.
func TestConfigureTablesTheSourceRefusesFailsAndChangesNothing(t *testing.T) {
	env := newEnv(t)
	st := snapshotStream(env, "t-0001")
	st.TablesSeq = 1
	st.TablesChange = &TablesChange{ID: "tables-1", From: []string{"public.orders", "public.items"}, Tables: []string{"public.orders"},
		Removed: []string{"public.items"}, State: TablesDone}
	var cmds tabletCommands
	cmds.mock(env)
	var snaps snapshotSource
	snaps.mock(env, 0)
	tabs := tablesSource{err: temporal.NewNonRetryableApplicationError("a table of source.tables cannot be streamed: public.nope not there", "BAD_TABLES", nil)}
	tabs.mock(env, 0)
	env.RegisterDelayedCallback(func() {
		command(t, env, "update", CmdSnapshot, `{"tables": ["public.items"]}`, func(err error) {
			require.ErrorContains(t, err, `"public.items" is not a table the stream reads (source.tables [public.orders])`)
		})
		command(t, env, "update", CmdConfigure, `{"source": {"tables": ["public.orders", "public.nope"]}}`, func(err error) { require.NoError(t, err) })
	}, 5*time.Second)
	var status StreamStatus
	env.RegisterDelayedCallback(func() {
		status = queryStatus[StreamStatus](t, env)
		command(t, env, "update", CmdSnapshot, `{"tables": ["public.nope"]}`, func(err error) {
			require.ErrorContains(t, err, `"public.nope" is not a table the stream reads (source.tables [public.orders])`)
		})
	}, 7*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 8*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

	require.Len(t, tabs.calls(), 1, "a verdict is not asked again")
	tc := status.TablesChange
	require.Equal(t, "tables-2", tc.ID)
	require.Equal(t, TablesFailed, tc.State)
	require.Contains(t, tc.Error, "public.nope not there")
	require.Equal(t, []string{"public.orders"}, tc.From)
	require.Empty(t, snaps.calls())
}

// A change of tables that cannot be made is refused, naming what is
// wrong; nothing is asked of the source and the last change stays.
func TestConfigureTablesIsRefusedNamingWhatIsWrong(t *testing.T) {
	running := &Snapshot{ID: "snapshot-1", Tables: []string{"public.orders"}, Tablets: []string{"t-0001"}, State: SnapshotRunning}
	publishing := &TablesChange{ID: "tables-1", From: []string{"public.orders", "public.items"}, Tables: []string{"public.orders"}, State: TablesPublishing}
	for _, tt := range []struct {
		name     string
		tabletd  bool
		payload  string
		snapshot *Snapshot
		change   *TablesChange
		want     string
	}{
		{"a source that cannot", true, `{"source": {"tables": ["public.orders"]}}`, nil, nil,
			`source.tables: source kind "tabletd" cannot change the tables of a running stream`},
		{"an empty list", false, `{"source": {"tables": []}}`, nil, nil, "source.tables"},
		{"a name without a schema", false, `{"source": {"tables": ["orders"]}}`, nil, nil, "source.tables[0]"},
		{"a table named twice", false, `{"source": {"tables": ["public.orders", "public.orders"]}}`, nil, nil, "source.tables[1]"},
		{"another source field", false, `{"source": {"tables": ["public.orders"], "shards": []}}`, nil, nil, "shards"},
		{"a table added while a snapshot runs", false, `{"source": {"tables": ["public.orders", "public.items", "public.extra"]}}`, running, nil,
			"snapshot snapshot-1 of [public.orders] is running"},
		{"a table removed that a running snapshot copies", false, `{"source": {"tables": ["public.items"]}}`, running, publishing,
			"source.tables: snapshot snapshot-1 copies [public.orders], and this removes one of them"},
		{"a reason without tables", false, `{"reason": "why", "batch": {"maxRecords": 10}}`, nil, nil,
			"reason: it is recorded with a change of tables"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			st := snapshotStream(env, "t-0001")
			st.Snapshot, st.TablesChange = tt.snapshot, tt.change
			cfg := snapshotConfig(t)
			if tt.tabletd {
				cfg = streamConfig(t)
			}
			var cmds tabletCommands
			cmds.mock(env)
			var snaps snapshotSource
			snaps.mock(env, 0)
			var tabs tablesSource
			tabs.mock(env, time.Hour) // a change being made stays so
			var refused error
			env.RegisterDelayedCallback(func() {
				command(t, env, "update", CmdConfigure, tt.payload, func(err error) { refused = err })
			}, 5*time.Second)
			var status StreamStatus
			env.RegisterDelayedCallback(func() { status = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 7*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, cfg, st)

			require.Error(t, refused)
			require.Contains(t, refused.Error(), tt.want)
			if tt.change == nil {
				require.Empty(t, tabs.calls(), "nothing asked of the source")
				require.Nil(t, status.TablesChange)
			} else {
				require.Equal(t, tt.change.ID, status.TablesChange.ID, "the last change as it was")
			}
			require.Zero(t, configured(&cmds), "no tablet told")
		})
	}
}

// The kinds that can change a running stream's tables.
func TestPostgresSourcesCanChangeTablesTabletdOnesCannot(t *testing.T) {
	require.True(t, config.SourceKinds()["postgres"].TableChange)
	require.False(t, config.SourceKinds()["tabletd"].TableChange)
	require.False(t, config.SourceKinds()["vitess"].TableChange)
}

// A change the source cannot make (a shard down: retried, Publishing) is
// replaced by a new list, even one equal to the tables it changed from:
// the source is told the new list (the shards the first one changed are
// put back), and it is Done; the replaced change's late answer changes
// nothing.
func TestANewListReplacesAChangeTheSourceCannotMake(t *testing.T) {
	env := newEnv(t)
	st := snapshotStream(env, "t-0001")
	var cmds tabletCommands
	cmds.mock(env)
	var snaps snapshotSource
	snaps.mock(env, 0)
	tabs := tablesSource{down: "public.stuck"}
	tabs.mock(env, 0)
	env.RegisterDelayedCallback(func() {
		command(t, env, "update", CmdConfigure, `{"source": {"tables": ["public.orders", "public.items", "public.stuck"]}}`, func(err error) { require.NoError(t, err) })
	}, 5*time.Second)
	var stuck, back StreamStatus
	env.RegisterDelayedCallback(func() {
		stuck = queryStatus[StreamStatus](t, env)
		secondUpdate(t, env, `{"source": {"tables": ["public.orders", "public.items"]}, "reason": "put it back"}`)
	}, 2*time.Minute)
	env.RegisterDelayedCallback(func() { back = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 3*time.Minute)
	env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

	require.Equal(t, "tables-1", stuck.TablesChange.ID)
	require.Equal(t, TablesPublishing, stuck.TablesChange.State, "a shard down: retried")
	tc := back.TablesChange
	require.Equal(t, "tables-2", tc.ID)
	require.Equal(t, TablesDone, tc.State)
	require.Equal(t, []string{"public.orders", "public.items"}, tc.From, "from the tables read: the replaced change never was Done")
	require.Empty(t, tc.Added)
	require.Empty(t, tc.Backfill)
	calls := tabs.calls()
	last := calls[len(calls)-1]
	require.Equal(t, []string{"public.orders", "public.items"}, last.Tables, "the source is told the list again")
	require.True(t, last.At.After(calls[0].At), "the newer change orders after the one it replaced at the source")
	require.Empty(t, snaps.calls())
}

// A change still being made when the stream continued as new is made by
// the next run, at once, with the time it was asked (which orders it at
// the source), and backfilled once made.
func TestARunMakesTheChangeItsStateCarries(t *testing.T) {
	env := newEnv(t)
	st := snapshotStream(env, "t-0001")
	asked := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st.TablesSeq = 1
	st.TablesChange = &TablesChange{ID: "tables-1", From: []string{"public.orders", "public.items"},
		Tables: []string{"public.orders", "public.items", "public.extra"}, Added: []string{"public.extra"}, State: TablesPublishing, Asked: asked}
	var cmds tabletCommands
	cmds.mock(env)
	var snaps snapshotSource
	snaps.mock(env, 0)
	var tabs tablesSource
	tabs.mock(env, 0)
	var status StreamStatus
	env.RegisterDelayedCallback(func() { status = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 5*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, snapshotConfig(t), st)

	calls := tabs.calls()
	require.Len(t, calls, 1)
	require.True(t, calls[0].At.Equal(asked), "the change keeps the time it was asked: %v", calls[0].At)
	require.Equal(t, TablesDone, status.TablesChange.State)
	require.Equal(t, "snapshot-1", status.TablesChange.Backfill)
	require.Equal(t, []string{"public.extra"}, status.Snapshot.Tables)
}
