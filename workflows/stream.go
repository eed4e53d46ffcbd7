package workflows

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// ErrBadConfig is the ApplicationError type of a stream whose config is
// invalid: it fails at once, never retries.
const ErrBadConfig = "BadConfig"

// maxRejected is how many rejected signals the status keeps.
const maxRejected = 10

// StreamWorkflow runs one CDC stream; its workflow ID is the stream's ID.
// cfg is the stream config as raw JSON (decoded strictly here, so a typo
// fails the workflow naming the field); state is nil on a first start and
// carries everything across continue-as-new.
func StreamWorkflow(ctx workflow.Context, cfg json.RawMessage, state *StreamState) error {
	signalHandling := workflow.GetVersion(ctx, changeSignalHandling, workflow.DefaultVersion, 1) >= 1
	decode := config.Decode
	if state == nil && signalHandling {
		decode = config.DecodeForStart
	}
	c, err := decode(cfg)
	if err != nil {
		return temporal.NewNonRetryableApplicationError("stream config: "+err.Error(), ErrBadConfig, nil)
	}
	s := &stream{id: workflow.GetInfo(ctx).WorkflowExecution.ID, raw: cfg, cfg: c, st: state, signalHandling: signalHandling}
	s.version = workflow.GetVersion(ctx, changeDurable, workflow.DefaultVersion, versionDurable)
	if s.durable() {
		s.slimTopology = workflow.GetVersion(ctx, changeSlimTopology, workflow.DefaultVersion, 1) >= 1
		s.exclusionsMemo = workflow.GetVersion(ctx, changeExclusionsMemo, workflow.DefaultVersion, 1) >= 1
		s.memoPerTask = workflow.GetVersion(ctx, changeMemoPerTask, workflow.DefaultVersion, 1) >= 1
	}
	if s.st == nil {
		s.st = &StreamState{Tablets: map[string]*TabletStatus{}}
		for _, e := range c.Exclude {
			e.Expires = expiry(workflow.Now(ctx), e.TTL)
			s.st.Exclude = s.st.Exclude.Add(e)
		}
	}
	s.log = log.With(workflow.GetLogger(ctx), "stream", s.id)
	s.applyTunables()
	s.applyTables()
	s.deriveIntents()
	return s.run(ctx)
}

type stream struct {
	id      string
	raw     json.RawMessage
	cfg     config.Stream
	st      *StreamState
	log     log.Logger
	version workflow.Version
	// slimTopology: the topology is read with ReadTopology
	// (changeSlimTopology).
	slimTopology bool
	// exclusionsMemo: the memo carries the operator exclude list for the
	// watchers (changeExclusionsMemo); memoSet says this run set it.
	exclusionsMemo bool
	// signalHandling: signals decoded here, errors with their context, a
	// first run's sizes checked (changeSignalHandling).
	signalHandling bool
	// memoPerTask: the memo is brought up to date once per workflow task,
	// not after every report (changeMemoPerTask).
	memoPerTask bool
	memoSet     bool
	// ensureBeside: the source-side stream is created by the topology
	// read, beside the selector (changeEnsureBeside); fatal is an error
	// of that creation that no retry mends (the stream fails with it, as
	// it did when the creation came before the loop).
	ensureBeside bool
	fatal        error
	reports      workflow.ReceiveChannel
	signals      map[string]workflow.ReceiveChannel
	// bounded: a command's lists are deduplicated and a signal is
	// bounded as an update is (changeBoundedCommands); nil until asked.
	bounded *bool
	// loopCtx is the main loop's context; retried takes the closed
	// previous workflows of retried tablets (changeRetryAfterClose),
	// which a goroutine looks for while checkingRetried.
	loopCtx         workflow.Context
	retried         workflow.Channel
	checkingRetried bool
	// resynced takes what the Resync activities came back with.
	resynced workflow.Channel
	// snapshots takes what the Snapshot activities came back with;
	// snapshotBusy, that one runs.
	snapshots    workflow.Channel
	snapshotBusy bool
	// published takes what the SetTables activities came back with;
	// publishBusy, that one runs.
	published     workflow.Channel
	publishBusy   bool
	publishCancel workflow.CancelFunc
	// started counts the tablet workflows this run started: a run has at
	// most maxChildrenPerRun (see applyListing); more tablets wait for the
	// next run, which deferred asks for at once.
	started  int
	deferred bool
	// memo and memoExclude are what the memo last got: tablet-state counts
	// and the operator exclude list.
	memo        map[string]int
	memoExclude []string
	// digest is the config's (activities.ConfigDigest), once computed.
	digest string
	// intents: tablets are told their operator's intents as they start
	// and after a contradicting report (changeOperatorIntents); nil until
	// asked. pending are the tablet workflows asked to start whose start
	// the loop has not heard of (from starts); owed and owedTunables, the
	// tablets to tell their intent, or the tunables, at the next flush.
	intents      *bool
	pending      map[string]*pendingStart
	starts       workflow.Channel
	owed         map[string]bool
	owedTunables map[string]bool
	// lv is what the reads of the running tablets' live figures found
	// (changeLiveStatus); nil: this run does not read them.
	lv *liveView
}

// durable reports whether this run has the durability changes (see
// changeDurable).
func (s *stream) durable() bool { return s.version >= versionDurable }

func (s *stream) run(ctx workflow.Context) error {
	// The status is computed at the query's time, so a paused tablet's
	// retention counts down between workflow tasks too (a query issues no
	// command, so reading the clock here is safe).
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (StreamStatus, error) { return s.liveStatus(time.Now()), nil }); err != nil {
		return err
	}
	signals, err := s.registerOperatorCommands(ctx)
	if err != nil {
		return err
	}
	s.signals = signals
	if err := workflow.SetQueryHandler(ctx, activities.QueryExclusions, func() (config.ExcludeList, error) {
		return s.exclusions(workflow.Now(ctx)), nil
	}); err != nil {
		return err
	}
	// The config as the stream was started with it, for the tablets'
	// activities whose input names it (activities.ConfigRef).
	if err := workflow.SetQueryHandler(ctx, activities.QueryConfig, func() (string, error) { return string(s.raw), nil }); err != nil {
		return err
	}
	s.reports = workflow.GetSignalChannel(ctx, SignalTabletReport)
	var a *activities.Activities
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 30 * time.Second,
			NonRetryableErrorTypes: activities.NonRetryable,
		},
	})
	if !s.st.SourceStream && s.durable() && workflow.GetVersion(ctx, changeEnsureBeside, workflow.DefaultVersion, 1) >= 1 {
		// The loop's first topology read creates it (readTopology).
		s.ensureBeside = true
	} else if !s.st.SourceStream {
		ensure := workflow.WithActivityOptions(actx, workflow.ActivityOptions{
			StartToCloseTimeout: time.Minute, Summary: "create the source-side stream " + s.id,
			RetryPolicy: &temporal.RetryPolicy{MaximumInterval: 30 * time.Second, NonRetryableErrorTypes: activities.NonRetryable},
		})
		var info source.Stream
		if err := workflow.ExecuteActivity(ensure, a.EnsureStream, activities.EnsureStreamInput{
			Stream: s.id, Source: s.cfg.Source, StartFrom: s.cfg.StartFrom,
		}).Get(ctx, &info); err != nil {
			return err
		}
		s.st.SourceStream = true
		s.st.Retention = info.Retention
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, SAStream.ValueSet(s.id)); err != nil {
		s.log.Warn("search attributes not updated", "error", err)
	}
	if s.durable() {
		return s.loop(ctx, actx)
	}
	return s.loopV0(ctx, actx)
}

// loopV0 is the stream's loop as it was before changeDurable, kept for
// runs recorded with it: the topology read blocks the loop, and
// continue-as-new is checked before the stop.
func (s *stream) loopV0(ctx, actx workflow.Context) error {
	var exclusionEnds expiryTimer
	for {
		if err := ctx.Err(); err != nil {
			// Cancelled: the tablets (abandoned children) stop by
			// themselves when their next report finds the stream closed.
			return temporal.NewCanceledError("stream cancelled")
		}
		if s.st.Stop == nil {
			if err := s.refreshV0(ctx, actx); err != nil {
				return err
			}
		}
		s.details(ctx)
		refresh := workflow.NewTimer(ctx, s.cfg.TopologyRefresh.D())
		for waiting := true; waiting; {
			if s.st.Stop != nil && len(s.live()) == 0 {
				return s.finish(ctx, actx)
			}
			sel := workflow.NewSelector(ctx)
			sel.AddFuture(refresh, func(workflow.Future) { waiting = false })
			s.addCommands(ctx, sel)
			if t := exclusionEnds.next(ctx, s.nextExpiry()); t != nil {
				sel.AddFuture(t, func(workflow.Future) { exclusionEnds.fired(); s.onExpiry(ctx) })
			}
			sel.Select(ctx)
			s.details(ctx)
			if workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
				return s.continueAsNew(ctx)
			}
		}
	}
}

// loop is the stream's main loop. It never blocks on the source: the
// topology is read beside the selector (readTopology), so signals,
// updates, queries and continue-as-new go on during a source outage. The
// stop is checked before continue-as-new.
func (s *stream) loop(ctx, actx workflow.Context) error {
	var exclusionEnds expiryTimer
	topology := workflow.NewChannel(ctx)
	var next workflow.Future // the timer to the next topology read; nil while one runs
	s.loopCtx, s.retried = ctx, workflow.NewChannel(ctx)
	s.pending, s.starts = map[string]*pendingStart{}, workflow.NewChannel(ctx)
	s.readTopology(ctx, actx, topology)
	s.checkRetried() // tablets retried in an earlier run that still wait
	s.resynced = workflow.NewChannel(ctx)
	s.resumeResyncs(ctx)
	s.snapshots = workflow.NewChannel(ctx)
	s.driveSnapshot(false)
	s.published = workflow.NewChannel(ctx)
	s.drivePublish(false)
	if workflow.GetVersion(ctx, changeLiveStatus, workflow.DefaultVersion, 1) >= 1 {
		s.lv = &liveView{in: workflow.NewChannel(ctx)}
	}
	for {
		if err := ctx.Err(); err != nil {
			return temporal.NewCanceledError("stream cancelled")
		}
		if s.fatal != nil {
			return s.fatal
		}
		// A stop that drops the source-side stream waits for a creation
		// still under way, so that it drops what that creation made.
		creating := s.ensureBeside && !s.st.SourceStream && next == nil
		if s.st.Stop != nil && len(s.live()) == 0 && len(s.st.Resyncs) == 0 && !(creating && s.st.Stop.DropSourceStream) {
			return s.finish(ctx, actx)
		}
		if s.deferred || workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			return s.continueAsNew(ctx)
		}
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(topology, func(c workflow.ReceiveChannel, _ bool) {
			var r topologyRead
			c.Receive(ctx, &r)
			next = workflow.NewTimer(ctx, s.onTopology(ctx, r))
		})
		if next != nil {
			sel.AddFuture(next, func(workflow.Future) {
				next = nil
				s.readTopology(ctx, actx, topology)
			})
		}
		s.addCommands(ctx, sel)
		if t := exclusionEnds.next(ctx, s.nextExpiry()); t != nil {
			sel.AddFuture(t, func(workflow.Future) { exclusionEnds.fired(); s.onExpiry(ctx) })
		}
		sel.AddReceive(s.retried, func(c workflow.ReceiveChannel, _ bool) {
			var closed []activities.ClosedTablet
			c.Receive(ctx, &closed)
			s.restartRetried(ctx, closed)
		})
		sel.AddReceive(s.resynced, func(c workflow.ReceiveChannel, _ bool) {
			var r resyncResult
			c.Receive(ctx, &r)
			s.onResynced(ctx, r)
		})
		sel.AddReceive(s.snapshots, func(c workflow.ReceiveChannel, _ bool) {
			var r snapshotted
			c.Receive(ctx, &r)
			s.onSnapshotted(ctx, r)
		})
		sel.AddReceive(s.published, func(c workflow.ReceiveChannel, _ bool) {
			var r published
			c.Receive(ctx, &r)
			s.onPublished(ctx, r)
		})
		sel.AddReceive(s.starts, func(c workflow.ReceiveChannel, _ bool) {
			var r startResult
			c.Receive(ctx, &r)
			s.onStarted(ctx, r)
		})
		if s.lv != nil {
			s.scheduleLive(ctx)
			if s.lv.next != nil {
				sel.AddFuture(s.lv.next, func(workflow.Future) { s.readLive(ctx, actx) })
			}
			sel.AddReceive(s.lv.in, func(c workflow.ReceiveChannel, _ bool) {
				var r liveRead
				c.Receive(ctx, &r)
				s.onLive(ctx, r)
			})
		}
		sel.Select(ctx)
		if !sel.HasPending() {
			// What the tablets are owed goes out once the commands, reports
			// and starts already here are handled, in one fan-out; so is a
			// running snapshot's look for tablets that ended unreported.
			s.flushOwed(ctx)
			s.snapshotSweep(ctx)
		}
		// With more reports or commands already waiting, the details wait
		// for the last of them: 64 tablets reporting in one workflow task
		// made 64 memo updates (each an event and a visibility write).
		if !s.memoPerTask || !sel.HasPending() {
			s.details(ctx)
		}
	}
}

// addCommands adds the tablets' reports and the operator's signals to a
// selector.
func (s *stream) addCommands(ctx workflow.Context, sel workflow.Selector) {
	sel.AddReceive(s.reports, func(ch workflow.ReceiveChannel, _ bool) {
		var r TabletStatus
		if err := receive(ctx, ch, &r, s.signalHandling); err != nil {
			s.reject(ctx, SignalTabletReport, err.Error())
			return
		}
		s.onReport(ctx, r)
	})
	for _, name := range SignalCommands {
		sel.AddReceive(s.signals[name], func(ch workflow.ReceiveChannel, _ bool) {
			var raw json.RawMessage
			if err := receive(ctx, ch, &raw, s.signalHandling); err != nil {
				s.reject(ctx, name, err.Error())
				return
			}
			s.onSignal(ctx, name, raw)
		})
	}
}

// expiryTimer is one timer for the next exclusion expiry, replaced only
// when that instant changes (not on every loop).
type expiryTimer struct {
	at     time.Time
	timer  workflow.Future
	cancel workflow.CancelFunc
}

// next returns the timer for instant at (nil: none), starting a new one
// if at changed.
func (e *expiryTimer) next(ctx workflow.Context, at time.Time) workflow.Future {
	if at.IsZero() {
		e.fired()
		return nil
	}
	if !at.Equal(e.at) || e.timer == nil {
		e.fired()
		tctx, cancel := workflow.WithCancel(ctx)
		e.at, e.cancel = at, cancel
		e.timer = workflow.NewTimer(tctx, max(at.Sub(workflow.Now(ctx)), time.Millisecond))
	}
	return e.timer
}

// fired forgets (and cancels) the current timer.
func (e *expiryTimer) fired() {
	if e.cancel != nil {
		e.cancel()
	}
	*e = expiryTimer{}
}

// finish ends a stopped stream: every tablet has made its final commit;
// with dropSourceStream the source-side stream goes too, so it holds no
// history.
func (s *stream) finish(ctx, actx workflow.Context) error {
	if s.st.Stop.DropSourceStream {
		var a *activities.Activities
		dctx := workflow.WithActivityOptions(actx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute, Summary: "drop the source-side stream " + s.id})
		if err := workflow.ExecuteActivity(dctx, a.DeleteStream, activities.DeleteStreamInput{Stream: s.id, Source: s.cfg.Source}).Get(ctx, nil); err != nil {
			return err
		}
	}
	if s.durable() {
		if err := s.settle(ctx); err != nil {
			return err
		}
	}
	s.memoCaughtUp(ctx)
	s.log.Info("stream stopped", "dropSourceStream", s.st.Stop.DropSourceStream)
	workflow.SetCurrentDetails(ctx, fmt.Sprintf("stream **%s** stopped; every tablet made its final commit", s.id))
	return nil
}

// continueAsNew drains the channels, waits for handlers, and starts the
// next run with the state.
func (s *stream) continueAsNew(ctx workflow.Context) error {
	if !s.durable() {
		s.drain(ctx)
		if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
			return err
		}
		return workflow.NewContinueAsNewError(ctx, StreamWorkflow, s.raw, s.st)
	}
	if err := s.settle(ctx); err != nil {
		return err
	}
	s.memoCaughtUp(ctx)
	s.compact()
	s.fitCarry()
	return workflow.NewContinueAsNewError(ctx, StreamWorkflow, s.raw, s.st)
}

// settle waits for update handlers and drains every channel until a pass
// finds nothing: what it returns to is the same workflow task that
// continues-as-new or completes, so no report or command is lost.
func (s *stream) settle(ctx workflow.Context) error {
	for {
		if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
			return err
		}
		// The tablet workflows asked to start, and what tablets are owed
		// (changeOperatorIntents), before the run ends.
		started := s.awaitStarts(ctx)
		told := s.flushOwed(ctx)
		if !s.drain(ctx) && !started && !told {
			return nil
		}
	}
}

// drain applies every buffered report and signal; it reports whether
// there was any.
func (s *stream) drain(ctx workflow.Context) bool {
	any := false
	for {
		var r TabletStatus
		ok, err := receiveAsync(s.reports, &r, s.signalHandling)
		if !ok {
			break
		}
		any = true
		if err != nil {
			s.reject(ctx, SignalTabletReport, err.Error())
			continue
		}
		s.onReport(ctx, r)
	}
	for _, name := range SignalCommands {
		for {
			var raw json.RawMessage
			ok, err := receiveAsync(s.signals[name], &raw, s.signalHandling)
			if !ok {
				break
			}
			any = true
			if err != nil {
				s.reject(ctx, name, err.Error())
				continue
			}
			s.onSignal(ctx, name, raw)
		}
	}
	return any
}

// onReport records a tablet's report; a split starts the children.
func (s *stream) onReport(ctx workflow.Context, r TabletStatus) {
	if r.ID == "" {
		s.reject(ctx, SignalTabletReport, "report without a tablet id")
		return
	}
	prev := s.st.Tablets[r.ID]
	if prev != nil && stale(r, *prev) {
		return // reports are not awaited by the tablet; an older one can come late
	}
	r.Reason, r.LastError = clip(r.Reason), clip(r.LastError)
	if prev != nil {
		r.Restarts = max(r.Restarts, prev.Restarts)
	}
	s.st.Tablets[r.ID] = &r
	if r.State == Split && (prev == nil || prev.State != Split) && s.st.Stop == nil {
		s.startTablets(ctx, r.Children, r.Handoff, nil)
	}
	if s.intentOf(r.ID).contradictedBy(r.State) && s.keepsIntents(ctx) {
		// The command was lost on its way, or came before the tablet
		// could take it: told again (changeOperatorIntents).
		s.owe(r.ID)
	}
	s.afterReport(ctx, r.ID)
	s.snapshotReported(ctx, r)
}

// stale reports whether report r is older than what the stream holds:
// by the tablet's report sequence when both have one, else (reports from
// before it was numbered) by time.
func stale(r, prev TabletStatus) bool {
	if r.Seq > 0 && prev.Seq > 0 {
		return r.Seq <= prev.Seq
	}
	return r.Updated.Before(prev.Updated)
}

// refreshV0 is the topology refresh as it was before changeDurable: it
// lists the tablets (blocking the loop) and starts a workflow for each one
// the stream does not track and may start: a first-generation tablet, or
// one whose parent is gone from the topology or has split in this stream.
func (s *stream) refreshV0(ctx, actx workflow.Context) error {
	var a *activities.Activities
	var tablets []source.Tablet
	lctx := workflow.WithActivityOptions(actx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute, Summary: "list tablets",
		RetryPolicy: &temporal.RetryPolicy{MaximumInterval: 30 * time.Second, NonRetryableErrorTypes: activities.NonRetryable}})
	if err := workflow.ExecuteActivity(lctx, a.ListTablets, s.cfg.Source).Get(ctx, &tablets); err != nil {
		if isType(err, activities.ErrFatal) {
			return err
		}
		s.log.Warn("list tablets failed; retrying at the next refresh", "error", err)
		return nil
	}
	listed := s.learnAliases(activities.TopologyOf(tablets))
	var start []string
	for _, t := range tablets {
		if s.st.Tablets[t.ID] != nil {
			continue
		}
		if p := s.st.Tablets[t.Parent]; t.Parent == "" || !listed[t.Parent] || (p != nil && p.State == Split) {
			start = append(start, t.ID)
		}
	}
	s.startTablets(ctx, start, source.Checkpoint{}, nil)
	return nil
}

// startTablets starts TabletWorkflows (ABANDON, deterministic IDs) from
// checkpoint start, adopting any that is already running; a tablet in
// picks starts on the replica picked for it.
func (s *stream) startTablets(ctx workflow.Context, ids []string, start source.Checkpoint, picks map[string]activities.Selection) {
	var children []childStart
	for _, id := range ids {
		if s.st.Tablets[id] != nil {
			continue
		}
		row := &TabletStatus{ID: id, State: Starting, Checkpoint: start, Start: start}
		c := childStart{id: id, start: start}
		if p, ok := picks[id]; ok {
			// Its first replica picked (changeFirstPicks): the tablet starts
			// streaming from it and does not report that it does; its row
			// is Streaming once its workflow started (startChildren). The
			// row's time is from before the tablet's first report, so that
			// report is never taken for a stale one.
			row.Replica, row.Updated = p.Replica.Alias, workflow.Now(ctx)
			c.first = &p
		}
		s.st.Tablets[id] = row
		children = append(children, c)
	}
	s.startChildren(ctx, children)
}

// childStart is one TabletWorkflow to start: from checkpoint start, with
// state (nil: a fresh tablet; set: a restart that keeps its counters and
// the operator's intents).
type childStart struct {
	id    string
	start source.Checkpoint
	state *TabletState
	first *activities.Selection // the replica picked for its first run, or nil
	// retry: the operator's retry of a Failed tablet, which must not
	// adopt the tablet's previous workflow (changeRetryAfterClose).
	retry bool
}

// startChildren starts TabletWorkflows whose rows s.st.Tablets already
// holds. With changeOperatorIntents it only asks for the starts, and the
// loop hears of each (onStarted) while it goes on taking commands and
// reports; before it, it waits until each has started (or failed to).
func (s *stream) startChildren(ctx workflow.Context, children []childStart) {
	if len(children) == 0 {
		return
	}
	if s.launches(ctx) {
		s.launch(children)
		return
	}
	var futs []workflow.ChildWorkflowFuture
	total := len(s.st.Tablets)
	s.started += len(children)
	for _, c := range children {
		futs = append(futs, s.executeChild(ctx, c, total))
	}
	for i, f := range futs {
		var exec workflow.Execution
		err := f.GetChildWorkflowExecution().Get(ctx, &exec)
		s.afterStart(ctx, children[i], err)
	}
}

// executeChild asks for one TabletWorkflow's start; total is the
// stream's number of tablets, which paces the tablet's reports.
func (s *stream) executeChild(ctx workflow.Context, c childStart, total int) workflow.ChildWorkflowFuture {
	state, replica := Starting, ""
	if c.first != nil {
		state, replica = Streaming, c.first.Replica.Alias
	}
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:        TabletWorkflowID(s.id, c.id),
		ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_ABANDON,
		StaticSummary:     fmt.Sprintf("tablet %s of stream %s", c.id, s.id),
		TypedSearchAttributes: temporal.NewSearchAttributes(
			SAStream.ValueSet(s.id), SATablet.ValueSet(c.id), SAState.ValueSet(string(state)), SAReplica.ValueSet(replica)),
	})
	cfg, sections := s.tabletConfig()
	return workflow.ExecuteChildWorkflow(cctx, TabletWorkflow, TabletInput{
		Stream: s.id, Tablet: c.id, Config: cfg, Sections: sections, Start: c.start, Tablets: total, Retention: s.st.Retention,
		Exclude: s.exclusionsOf(c.id, workflow.Now(ctx)), First: c.first, Resync: s.resyncedStart(c),
	}, c.state)
}

// inlineSections bounds the source and sink sections a tablet's input
// carries as they are; larger ones it names by reference.
const inlineSections = 4 << 10

// tabletConfig is the stream config as a tablet uses it: the source and
// sink sections (the kind only, with sections naming them, when together
// they are over inlineSections), the tunables and the report rate; not
// the topology refresh or the operator's initial exclusions. The
// stream's startFrom rides along: a source that keeps no stream on its
// servers (vitess) reads a tablet's zero checkpoint by it. Each tablet's
// input is in the stream's history, once per tablet.
func (s *stream) tabletConfig() (config.Stream, *activities.ConfigRef) {
	c := config.Stream{Source: s.cfg.Source, Sink: s.cfg.Sink, StartFrom: s.cfg.StartFrom, Selection: s.cfg.Selection, Retry: s.cfg.Retry,
		AutoExcludeTTL: s.cfg.AutoExcludeTTL, Batch: s.cfg.Batch, Run: s.cfg.Run, ReportRate: s.cfg.ReportRate}
	if len(s.cfg.Source.Spec)+len(s.cfg.Sink.Spec) <= inlineSections {
		return c, nil
	}
	if s.digest == "" {
		s.digest = activities.ConfigDigest(s.raw)
	}
	c.Source = config.Source{Kind: s.cfg.Source.Kind, Tables: s.cfg.Source.Tables}
	c.Sink = config.Sink{Kind: s.cfg.Sink.Kind}
	return c, &activities.ConfigRef{Stream: s.id, Digest: s.digest}
}

// exclusionsOf returns the operator exclusions in force that apply to
// tablet id: the stream-wide ones and the tablet's own.
func (s *stream) exclusionsOf(id string, now time.Time) config.ExcludeList {
	return slices.DeleteFunc(s.exclusions(now), func(e config.Exclusion) bool { return e.Tablet != "" && e.Tablet != id })
}

// afterStart applies how a tablet workflow's start went; it reports
// whether a workflow of the tablet runs now (started, or adopted).
func (s *stream) afterStart(ctx workflow.Context, c childStart, err error) bool {
	switch {
	case err == nil:
		s.log.Info("tablet workflow started", "tablet", c.id, "workflowID", TabletWorkflowID(s.id, c.id))
		if row := s.st.Tablets[c.id]; c.first != nil && row.State == Starting {
			// Started on the replica picked for it, which it reads now
			// (its reports, if any came meanwhile, are handled after).
			row.State = Streaming
		}
		return true
	case temporal.IsWorkflowExecutionAlreadyStartedError(err) && c.retry && s.retryAfterClose(ctx):
		// The Failed tablet's previous workflow has not closed yet.
		s.log.Info("the retried tablet's previous workflow still runs; its new one starts once it closed", "tablet", c.id)
		s.waitForClose(c.id)
		return false
	case temporal.IsWorkflowExecutionAlreadyStartedError(err):
		s.log.Info("adopting the running tablet workflow", "tablet", c.id)
		return true
	default:
		s.st.Tablets[c.id].State = Failed
		s.st.Tablets[c.id].Reason = clip("tablet workflow did not start: " + err.Error())
		return false
	}
}

// exclusions returns the operator exclude list without expired entries.
func (s *stream) exclusions(now time.Time) config.ExcludeList { return s.st.Exclude.Live(now) }

// status is the `status` query; a paused tablet's retention counts down.
func (s *stream) status(now time.Time) StreamStatus {
	out := StreamStatus{Stream: s.id, Tablets: []TabletStatus{}, Exclude: s.st.Exclude, Rejected: s.st.Rejected, Topology: s.st.Topology,
		Checks: s.st.Checks, Snapshot: s.st.Snapshot, TablesChange: s.st.TablesChange}
	if out.Exclude == nil {
		out.Exclude = config.ExcludeList{}
	}
	if out.Rejected == nil {
		out.Rejected = []Rejected{}
	}
	for _, id := range s.tabletIDs() {
		t := *s.st.Tablets[id]
		if t.Excluded == nil {
			t.Excluded = config.ExcludeList{}
		}
		if t.State == Paused && !t.PausedAt.IsZero() && s.st.Retention > 0 && !now.IsZero() {
			t.RetentionLeft = retentionLeft(s.st.Retention, t.PausedAt, now).Round(time.Second).String()
		}
		out.Tablets = append(out.Tablets, t)
	}
	return out
}

// reject records a bad signal payload: logged and shown in the status,
// never a failed workflow.
func (s *stream) reject(ctx workflow.Context, signal, reason string) {
	reason = truncate(reason, maxRejectedReasonBytes)
	s.log.Warn("signal rejected", "signal", signal, "reason", reason)
	s.st.Rejected = append(s.st.Rejected, Rejected{Signal: signal, Reason: reason, At: workflow.Now(ctx)})
	if len(s.st.Rejected) > maxRejected {
		s.st.Rejected = s.st.Rejected[len(s.st.Rejected)-maxRejected:]
	}
}

// details says in words how the stream is doing, for the Web UI: the
// current details, and a memo with the count of tablets in each state
// (updated only when those counts change).
func (s *stream) details(ctx workflow.Context) {
	var records int64
	for _, t := range s.st.Tablets {
		records += t.Records
	}
	memo, exclude := s.memoValues()
	var parts []string
	for _, st := range s.memoStates() {
		if n := memo[string(st)]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	workflow.SetCurrentDetails(ctx, fmt.Sprintf("stream **%s**: %d tablets (%s), %d records written",
		s.id, len(s.st.Tablets), strings.Join(parts, ", "), records))
	if s.memoStale(memo, exclude) {
		fields := map[string]any{MemoTabletStates: memo, "exclude": exclude}
		if s.exclusionsMemo {
			fields[activities.MemoExclusions] = s.st.Exclude
		}
		if err := workflow.UpsertMemo(ctx, fields); err != nil {
			s.log.Warn("memo not updated", "error", err)
		}
		s.memo, s.memoExclude, s.memoSet = memo, exclude, true
	}
}

// MemoTabletStates is the stream's memo field that counts its tablets by
// state (a JSON object, state to count, states with none left out).
const MemoTabletStates = "tabletStates"

// memoStates are the states the memo counts, in the order the details
// name them.
var memoStates = []State{Streaming, Retrying, NoEligibleReplica, Stuck, Paused, Starting, Split, Expired, Failed, Stopped}

// memoStates are the states this run's memo counts: Resyncing too with
// changeLiveStatus (a run recorded before it counted the others only).
func (s *stream) memoStates() []State {
	if s.lv == nil {
		return memoStates
	}
	return append(slices.Clone(memoStates), Resyncing)
}

// memoValues returns what the memo should hold now: the count of tablets
// in each state (states with none left out) and the operator exclude list
// described.
func (s *stream) memoValues() (map[string]int, []string) {
	counts := map[State]int{}
	for _, t := range s.st.Tablets {
		counts[t.State]++
	}
	memo := map[string]int{}
	for _, st := range s.memoStates() {
		if n := counts[st]; n > 0 {
			memo[string(st)] = n
		}
	}
	exclude := make([]string, 0, len(s.st.Exclude))
	for _, e := range s.st.Exclude {
		exclude = append(exclude, describeExclusion(e))
	}
	return memo, exclude
}

// memoStale reports whether the memo differs from memo and exclude (or,
// with changeExclusionsMemo, this run has not set it yet).
func (s *stream) memoStale(memo map[string]int, exclude []string) bool {
	return !maps.Equal(memo, s.memo) || !slices.Equal(exclude, s.memoExclude) || (s.exclusionsMemo && !s.memoSet)
}

// memoCaughtUp brings the memo up to date before the run ends
// (changeFinalMemo): with memo-per-task its last update may have waited
// for a report or command that the run then handled on its way out, and
// a stopped stream's memo kept the states from before the stop.
func (s *stream) memoCaughtUp(ctx workflow.Context) {
	if !s.memoPerTask || !s.memoStale(s.memoValues()) {
		return
	}
	if workflow.GetVersion(ctx, changeFinalMemo, workflow.DefaultVersion, 1) < 1 {
		return
	}
	s.details(ctx)
}

// describeExclusion renders an operator exclusion for the memo:
// "zone1-0000000101 (maintenance) until 2026-11-30T12:00:00Z".
func describeExclusion(e config.Exclusion) string {
	out := e.Alias
	if e.Tablet != "" {
		out += " on " + e.Tablet
	}
	out += " (" + e.Reason + ")"
	if !e.Expires.IsZero() {
		out += " until " + e.Expires.UTC().Format(time.RFC3339)
	}
	return out
}

// expiry turns a TTL into an instant (zero: never).
func expiry(now time.Time, ttl config.Duration) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	return now.Add(ttl.D())
}
