package workflows

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/source"
)

// What a tablet reports says whether it carried out what the operator
// asked of it; a report that contradicts the intent has the stream tell
// the tablet again.
func TestIntentIsContradictedByAReportOfARunningTablet(t *testing.T) {
	stop, pause, resume := intent{stop: true}, intent{pause: true}, intent{}
	tests := []struct {
		name  string
		i     intent
		state State
		want  bool
	}{
		// A stop: every state of a running tablet contradicts it.
		{"stop, streaming", stop, Streaming, true},
		{"stop, retrying", stop, Retrying, true},
		{"stop, no eligible replica", stop, NoEligibleReplica, true},
		{"stop, paused", stop, Paused, true},
		{"stop, stopped", stop, Stopped, false},
		// A stop of a paused tablet is a stop.
		{"stop and pause, paused", intent{stop: true, pause: true}, Paused, true},
		// A pause: a tablet that runs on contradicts it.
		{"pause, streaming", pause, Streaming, true},
		{"pause, retrying", pause, Retrying, true},
		{"pause, no eligible replica", pause, NoEligibleReplica, true},
		{"pause, paused", pause, Paused, false},
		// A resume (or no command): only a paused tablet contradicts it.
		{"resume, paused", resume, Paused, true},
		{"resume, streaming", resume, Streaming, false},
		{"resume, retrying", resume, Retrying, false},
		// Ended: nothing to tell (a Failed tablet is retried, Expired is
		// loud on its own).
		{"pause, expired", pause, Expired, false},
		{"pause, failed", pause, Failed, false},
		{"stop, split", stop, Split, false},
		{"resume, expired", resume, Expired, false},
		// A tablet just started reports the state it was given before it
		// has taken its commands; Stuck is the stream's word.
		{"pause, starting", pause, Starting, false},
		{"stop, starting", stop, Starting, false},
		{"pause, stuck", pause, Stuck, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.i.contradictedBy(tt.state))
		})
	}
	require.Equal(t, CmdStop, intent{stop: true, pause: true}.command())
	require.Equal(t, CmdPause, pause.command())
	require.Equal(t, CmdResume, resume.command())
}

// slowStarts makes a stream hear of its tablet workflows' starts late,
// one after another, as on a busy server fanning out hundreds of
// tablets: tablet ids[i] (i from 0) starts (i+1) × every after the
// stream asked for it. A command the stream signals a tablet before its
// start fails, as the server fails a signal to a workflow it does not
// know yet. The tablet workflows are fakes that record the commands they
// get, and when; a tablet told to stop ends.
type slowStarts struct {
	interceptor.WorkerInterceptorBase
	ids   []string
	every time.Duration
	env   *testsuite.TestWorkflowEnvironment

	mu      sync.Mutex
	started map[string]time.Time
	told    map[string][]toldAt
	failed  int // commands signalled to a tablet whose workflow did not exist yet
}

type toldAt struct {
	kind string
	at   time.Time
}

// newSlowStartsEnv is a test environment whose stream's tablets start
// slowly (see slowStarts).
func newSlowStartsEnv(t *testing.T, ids []string, every time.Duration) (*testsuite.TestWorkflowEnvironment, *slowStarts) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	s := &slowStarts{ids: ids, every: every, env: env, started: map[string]time.Time{}, told: map[string][]toldAt{}}
	env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{s}})
	env.RegisterActivity(a)
	env.RegisterWorkflow(StreamWorkflow)
	env.RegisterWorkflowWithOptions(s.tablet, workflow.RegisterOptions{Name: "TabletWorkflow"})
	env.SetStartWorkflowOptions(clientOptions("orders"))
	env.OnGetVersion(changeFirstPicks, workflow.DefaultVersion, 1).Return(workflow.DefaultVersion).Maybe()
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(nil).Maybe()
	t.Cleanup(func() { env.AssertExpectations(t) })
	return env, s
}

// tablet is the fake TabletWorkflow: it records the commands it gets and
// ends when told to stop.
func (s *slowStarts) tablet(ctx workflow.Context, in TabletInput, _ *TabletState) error {
	commands := workflow.GetSignalChannel(ctx, SignalTabletCommand)
	deadline := workflow.NewTimer(ctx, 5*time.Minute) // the test is over by then
	for {
		var cmd TabletCommand
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(commands, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, &cmd) })
		sel.AddFuture(deadline, func(workflow.Future) {})
		if sel.Select(ctx); deadline.IsReady() {
			return nil
		}
		s.mu.Lock()
		s.told[in.Tablet] = append(s.told[in.Tablet], toldAt{cmd.Kind, workflow.Now(ctx)})
		s.mu.Unlock()
		if cmd.Kind == CmdStop {
			return nil
		}
	}
}

func (s *slowStarts) InterceptWorkflow(ctx workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	if workflow.GetInfo(ctx).WorkflowType.Name != "StreamWorkflow" {
		return next
	}
	return &slowInbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}, s: s}
}

type slowInbound struct {
	interceptor.WorkflowInboundInterceptorBase
	s *slowStarts
}

func (i *slowInbound) Init(out interceptor.WorkflowOutboundInterceptor) error {
	return i.Next.Init(&slowOutbound{WorkflowOutboundInterceptorBase: interceptor.WorkflowOutboundInterceptorBase{Next: out}, s: i.s})
}

type slowOutbound struct {
	interceptor.WorkflowOutboundInterceptorBase
	s *slowStarts
}

// slowChild is a child workflow whose start the stream hears of late.
type slowChild struct {
	workflow.ChildWorkflowFuture
	started workflow.Future
}

func (c slowChild) GetChildWorkflowExecution() workflow.Future { return c.started }

func (o *slowOutbound) ExecuteChildWorkflow(ctx workflow.Context, typ string, args ...any) workflow.ChildWorkflowFuture {
	fut := o.Next.ExecuteChildWorkflow(ctx, typ, args...)
	in := args[0].(TabletInput)
	delay := time.Duration(slices.Index(o.s.ids, in.Tablet)+1) * o.s.every
	started, set := workflow.NewFuture(ctx)
	workflow.Go(ctx, func(ctx workflow.Context) {
		var exec workflow.Execution
		err := fut.GetChildWorkflowExecution().Get(ctx, &exec)
		_ = workflow.Sleep(ctx, delay)
		o.s.mu.Lock()
		o.s.started[in.Tablet] = workflow.Now(ctx)
		o.s.mu.Unlock()
		set.Set(exec, err)
	})
	return slowChild{fut, started}
}

func (o *slowOutbound) SignalExternalWorkflow(ctx workflow.Context, wid, rid, name string, arg any) workflow.Future {
	if name == SignalTabletCommand {
		o.s.mu.Lock()
		_, ok := o.s.started[strings.TrimPrefix(wid, "orders/tablet/")]
		if !ok {
			o.s.failed++
		}
		o.s.mu.Unlock()
		if !ok {
			f, set := workflow.NewFuture(ctx)
			set.SetError(errors.New("unknown external workflow execution: " + wid))
			return f
		}
	}
	return o.Next.SignalExternalWorkflow(ctx, wid, rid, name, arg)
}

// reportStopped makes every tablet told to stop report Stopped, as a
// tablet does after its final commit: looked at every second up to until.
func (s *slowStarts) reportStopped(until time.Duration) {
	reported := map[string]bool{}
	for at := time.Second; at <= until; at += time.Second {
		s.env.RegisterDelayedCallback(func() {
			s.mu.Lock()
			var due []string
			for _, id := range s.ids {
				for _, c := range s.told[id] {
					if c.kind == CmdStop && !reported[id] {
						reported[id] = true
						due = append(due, id)
					}
				}
			}
			s.mu.Unlock()
			for _, id := range due {
				s.env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: id, State: Stopped, Seq: 100, Updated: s.env.Now()})
			}
		}, at)
	}
}

// A stop sent while the stream is still starting its tablets (a fan-out
// of hundreds on a busy server takes a minute) reaches every tablet at
// once: a tablet whose workflow runs already at the stop hears of it
// within a second, one whose workflow starts later as soon as the stream
// hears that it started; and the stream completes within seconds of the
// last start. As a signal, the stop waited for the whole fan-out; as an
// update, it was lost for every tablet not started yet (a signal to it
// failed and was only logged) until a later topology refresh.
func TestAStopDuringFanOutReachesEveryTabletAtOnce(t *testing.T) {
	for _, how := range []string{"signal", "update"} {
		t.Run(how, func(t *testing.T) {
			ids := []string{"t-0001", "t-0002", "t-0003", "t-0004", "t-0005", "t-0006"}
			env, s := newSlowStartsEnv(t, ids, 10*time.Second)
			var listed []source.Tablet
			for _, id := range ids {
				listed = append(listed, source.Tablet{ID: id})
			}
			w := &streamWith{lists: [][]source.Tablet{listed}}
			w.mock(env)
			s.reportStopped(3 * time.Minute)
			env.SetTestTimeout(time.Minute)
			var stopAt time.Time
			env.RegisterDelayedCallback(func() {
				stopAt = env.Now()
				if how == "signal" {
					env.SignalWorkflow(CmdStop, json.RawMessage(`{}`))
					return
				}
				env.UpdateWorkflow(CmdStop, "s", &testsuite.TestUpdateCallback{
					OnReject: func(err error) { t.Errorf("stop rejected: %v", err) }, OnAccept: func() {}, OnComplete: func(any, error) {},
				}, json.RawMessage(`{}`))
			}, 15*time.Second)
			var doneAt time.Time
			env.RegisterDelayedCallback(func() {
				if !env.IsWorkflowCompleted() {
					env.CancelWorkflow()
				}
			}, 3*time.Minute)
			env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))
			doneAt = env.Now()

			s.mu.Lock()
			defer s.mu.Unlock()
			require.NoError(t, env.GetWorkflowError(), "the stream completes once every tablet stopped")
			last := stopAt
			for _, id := range ids {
				started, ok := s.started[id]
				require.True(t, ok, "%s started", id)
				var stops []time.Time
				for _, c := range s.told[id] {
					if c.kind == CmdStop {
						stops = append(stops, c.at)
					}
				}
				require.Len(t, stops, 1, "%s: told to stop once: %v", id, s.told[id])
				due := stopAt
				if started.After(due) {
					due = started
				}
				require.LessOrEqual(t, stops[0].Sub(due), 2*time.Second,
					"%s (started %v after the stream, stop at %v) told to stop at %v", id, started.Sub(stopAt), stopAt, stops[0])
				if started.After(last) {
					last = started
				}
			}
			require.Zero(t, s.failed, "no command sent to a workflow that did not exist yet")
			require.LessOrEqual(t, doneAt.Sub(last), 5*time.Second, "the stream completes within seconds of the last start")
		})
	}
}

// A pause or a resume sent to a tablet whose workflow had closed (the
// signal fails) is kept by the stream: the reconcile restarts the tablet
// with the operator's intent, not with the state its row last showed. A
// resume was lost so: the tablet restarted paused and could run into
// Expired.
func TestAPauseOrResumeOfATabletWhoseWorkflowClosedIsKeptForItsRestart(t *testing.T) {
	for _, tt := range []struct {
		cmd   string
		row   State
		pause bool
	}{
		{CmdPause, Streaming, true},
		{CmdResume, Paused, false},
	} {
		t.Run(tt.cmd, func(t *testing.T) {
			env := newEnv(t)
			w := &streamWith{
				lists: [][]source.Tablet{{{ID: "t-0001"}}},
				// Found closed at the first refresh after the command.
				closed: [][]activities.ClosedTablet{nil, {{Tablet: "t-0001", Status: "Terminated"}}},
			}
			w.mock(env)
			var r tabletRunner
			r.mock(env)
			env.OnSignalExternalWorkflow(mock.Anything, mock.Anything, "", SignalTabletCommand, mock.Anything).Return(
				errors.New("unknown external workflow execution")).Maybe()
			row := &TabletStatus{ID: "t-0001", State: tt.row, Replica: "zone1-0000000101", Checkpoint: cp(7), Seq: 3, Updated: env.Now()}
			if tt.row == Paused {
				row.PausedAt = env.Now()
			}
			st := &StreamState{Tablets: map[string]*TabletStatus{"t-0001": row}, Aliases: []string{"zone1-0000000101"}}
			env.RegisterDelayedCallback(func() { env.SignalWorkflow(tt.cmd, json.RawMessage(`{"tablets": ["t-0001"]}`)) }, 5*time.Second)
			env.RegisterDelayedCallback(env.CancelWorkflow, 15*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), st)

			r.mu.Lock()
			defer r.mu.Unlock()
			require.Len(t, r.states, 1, "restarted once")
			require.Equal(t, tt.pause, r.states[0].Pause, "restarted with the operator's %s", tt.cmd)
		})
	}
}

// A report that contradicts what the operator asked of a tablet (it
// streams after a pause or a stop, it is paused after a resume) has the
// stream tell the tablet again: the command was lost on its way, or came
// before the tablet could take it.
func TestAReportThatContradictsAnIntentHasTheStreamTellItAgain(t *testing.T) {
	for _, tt := range []struct {
		name     string
		row      State
		cmd      string
		reported State
		told     int
	}{
		{"streaming after a pause", Streaming, CmdPause, Streaming, 2},
		{"paused after a resume", Paused, CmdResume, Paused, 2},
		{"streaming after a stop", Streaming, CmdStop, Streaming, 2},
		{"retrying after a pause", Streaming, CmdPause, Retrying, 2},
		// Reports that agree: told once.
		{"paused after a pause", Streaming, CmdPause, Paused, 1},
		{"streaming after a resume", Paused, CmdResume, Streaming, 1},
		{"stopped after a stop", Streaming, CmdStop, Stopped, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			st := commandStream(env, "zone1-0000000101")
			st.Tablets["t-0001"].State = tt.row
			var cmds tabletCommands
			cmds.mock(env)
			payload := `{"tablets": ["t-0001"]}`
			if tt.cmd == CmdStop {
				payload = `{}`
			}
			env.RegisterDelayedCallback(func() { env.SignalWorkflow(tt.cmd, json.RawMessage(payload)) }, 5*time.Second)
			env.RegisterDelayedCallback(func() {
				env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0001", State: tt.reported, Replica: "zone1-0000000101", Checkpoint: cp(9), Seq: 5, Updated: env.Now()})
			}, 7*time.Second)
			env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), st)

			cmds.mu.Lock()
			defer cmds.mu.Unlock()
			got := cmds.got[TabletWorkflowID("orders", "t-0001")]
			n := 0
			for _, c := range got {
				if c.Kind == tt.cmd {
					n++
				}
			}
			require.Equal(t, tt.told, n, "t-0001 told %s: %+v", tt.cmd, got)
			require.Len(t, got, n, "and nothing else")
		})
	}
}

// A stopping stream starts no tablet workflow: a tablet whose workflow
// closed without a terminal report is Stopped at its checkpoint (its
// workflow was restarted only to stop at once), and the stream completes.
func TestAStoppingStreamStartsNoTabletWorkflow(t *testing.T) {
	env := newEnv(t)
	st := &StreamState{Tablets: map[string]*TabletStatus{}, Aliases: []string{"zone1-0000000101"}}
	for _, id := range []string{"t-0001", "t-0002"} {
		st.Tablets[id] = &TabletStatus{ID: id, State: Streaming, Replica: "zone1-0000000101", Checkpoint: cp(7), Seq: 1}
	}
	w := &streamWith{
		lists:  [][]source.Tablet{{{ID: "t-0001"}, {ID: "t-0002"}}},
		closed: [][]activities.ClosedTablet{nil, {{Tablet: "t-0001", Status: "Terminated"}}},
	}
	w.mock(env)
	var cmds tabletCommands
	cmds.mock(env)
	var starts int
	env.OnWorkflow(TabletWorkflow, mock.Anything, mock.Anything, mock.Anything).Return(
		func(workflow.Context, TabletInput, *TabletState) error { starts++; return nil }).Maybe()
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdStop, json.RawMessage(`{}`)) }, 5*time.Second)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(SignalTabletReport, TabletStatus{ID: "t-0002", State: Stopped, Checkpoint: cp(9), Seq: 5, Updated: env.Now()})
	}, 6*time.Second)
	env.RegisterDelayedCallback(func() {
		if !env.IsWorkflowCompleted() {
			env.CancelWorkflow()
		}
	}, time.Minute)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), st)

	require.NoError(t, env.GetWorkflowError(), "the stream completes")
	require.Zero(t, starts, "no tablet workflow started")
	status := queryStatus[StreamStatus](t, env)
	require.Equal(t, Stopped, status.Tablets[0].State, "%+v", status.Tablets[0])
	require.Equal(t, cp(7), status.Tablets[0].Checkpoint)
}
