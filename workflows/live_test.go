package workflows

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/source"
)

// A running tablet's heartbeat past the status shows live; one that is
// not (a run that just reported) leaves the status's figures; a
// Streaming tablet whose running attempt had not committed for over
// StallAfter when its heartbeat came is stalled, whether its checkpoint
// is shown live or not; not an attempt waiting for its retry, nor a retry
// that has not committed yet.
func TestWithLiveShowsHeartbeatsPastTheStatusAndFlagsAStalledRun(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	cp := func(i uint64) source.Checkpoint { return source.Checkpoint{Term: 1, Index: i} }
	st := StreamStatus{Stream: "orders", Tablets: []TabletStatus{
		{ID: "t1", State: Streaming, Checkpoint: cp(10), Records: 10, Batches: 2},
		{ID: "t2", State: Streaming, Checkpoint: cp(10), Records: 10, Reason: "on a fallback replica"},
		{ID: "t3", State: Streaming, Checkpoint: cp(10), Records: 10},
		{ID: "t4", State: Retrying, Checkpoint: cp(10), Records: 10, Reason: "sink down"},
		{ID: "t5", State: Streaming, Checkpoint: cp(10)},
		{ID: "t6", State: Streaming, Checkpoint: cp(10)},
		{ID: "t7", State: Streaming, Checkpoint: cp(10)},
		{ID: "t8", State: Streaming, Checkpoint: cp(20)},
		{ID: "t9", State: Paused, Checkpoint: cp(5)},
	}}
	figures := []activities.LiveFigures{
		{Tablet: "t1", Checkpoint: cp(25), Records: 15, Batches: 3, LagSeconds: 0.5, LastCommit: now.Add(-time.Second), At: now.Add(-2 * time.Second), Running: true},
		{Tablet: "t2", Checkpoint: cp(10), LastCommit: now.Add(-150 * time.Second), At: now, Running: true},
		{Tablet: "t3", Checkpoint: cp(12), Records: 2, LastCommit: now.Add(-3 * time.Minute), At: now.Add(-time.Second), Running: true},
		{Tablet: "t4", Checkpoint: cp(10), LastCommit: now.Add(-time.Hour), At: now, Running: true},
		{Tablet: "t5", Checkpoint: cp(10), LastCommit: now.Add(-time.Hour), At: now}, // waits for its retry
		{Tablet: "t6", Checkpoint: cp(10), LastCommit: now.Add(-time.Hour), At: now, Running: true, Failing: true},
		// Its last heartbeat came a second after its last commit, an hour
		// ago (its worker went away): not stalled.
		{Tablet: "t7", Checkpoint: cp(10), LastCommit: now.Add(-time.Hour), At: now.Add(-time.Hour + time.Second), Running: true},
		// A read from before its run reported (and a new run began).
		{Tablet: "t8", Checkpoint: cp(15), LastCommit: now.Add(-time.Hour), At: now, Running: true},
		// Read while it ran; paused since.
		{Tablet: "t9", Checkpoint: cp(9), At: now, Running: true, LastCommit: now},
	}
	got := WithLive(st, figures)
	t1 := got.Tablets[0]
	require.Equal(t, cp(25), t1.Checkpoint)
	require.Equal(t, int64(25), t1.Records)
	require.Equal(t, int64(5), t1.Batches)
	require.Equal(t, 0.5, t1.LagSeconds)
	require.Equal(t, &LiveRow{At: now.Add(-2 * time.Second), Records: 15, Batches: 3}, t1.Live)
	require.Empty(t, t1.Reason)
	require.Equal(t, cp(10), got.Tablets[1].Checkpoint, "not past the status: its own figures")
	require.Nil(t, got.Tablets[1].Live)
	require.Equal(t, StalledReason(150*time.Second, "on a fallback replica"), got.Tablets[1].Reason)
	require.Equal(t, StalledReason(179*time.Second, ""), got.Tablets[2].Reason)
	require.NotNil(t, got.Tablets[2].Live)
	require.Equal(t, "sink down", got.Tablets[3].Reason, "only a Streaming tablet is stalled: the others say why already")
	require.Empty(t, got.Tablets[4].Reason, "an attempt waiting for its retry is not stalled")
	require.Empty(t, got.Tablets[5].Reason, "a retry that has not committed yet is not stalled")
	require.Empty(t, got.Tablets[6].Reason, "judged at its last heartbeat, not now")
	require.Empty(t, got.Tablets[7].Reason, "a read older than the row judges nothing")
	require.Equal(t, cp(20), got.Tablets[7].Checkpoint)
	require.Equal(t, cp(5), got.Tablets[8].Checkpoint, "a tablet whose runs ended shows its report")
	require.Nil(t, got.Tablets[8].Live)
	require.Equal(t, cp(10), st.Tablets[0].Checkpoint, "the status given is left alone")

	// A status query's answer is live already (the stream's last read);
	// a later read of the same run counts from what the tablet reported,
	// not from the live figures again, and keeps the row's rate; a run
	// that commits again is no longer stalled.
	got.Tablets[0].Live.RecordsPerSecond = 7.5
	later := WithLive(got, []activities.LiveFigures{
		{Tablet: "t1", Checkpoint: cp(40), Records: 30, Batches: 6, At: now, Running: true, LastCommit: now},
		{Tablet: "t2", Checkpoint: cp(11), Records: 1, Batches: 1, At: now, Running: true, LastCommit: now},
	})
	require.Equal(t, cp(40), later.Tablets[0].Checkpoint)
	require.Equal(t, int64(40), later.Tablets[0].Records, "10 reported + 30 of the run")
	require.Equal(t, int64(8), later.Tablets[0].Batches, "2 reported + 6 of the run")
	require.Equal(t, 7.5, later.Tablets[0].Live.RecordsPerSecond)
	require.Equal(t, "on a fallback replica", later.Tablets[1].Reason, "committed since: not stalled any more")
	// An older read leaves the row as it is.
	same := WithLive(later, figures[:1])
	require.Equal(t, later.Tablets[0], same.Tablets[0])

	// A run told what its tablet had counted before it (its last run may
	// have ended unreported) shows the tablet's totals.
	withTotals := WithLive(st, []activities.LiveFigures{
		{Tablet: "t1", Checkpoint: cp(90), Records: 30, Batches: 6, At: now, Running: true, LastCommit: now,
			Totals: &activities.Counted{Records: 80, Batches: 20}},
	})
	require.Equal(t, int64(80), withTotals.Tablets[0].Records, "not the report's 10 + the run's 30")
	require.Equal(t, int64(20), withTotals.Tablets[0].Batches)
	require.Equal(t, withTotals.Tablets[0], WithLive(withTotals, []activities.LiveFigures{
		{Tablet: "t1", Checkpoint: cp(90), Records: 30, Batches: 6, At: now, Running: true, LastCommit: now,
			Totals: &activities.Counted{Records: 80, Batches: 20}},
	}).Tablets[0], "applied twice, the same")
}

// The stream reads its running tablets' figures every statusRefresh, or
// 30 ms per running tablet where that is longer.
func TestLiveEveryGrowsWithTheRunningTablets(t *testing.T) {
	require.Equal(t, 3*time.Second, liveEvery(3*time.Second, 1))
	require.Equal(t, 3*time.Second, liveEvery(3*time.Second, 100))
	require.Equal(t, 30*time.Second, liveEvery(3*time.Second, 1000))
}

// The stream reads its running tablets' live figures every
// statusRefresh: its status query shows a Streaming tablet's checkpoint
// and records moving between its reports, with a rate, and its memo
// holds the stream's totals; a read that misses a tablet leaves it the
// figures it had; a tablet that is not running is not read.
func TestStreamStatusAndMemoShowTheRunningTabletsLiveFigures(t *testing.T) {
	env := newEnv(t)
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil)
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(activities.TopologyOf([]source.Tablet{{ID: "t-0001"}, {ID: "t-0002"}, {ID: "t-0003"}}), nil)
	env.OnActivity(a.CheckTablets, mock.Anything, mock.Anything).Return(nil, nil).Maybe()
	var started startedTablets
	started.mock(env)
	reads := 0
	var asked [][]string
	env.OnActivity(a.ReadLiveFigures, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.ReadLiveInput) ([]activities.LiveFigures, error) {
			reads++
			asked = append(asked, in.Tablets)
			require.Equal(t, "orders/tablet/", in.WorkflowPrefix)
			if reads%2 == 0 {
				return nil, nil // its describe failed: the figures it had stay
			}
			n := int64(reads) * 30 // 10 records a second
			return []activities.LiveFigures{{Tablet: "t-0001", Checkpoint: cp(uint64(10 + n)), Records: n, Batches: int64(reads),
				LastCommit: env.Now(), At: env.Now(), Running: true},
				// Heartbeating, its last commit three minutes before: stalled.
				{Tablet: "t-0003", Checkpoint: cp(3), LastCommit: env.Now().Add(-3 * time.Minute), At: env.Now(), Running: true}}, nil
		})
	var memos []LiveTotals
	env.OnUpsertMemo(mock.Anything).Run(func(args mock.Arguments) {
		if l, ok := args.Get(0).(map[string]any)[MemoLive]; ok {
			memos = append(memos, *l.(*LiveTotals))
		}
	}).Return(nil)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Streaming, Checkpoint: cp(10), Records: 10, Seq: 1})
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0002", State: Paused, Checkpoint: cp(5), Records: 5, Seq: 1})
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0003", State: Streaming, Checkpoint: cp(3), Records: 3, Seq: 1})
	}, time.Second)
	var first, second StreamStatus
	query := func(into *StreamStatus) {
		v, err := env.QueryWorkflow(QueryStatus)
		require.NoError(t, err)
		require.NoError(t, v.Get(into))
	}
	env.RegisterDelayedCallback(func() { query(&first) }, 10*time.Second)
	env.RegisterDelayedCallback(func() { query(&second) }, 20*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 21*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, json.RawMessage(goodConfig), (*StreamState)(nil))

	require.GreaterOrEqual(t, reads, 5, "read every statusRefresh (3 s)")
	for _, ids := range asked {
		require.Equal(t, []string{"t-0001", "t-0003"}, ids, "only the running tablets are read")
	}
	t1 := second.Tablets[0]
	require.Equal(t, Streaming, t1.State)
	require.Equal(t, 1, first.Tablets[0].Checkpoint.Compare(cp(10)), "past the tablet's report: %v", first.Tablets[0].Checkpoint)
	require.Equal(t, 1, t1.Checkpoint.Compare(first.Tablets[0].Checkpoint), "moving between two queries with no report")
	require.NotNil(t, t1.Live)
	require.Equal(t, t1.Records, 10+t1.Live.Records)
	require.InDelta(t, 10, t1.Live.RecordsPerSecond, 0.01)
	require.Nil(t, second.Tablets[1].Live, "a Paused tablet keeps its reported figures")
	require.NotNil(t, second.Live)
	require.Equal(t, t1.Records+5+3, second.Live.Records, "t-0001 live, t-0002 and t-0003 as reported")
	require.InDelta(t, 10, second.Live.RecordsPerSecond, 0.01)
	require.NotEmpty(t, memos)
	last := memos[len(memos)-1]
	require.Equal(t, second.Live.Records, last.Records, "the memo has the stream's totals")
	require.Equal(t, 1, last.Stalled, "t-0003 is stalled")
	require.Equal(t, 1, second.Live.Stalled)
	require.Equal(t, StalledReason(3*time.Minute, ""), second.Tablets[2].Reason)
}
