package workflows

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
)

var paceT0 = time.Date(2026, 12, 1, 7, 0, 0, 123456789, time.UTC)

func TestPaceDelayBelowASecondReportsAtOnceOncePerWindow(t *testing.T) {
	w := 240 * time.Millisecond // 24 tablets at 100 reports/s
	require.Zero(t, paceDelay("t-0001", w, time.Time{}, paceT0), "first report: at once")
	require.Zero(t, paceDelay("t-0001", w, paceT0.Add(-w), paceT0), "a window after the last: at once")
	require.Equal(t, 140*time.Millisecond, paceDelay("t-0001", w, paceT0.Add(-100*time.Millisecond), paceT0),
		"sooner: when the window since the last is over")
}

func TestPaceDelayKeepsEachTabletToItsOwnSlot(t *testing.T) {
	w := 50 * time.Second // 5000 tablets at 100 reports/s
	for _, id := range []string{"t-0001", "t-0002", "t-4999"} {
		d := paceDelay(id, w, time.Time{}, paceT0)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.Less(t, d, w, "%s: within one window", id)
		sent := paceT0.Add(d)
		// Whenever the next change comes, the report goes out in the same
		// slot of a later window, never sooner than half a window after.
		for _, after := range []time.Duration{0, time.Millisecond, 3 * time.Second, 26 * time.Second, 49 * time.Second, 80 * time.Second} {
			now := sent.Add(after)
			next := now.Add(paceDelay(id, w, sent, now))
			require.GreaterOrEqual(t, next.Sub(sent), w/2, "%s, change %v after a report", id, after)
			require.Zero(t, next.Sub(sent)%w, "%s: same slot, whole windows later (%v)", id, next.Sub(sent))
		}
	}
	require.NotEqual(t, paceDelay("t-0001", w, time.Time{}, paceT0), paceDelay("t-0002", w, time.Time{}, paceT0),
		"tablets have slots of their own")
}

// When every tablet of a large stream changes state at the same instant
// (a pause of all), their reports spread over the window: the stream gets
// about reportRate a second, not 5000 at once.
func TestPacedReportsOfAMassStateChangeStayNearTheRate(t *testing.T) {
	for _, tablets := range []int{150, 1000, 5000} {
		t.Run(fmt.Sprint(tablets), func(t *testing.T) {
			rate := config.DefaultReportRate
			w := time.Duration(float64(tablets) / rate * float64(time.Second))
			perSecond := map[int64]int{}
			for i := 1; i <= tablets; i++ {
				d := paceDelay(fmt.Sprintf("t-%04d", i), w, time.Time{}, paceT0)
				require.Less(t, d, w)
				perSecond[int64(d/time.Second)]++
			}
			most := 0
			for _, n := range perSecond {
				most = max(most, n)
			}
			// Slots come from a hash: not exactly rate per second, but
			// within 1.5 × rate, where unpaced reports would all arrive in
			// the first second.
			require.LessOrEqual(t, most, int(1.5*rate), "reports in the busiest second")
			require.GreaterOrEqual(t, len(perSecond), int(w/time.Second)-1, "spread over the window")
		})
	}
}

// A tablet of a large stream that changes state many times (pause and
// resume every second) sends one report per window, carrying its latest
// state; its stop goes out in its slot and is confirmed before it ends.
func TestPacedTabletCoalescesStateChangesAndEndsWithItsReport(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 2}, nil)
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(ctx context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			return activities.GetChangesResult{Checkpoint: cp(in.Checkpoint.Index + 10), Records: 10, Batches: 1, Stopped: activities.StoppedRunEnded}, nil
		}).After(time.Second)
	type sent struct {
		at    time.Time
		state State
	}
	var reports []sent
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(
		func(_, _, _, _ string, arg any) error {
			reports = append(reports, sent{env.Now(), arg.(TabletStatus).State})
			return nil
		})
	cfg := mustConfig(t)
	cfg.ReportRate = 100
	const tablets = 2000 // a window of 20 s
	window := 20 * time.Second
	for i := 1; i <= 60; i++ {
		kind := CmdPause
		if i%2 == 0 {
			kind = CmdResume
		}
		env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalTabletCommand, TabletCommand{Kind: kind}) }, time.Duration(i)*time.Second)
	}
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalTabletCommand, TabletCommand{Kind: CmdStop}) }, 61*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: cfg, Tablets: tablets}, (*TabletState)(nil))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	require.NotEmpty(t, reports)
	// 121 state changes in 61 s; one report per window of 20 s.
	require.LessOrEqual(t, len(reports), 5, "reports: %v", reports)
	for i := 1; i < len(reports); i++ {
		require.GreaterOrEqual(t, reports[i].at.Sub(reports[i-1].at), window/2, "reports %d and %d too close: %v", i-1, i, reports)
	}
	require.Equal(t, Stopped, reports[len(reports)-1].state, "the last report is the stop")
}
