package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/workflows"
)

// A running tablet's heartbeat past the status shows live; one that is
// not (a run that just reported) leaves the status's figures; a
// Streaming tablet whose running attempt has not committed for over
// stallAfter is stalled, whether its checkpoint is shown live or not;
// not an attempt waiting for its retry, nor a retry that has not
// committed yet.
func TestWithLiveShowsHeartbeatsPastTheStatusAndFlagsAStalledRun(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	cp := func(i uint64) source.Checkpoint { return source.Checkpoint{Term: 1, Index: i} }
	st := workflows.StreamStatus{Stream: "orders", Tablets: []workflows.TabletStatus{
		{ID: "t1", State: workflows.Streaming, Checkpoint: cp(10), Records: 10},
		{ID: "t2", State: workflows.Streaming, Checkpoint: cp(10), Records: 10},
		{ID: "t3", State: workflows.Streaming, Checkpoint: cp(10), Records: 10},
		{ID: "t4", State: workflows.Retrying, Checkpoint: cp(10), Records: 10, Reason: "sink down"},
		{ID: "t5", State: workflows.Streaming, Checkpoint: cp(10)},
		{ID: "t6", State: workflows.Streaming, Checkpoint: cp(10)},
	}}
	runs := map[string]liveRun{
		"t1": {beat: activities.Heartbeat{Checkpoint: cp(25), Records: 15, LagSeconds: 0.5, LastSuccess: now.Add(-time.Second)}, at: now.Add(-2 * time.Second), started: true},
		"t2": {beat: activities.Heartbeat{Checkpoint: cp(10), LastSuccess: now.Add(-150 * time.Second)}, at: now.Add(-time.Second), started: true},
		"t3": {beat: activities.Heartbeat{Checkpoint: cp(12), Records: 2, LastSuccess: now.Add(-3 * time.Minute)}, at: now.Add(-time.Second), started: true},
		"t4": {beat: activities.Heartbeat{Checkpoint: cp(10), LastSuccess: now.Add(-time.Hour)}, at: now, started: true},
		"t5": {beat: activities.Heartbeat{Checkpoint: cp(10), LastSuccess: now.Add(-time.Hour)}, at: now.Add(-time.Hour)}, // waits for its retry
		"t6": {beat: activities.Heartbeat{Checkpoint: cp(10), LastSuccess: now.Add(-time.Hour), LastError: "unavailable"}, at: now, started: true},
	}
	got, age := withLive(st, runs, now)
	require.Equal(t, map[string]time.Duration{"t1": 2 * time.Second, "t3": time.Second}, age)
	t1 := got.Tablets[0]
	require.Equal(t, cp(25), t1.Checkpoint)
	require.Equal(t, int64(25), t1.Records)
	require.Equal(t, 0.5, t1.LagSeconds)
	require.Empty(t, t1.Reason)
	require.Equal(t, cp(10), got.Tablets[1].Checkpoint, "not past the status: its own figures")
	require.Equal(t, stalledReason(150*time.Second), got.Tablets[1].Reason)
	require.Equal(t, stalledReason(3*time.Minute), got.Tablets[2].Reason)
	require.Equal(t, "sink down", got.Tablets[3].Reason, "only a Streaming tablet is stalled: the others say why already")
	require.Empty(t, got.Tablets[4].Reason, "an attempt waiting for its retry is not stalled")
	require.Empty(t, got.Tablets[5].Reason, "a retry that has not committed yet is not stalled")
	require.Equal(t, cp(10), st.Tablets[0].Checkpoint, "the status given is left alone")
}
