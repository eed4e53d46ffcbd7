package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// errTransient is a report signal failing for a reason other than the
// stream being gone (a timeout, the stream's signal limit).
var errTransient = errors.New("context deadline exceeded")

// reportTablet sets up tablet t-0001 of stream "orders" on one replica,
// whose GetChanges runs for run and ends well (run 0: fails with a
// record the sink cannot write, so the tablet ends Failed); answer gives
// each report signal's outcome, and the reports are recorded with the
// (test) time they were sent.
type reportTablet struct {
	mu     sync.Mutex
	sent   []TabletStatus
	at     []time.Time
	runs   int
	answer func(r TabletStatus) error
}

func (rt *reportTablet) mock(env *testsuite.TestWorkflowEnvironment, run time.Duration) {
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 2}, nil)
	getChanges := env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			rt.mu.Lock()
			rt.runs++
			rt.mu.Unlock()
			if run == 0 {
				return activities.GetChangesResult{}, nonRetryable(activities.ErrSinkFailed, "jsonl: bad record")
			}
			return activities.GetChangesResult{Checkpoint: cp(in.Checkpoint.Index + 10), Records: 10, Batches: 1, Stopped: activities.StoppedRunEnded}, nil
		})
	if run > 0 {
		getChanges.After(run)
	}
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(
		func(_, _, _, _ string, arg any) error {
			r := arg.(TabletStatus)
			rt.mu.Lock()
			rt.sent, rt.at = append(rt.sent, r), append(rt.at, env.Now())
			rt.mu.Unlock()
			return rt.answer(r)
		}).Maybe()
}

// inState returns when the reports in state st were sent.
func (rt *reportTablet) inState(st State) []time.Time {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var at []time.Time
	for i, r := range rt.sent {
		if r.State == st {
			at = append(at, rt.at[i])
		}
	}
	return at
}

// A report that finds the stream closed ("unknown external workflow
// execution") ends the tablet: it completes without an error, at its next
// report, instead of streaming on for a stream that is gone.
func TestTabletEndsWhenItsReportFindsTheStreamGone(t *testing.T) {
	env := newEnv(t)
	rt := &reportTablet{answer: func(TabletStatus) error { return &temporal.UnknownExternalWorkflowExecutionError{} }}
	rt.mock(env, time.Minute)
	env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Minute)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError(), "the tablet ends by itself, before it is cancelled at 10 minutes")
	// The failed report is seen when the next is due (a minute later) and
	// the run loop ends at the report after that: two runs at most.
	require.LessOrEqual(t, rt.runs, 2)
	require.Len(t, rt.sent, 1, "nothing more is sent to a stream that is gone")
}

// A report lost to any other error does not end the tablet: it marks the
// status to be sent again, and that mark rides across continue-as-new
// (TabletState.Resend).
func TestTabletReportLostToATransientErrorIsSentAgainNotTheEnd(t *testing.T) {
	env := newEnv(t)
	rt := &reportTablet{answer: func(r TabletStatus) error {
		if r.Seq == 1 { // the first report is lost
			return errTransient
		}
		return nil
	}}
	rt.mock(env, 10*time.Second)
	// Noticed after the first run: the run loop waits for every report
	// before continuing as new.
	env.RegisterDelayedCallback(func() { env.SetContinueAsNewSuggested(true) }, 5*time.Second)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "the tablet goes on (continues as new), it does not end: %v", env.GetWorkflowError())
	var in TabletInput
	var st *TabletState
	require.NoError(t, decodeArgs(can, &in, &st))
	require.True(t, st.Resend, "the lost report is sent again by the next run")
	require.Equal(t, cp(10), st.Checkpoint)
	require.Len(t, rt.sent, 1)
}

// A run that carries a lost report (Resend) sends its status at its start;
// one that does not stays quiet (changeQuietStart) until a report is due.
func TestTabletRunCarryingALostReportSendsItAtItsStart(t *testing.T) {
	start := time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC)
	for _, resend := range []bool{true, false} {
		t.Run(fmt.Sprintf("resend=%v", resend), func(t *testing.T) {
			env := newEnv(t)
			env.SetStartTime(start)
			rt := &reportTablet{answer: func(TabletStatus) error { return nil }}
			rt.mock(env, time.Minute)
			env.RegisterDelayedCallback(env.CancelWorkflow, 30*time.Second)
			// The status as the last run left it: streaming on the replica
			// the next run selects again, so the run itself changes nothing.
			st := &TabletState{Checkpoint: cp(10), Selected: true, Intents: true, LastReport: start, Resend: resend,
				Status: TabletStatus{ID: "t-0001", State: Streaming, Replica: "zone1-0000000101", Checkpoint: cp(10), Seq: 1}}
			env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, st)

			if !resend {
				require.Empty(t, rt.sent)
				return
			}
			require.Len(t, rt.sent, 1)
			require.WithinDuration(t, start, rt.at[0], time.Second, "sent at the run's start")
			require.Equal(t, int64(2), rt.sent[0].Seq)
		})
	}
}

// A terminal report (a stop, a Failed run) is the stream's only word of
// how the tablet ended: one lost to a transient error is sent again, a
// second, 2, 4, 8 s apart, finalReportTries times in all, and then the
// tablet ends anyway (the stream's reconcile reads the closed workflow).
// One that finds the stream gone is not sent again.
func TestTabletTerminalReportIsRetriedABoundedNumberOfTimes(t *testing.T) {
	tests := []struct {
		name string
		end  State
		// fail answers the n-th terminal report (from 1).
		fail func(n int) error
		sent int
	}{
		{"stop, never delivered", Stopped, func(int) error { return errTransient }, finalReportTries},
		{"failed run, never delivered", Failed, func(int) error { return errTransient }, finalReportTries},
		{"failed run, delivered at the third try", Failed, func(n int) error {
			if n < 3 {
				return errTransient
			}
			return nil
		}, 3},
		{"stop, the stream gone", Stopped, func(int) error { return &temporal.UnknownExternalWorkflowExecutionError{} }, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			terminalSent := 0
			rt := &reportTablet{answer: func(r TabletStatus) error {
				if !terminal(r.State) {
					return nil
				}
				terminalSent++
				return tt.fail(terminalSent)
			}}
			run := time.Duration(0) // a Failed run
			if tt.end == Stopped {
				run = time.Minute
				env.RegisterDelayedCallback(func() { env.SignalWorkflow(SignalTabletCommand, TabletCommand{Kind: CmdStop}) }, 30*time.Second)
			}
			rt.mock(env, run)
			env.RegisterDelayedCallback(env.CancelWorkflow, time.Hour)
			env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1}, (*TabletState)(nil))

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError(), "the tablet ends by itself")
			require.Equal(t, tt.end, queryStatus[TabletStatus](t, env).State)
			at := rt.inState(tt.end)
			require.Len(t, at, tt.sent, "terminal reports sent")
			for i := 1; i < len(at); i++ {
				require.Equal(t, minBackoff<<(i-1), at[i].Sub(at[i-1]), "try %d: backed off", i+1)
			}
		})
	}
}

// A command to every tablet of a stream of more than fanOutWave tablets
// reaches each of them once, with never more than fanOutWave signals
// outstanding.
//
// The 1200 tablets are rows of the StreamState the stream starts with (and
// its topology lists them), so no child workflow is started: the test
// environment runs each mocked child in the test's process, and 1200 of
// them made it slow. The test environment calls a mocked
// SignalExternalWorkflow in a goroutine of its own as soon as the workflow
// sends the signal, and completes the signal's future when the mock
// returns, so a mock that has been called and has not returned is a signal
// outstanding. Each call waits (up to a moment) for more than fanOutWave
// calls to be outstanding together: with waves they never are, and each
// wave is released by the wait's end; without waves all 1200 are called
// at once and the count passes fanOutWave.
func TestStreamFansACommandOutToManyTabletsInWaves(t *testing.T) {
	const tablets = 1200
	// The server's default limit of pending signals per workflow, which
	// the waves keep under; and the test needs more than one wave.
	const pendingSignalsLimit = 2000
	require.Less(t, fanOutWave, pendingSignalsLimit)
	require.Greater(t, tablets, 2*fanOutWave)
	env := newEnv(t)
	rows := map[string]*TabletStatus{}
	var listed []source.Tablet
	for i := 1; i <= tablets; i++ {
		id := fmt.Sprintf("t-%04d", i)
		rows[id] = &TabletStatus{ID: id, State: Streaming, Replica: "zone1-0000000101", Checkpoint: cp(7), Seq: 1}
		listed = append(listed, source.Tablet{ID: id})
	}
	w := &streamWith{lists: [][]source.Tablet{listed}}
	w.mock(env)

	var mu sync.Mutex
	got := map[string]int{}
	outstanding, most := 0, 0
	over := make(chan struct{}) // closed once more than fanOutWave are outstanding
	env.OnSignalExternalWorkflow(mock.Anything, mock.Anything, "", SignalTabletCommand, mock.Anything).Return(
		func(_, id, _, _ string, arg any) error {
			mu.Lock()
			if arg.(TabletCommand).Kind == CmdPause {
				got[id]++
			}
			outstanding++
			most = max(most, outstanding)
			if outstanding == fanOutWave+1 {
				close(over)
			}
			mu.Unlock()
			select {
			case <-over:
			case <-time.After(300 * time.Millisecond):
			}
			mu.Lock()
			outstanding--
			mu.Unlock()
			return nil
		})
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdPause, json.RawMessage(`{}`)) }, 5*time.Second)
	env.RegisterDelayedCallback(env.CancelWorkflow, 8*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), &StreamState{Tablets: rows})

	mu.Lock()
	defer mu.Unlock()
	t.Logf("at most %d signals outstanding", most)
	require.Equal(t, tablets, len(got), "every tablet got the pause")
	for id, n := range got {
		require.Equal(t, 1, n, "%s: exactly one signal", id)
	}
	require.LessOrEqual(t, most, fanOutWave, "at most fanOutWave signals outstanding at once")
}

func TestCompactDropsExclusionsAndErrorsOfEndedTabletsOnly(t *testing.T) {
	excluded := config.ExcludeList{{Alias: "zone1-0000000101", Tablet: "t-0001", Reason: "RETRIES_EXHAUSTED"}}
	tests := []struct {
		state State
		keep  bool
	}{
		// The tablet's workflow has ended: its row keeps what the status
		// shows, not what it was working around.
		{Split, false},
		{Expired, false},
		{Failed, false},
		{Stopped, false},
		// Running (or to be restarted): the exclusions and the last error
		// still matter.
		{Starting, true},
		{Streaming, true},
		{Retrying, true},
		{NoEligibleReplica, true},
		{Paused, true},
		{Stuck, true},
	}
	for _, tt := range tests {
		t.Run(string(tt.state), func(t *testing.T) {
			row := TabletStatus{ID: "t-0001", State: tt.state, Reason: "why", Replica: "zone1-0000000102", Checkpoint: cp(40),
				Records: 40, LastError: "UNAVAILABLE: replica gone", Excluded: excluded,
				Children: []string{"t-0002", "t-0003"}, Handoff: cp(40), Restarts: 2, Seq: 9}
			s := &stream{st: &StreamState{Tablets: map[string]*TabletStatus{"t-0001": &row}}}
			s.compact()
			want := row
			want.Excluded, want.LastError = excluded, "UNAVAILABLE: replica gone"
			if !tt.keep {
				want.Excluded, want.LastError = nil, ""
			}
			require.Equal(t, want, *s.st.Tablets["t-0001"], "the rest of the row is kept")
		})
	}
}

func TestClipBoundsTextOnARuneBoundary(t *testing.T) {
	tests := []struct {
		name, s, want string
	}{
		{"short", "UNAVAILABLE: replica gone", "UNAVAILABLE: replica gone"},
		{"exactly the bound", strings.Repeat("a", maxText), strings.Repeat("a", maxText)},
		{"one byte over", strings.Repeat("a", maxText+1), strings.Repeat("a", maxText) + "…"},
		// Two-byte runes ending on the bound.
		{"cut between runes", strings.Repeat("é", 300), strings.Repeat("é", maxText/2) + "…"},
		// The bound falls inside a two-byte rune: it goes whole.
		{"cut inside a rune", "a" + strings.Repeat("é", 300), "a" + strings.Repeat("é", (maxText-1)/2) + "…"},
		// Four-byte runes, the bound inside one.
		{"cut inside a long rune", "ab" + strings.Repeat("😀", 200), "ab" + strings.Repeat("😀", (maxText-2)/4) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := clip(tt.s)
			require.Equal(t, tt.want, got)
			require.True(t, utf8.ValidString(got))
			require.LessOrEqual(t, len(strings.TrimSuffix(got, "…")), maxText)
		})
	}
}

// The state a stream continues as new with holds compacted rows: an
// ended tablet without its exclusions and last error, a running one with
// them, and its last error clipped.
func TestStreamContinuesAsNewWithCompactedRows(t *testing.T) {
	env := newEnv(t)
	w := &streamWith{lists: [][]source.Tablet{{{ID: "t-0001"}, {ID: "t-0002"}}}}
	w.mock(env)
	var started startedTablets
	started.mock(env)
	excluded := config.ExcludeList{{Alias: "zone1-0000000101", Tablet: "t-0001", Reason: "RETRIES_EXHAUSTED"}}
	long := strings.Repeat("UNAVAILABLE: replica gone; ", 100)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: Failed, Reason: "sink: SINK_CORRUPT", Checkpoint: cp(77),
			LastError: long, Excluded: excluded, Seq: 5, Updated: env.Now()})
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0002", State: Retrying, Checkpoint: cp(50),
			LastError: long, Excluded: excluded, Seq: 5, Updated: env.Now()})
	}, 5*time.Second)
	env.RegisterDelayedCallback(func() {
		env.SetContinueAsNewSuggested(true)
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0002", State: Retrying, Checkpoint: cp(50),
			LastError: long, Excluded: excluded, Seq: 6, Updated: env.Now()})
	}, 6*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))

	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "%v", env.GetWorkflowError())
	var raw json.RawMessage
	var st *StreamState
	require.NoError(t, decodeArgs(can, &raw, &st))
	ended, running := st.Tablets["t-0001"], st.Tablets["t-0002"]
	require.NotNil(t, ended)
	require.NotNil(t, running)
	require.Empty(t, ended.LastError)
	require.Empty(t, ended.Excluded)
	require.Equal(t, "sink: SINK_CORRUPT", ended.Reason, "an ended tablet keeps why it ended")
	require.Equal(t, cp(77), ended.Checkpoint)
	require.Equal(t, excluded, running.Excluded)
	require.Equal(t, clip(long), running.LastError)
	require.Less(t, len(running.LastError), len(long))
}
