package workflows

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/source"
)

// topologyBound bounds one topology read (the listing with its retries);
// after it the stream says the topology is unreachable and tries again
// after topologyRetry.
const (
	topologyBound = 20 * time.Second
	topologyRetry = 10 * time.Second
	// ensureBound bounds one try at creating the source-side stream
	// (changeEnsureBeside): a PostgreSQL slot on a standby can take many
	// seconds to make.
	ensureBound = time.Minute
)

// maxChildrenPerRun bounds the tablet workflows one stream run starts. A
// child a run started counts against the server's limit of pending child
// workflows per execution (2000 by default) until it closes, however it is
// abandoned; a new run (continue-as-new) starts from zero. So a stream of
// more tablets starts them in waves of this many, one wave per run; splits,
// restarts and retries are few and always start at once, within the
// limit's headroom.
const maxChildrenPerRun = 1000

// readRetry is the retry policy of the background read's source calls
// (making the source-side stream, the listing) within their bounds.
func readRetry() *temporal.RetryPolicy {
	return &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 10 * time.Second, NonRetryableErrorTypes: activities.NonRetryable}
}

// topologyRead is what one background topology read found.
type topologyRead struct {
	topology activities.Topology
	err      error
	// closed are the tablets whose workflows were found not running.
	closed   []activities.ClosedTablet
	checkErr error
	// ensured is the source-side stream this read created first
	// (changeEnsureBeside); nil when it was not asked to, or failed (err).
	ensured *source.Stream
}

// readTopology lists the tablets and checks which tablet workflows have
// closed, in a workflow goroutine, and sends what it found to out: the
// stream's loop goes on meanwhile.
func (s *stream) readTopology(ctx, actx workflow.Context, out workflow.Channel) {
	workflow.Go(ctx, func(gctx workflow.Context) {
		var a *activities.Activities
		var r topologyRead
		if s.ensureBeside && !s.st.SourceStream {
			ectx := workflow.WithActivityOptions(actx, workflow.ActivityOptions{
				StartToCloseTimeout: time.Minute, ScheduleToCloseTimeout: ensureBound, Summary: "create the source-side stream " + s.id,
				RetryPolicy: readRetry(),
			})
			var info source.Stream
			if err := workflow.ExecuteActivity(ectx, a.EnsureStream, activities.EnsureStreamInput{
				Stream: s.id, Source: s.cfg.Source, StartFrom: s.cfg.StartFrom,
			}).Get(gctx, &info); err != nil {
				r.err = err
				out.Send(gctx, r)
				return
			}
			r.ensured = &info
		}
		lctx := workflow.WithActivityOptions(actx, workflow.ActivityOptions{
			StartToCloseTimeout: 10 * time.Second, ScheduleToCloseTimeout: topologyBound, Summary: "list tablets",
			RetryPolicy: readRetry(),
		})
		switch {
		case s.slimTopology && len(s.st.Tablets) == 0 && s.st.Stop == nil &&
			workflow.GetVersion(gctx, changeFirstPicks, workflow.DefaultVersion, 1) >= 1:
			// A new stream about to start its tablets: with their first
			// replicas picked.
			r.err = workflow.ExecuteActivity(lctx, a.ReadTopologyAndPick, activities.PickInput{
				Stream: s.id, Source: s.cfg.Source, Selection: s.cfg.Selection,
				Operator: s.exclusions(workflow.Now(gctx)), Max: maxChildrenPerRun,
			}).Get(gctx, &r.topology)
		case s.slimTopology:
			r.err = workflow.ExecuteActivity(lctx, a.ReadTopology, s.cfg.Source).Get(gctx, &r.topology)
		default:
			var tablets []source.Tablet
			r.err = workflow.ExecuteActivity(lctx, a.ListTablets, s.cfg.Source).Get(gctx, &tablets)
			r.topology = activities.TopologyOf(tablets)
		}
		if refs := s.running(); r.err == nil && len(refs) > 0 {
			cctx := workflow.WithActivityOptions(actx, workflow.ActivityOptions{
				StartToCloseTimeout: time.Minute, ScheduleToCloseTimeout: 2 * time.Minute, Summary: fmt.Sprintf("check %d tablet workflows", len(refs)),
				RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 10 * time.Second},
			})
			r.checkErr = workflow.ExecuteActivity(cctx, a.CheckTablets, activities.CheckTabletsInput{Tablets: refs, StatusQuery: QueryStatus}).Get(gctx, &r.closed)
		}
		out.Send(gctx, r)
	})
}

// unmendable reports whether err is a Fatal one (a source that refuses
// the stream for good: bad tables, no permission), which fails a stream
// whose source-side stream it kept from being created. Anything else (a
// replica down, a timeout) is tried again.
func unmendable(err error) bool {
	var app *temporal.ApplicationError
	return errors.As(err, &app) && app.Type() == activities.ErrFatal
}

// running returns the tablets the stream believes have a running
// workflow.
func (s *stream) running() []activities.TabletRef {
	var refs []activities.TabletRef
	for _, id := range s.live() {
		if s.pending[id] != nil {
			continue // its start is under way
		}
		refs = append(refs, activities.TabletRef{Tablet: id, WorkflowID: TabletWorkflowID(s.id, id)})
	}
	return refs
}

// onTopology applies a topology read and returns when to read again.
func (s *stream) onTopology(ctx workflow.Context, r topologyRead) time.Duration {
	if r.ensured != nil {
		s.st.SourceStream = true
		s.st.Retention = r.ensured.Retention
	}
	if r.err != nil && !s.st.SourceStream && unmendable(r.err) {
		s.fatal = r.err
	}
	if r.err != nil {
		if s.st.Topology == nil {
			s.st.Topology = &TopologyTrouble{Since: workflow.Now(ctx)}
		}
		what, msg := "list tablets", errorMessage(r.err, s.signalHandling)
		if !s.st.SourceStream {
			what = "create the source-side stream"
			msg = what + ": " + msg
		}
		s.st.Topology.Error = clip(msg)
		s.log.Warn(what+" failed; the stream goes on and tries again", "error", r.err, "since", s.st.Topology.Since)
		return min(s.cfg.TopologyRefresh.D(), topologyRetry)
	}
	s.st.Topology = nil
	// A tablet's terminal report is sent before its workflow closes: apply
	// every report already here before deciding a tablet closed silently.
	for {
		var rep TabletStatus
		ok, err := receiveAsync(s.reports, &rep, s.signalHandling)
		if !ok {
			break
		}
		if err != nil {
			s.reject(ctx, SignalTabletReport, err.Error())
			continue
		}
		s.onReport(ctx, rep)
	}
	if r.checkErr != nil {
		s.log.Warn("checking the tablet workflows failed; again at the next refresh", "error", r.checkErr)
		s.checkFailed(ctx, r.checkErr)
	} else {
		s.st.Checks = nil
		s.reconcile(ctx, r.closed)
	}
	s.applyListing(ctx, r.topology)
	return s.cfg.TopologyRefresh.D()
}

// checkFailed shows in the status that the tablet workflows cannot be
// checked, since when and why.
func (s *stream) checkFailed(ctx workflow.Context, err error) {
	if s.st.Checks == nil {
		s.st.Checks = &TopologyTrouble{Since: workflow.Now(ctx)}
	}
	s.st.Checks.Error = clip("check the tablet workflows: " + errorMessage(err, s.signalHandling))
}

// learnAliases records the replicas the listing names (what exclude and
// include accept) and returns the listed tablet IDs.
func (s *stream) learnAliases(t activities.Topology) map[string]bool {
	listed := map[string]bool{}
	for _, tab := range t.Tablets {
		listed[tab.ID] = true
	}
	s.st.Aliases = slices.Clone(t.Aliases)
	return listed
}

// applyListing starts a workflow for each listed tablet the stream does
// not track and may start: a first-generation tablet; a child of a parent
// that split before the stream knew it (neither listed nor tracked); or a
// child of a parent that split in this stream (from the parent's
// hand-off). A child of a parent still being read waits for its split.
// A stopping stream starts nothing.
func (s *stream) applyListing(ctx workflow.Context, topo activities.Topology) {
	listed := s.learnAliases(topo)
	if s.st.Stop != nil {
		return
	}
	var fresh []string
	byHandoff := map[source.Checkpoint][]string{}
	var handoffs []source.Checkpoint
	for _, t := range topo.Tablets {
		if s.st.Tablets[t.ID] != nil {
			continue
		}
		p := s.st.Tablets[t.Parent]
		switch {
		case t.Parent == "" || (p == nil && !listed[t.Parent]):
			fresh = append(fresh, t.ID)
		case p != nil && p.State == Split:
			if len(byHandoff[p.Handoff]) == 0 {
				handoffs = append(handoffs, p.Handoff)
			}
			byHandoff[p.Handoff] = append(byHandoff[p.Handoff], t.ID)
		}
	}
	now, deferred := wave(fresh, s.started)
	if deferred {
		s.log.Info("starting tablets in waves: the rest in the next run", "now", len(now), "waiting", len(fresh)-len(now))
		s.deferred = true
	}
	s.startTablets(ctx, now, source.Checkpoint{}, topo.Picks)
	for _, h := range handoffs {
		s.startTablets(ctx, byHandoff[h], h, nil)
	}
}

// wave returns the fresh tablets a run that already started `started`
// tablet workflows may start now, and whether others must wait for the
// next run.
func wave(fresh []string, started int) (now []string, deferred bool) {
	budget := max(0, maxChildrenPerRun-started)
	if len(fresh) <= budget {
		return fresh, false
	}
	return fresh[:budget], true
}

// reconcile handles tablets found closed while the stream believed them
// running: a terminal status the stream never received (a lost report) is
// applied as if reported; any other close (terminated, reset, timed out,
// failed) restarts the tablet from its last checkpoint, counted in its
// status.
func (s *stream) reconcile(ctx workflow.Context, closed []activities.ClosedTablet) {
	slices.SortFunc(closed, func(a, b activities.ClosedTablet) int {
		if a.Tablet < b.Tablet {
			return -1
		}
		if a.Tablet > b.Tablet {
			return 1
		}
		return 0
	})
	var restarts []childStart
	var retried []activities.ClosedTablet
	for _, c := range closed {
		prev := s.st.Tablets[c.Tablet]
		if prev == nil || terminal(prev.State) {
			continue // its terminal report came meanwhile
		}
		if s.pending[c.Tablet] != nil {
			continue // started again since it was found closed
		}
		if slices.Contains(s.st.Retried, c.Tablet) {
			// Retried while its previous workflow was closing: the
			// retry starts its new one (changeRetryAfterClose).
			retried = append(retried, c)
			continue
		}
		if c.Status == activities.TaskFailing {
			// Running but stuck: nothing the stream can restart. Said in its
			// row, so it does not look healthy.
			prev.Reason = fmt.Sprintf("its workflow task keeps failing (attempt %d): a bug in the worker or a non-determinism after an upgrade; "+
				"fix the worker, or terminate the tablet workflow to have it restarted from its checkpoint", c.TaskAttempts)
			if prev.State != Stuck && workflow.GetVersion(ctx, changeStuckState, workflow.DefaultVersion, 1) >= 1 {
				// Its next report (once a fixed worker runs its task) says
				// how it is again.
				prev.State, prev.Updated = Stuck, workflow.Now(ctx)
			}
			continue
		}
		var final *TabletStatus
		if len(c.Final) > 0 {
			var f TabletStatus
			if err := json.Unmarshal(c.Final, &f); err == nil && f.ID == c.Tablet {
				final = &f
			}
		}
		if final != nil && terminal(final.State) {
			s.log.Warn("applying a tablet's terminal status its report never delivered", "tablet", c.Tablet, "state", final.State)
			s.onReport(ctx, *final)
			continue
		}
		row := *prev
		if final != nil && stale(*prev, *final) {
			row = *final
		}
		if final != nil {
			row.Checkpoint = source.Max(row.Checkpoint, final.Checkpoint)
		}
		if s.st.Stop != nil && s.keepsIntents(ctx) {
			// A stopping stream starts no tablet workflow: the tablet's
			// last commit is where it stopped (changeOperatorIntents).
			row.State, row.Updated = Stopped, workflow.Now(ctx)
			row.Reason = fmt.Sprintf("stopped by the operator: its workflow had closed (%s) without a terminal report", c.Status)
			s.log.Warn("tablet workflow closed without a terminal report while the stream stops; stopped where it was", "tablet", c.Tablet, "closed", c.Status)
			s.st.Tablets[c.Tablet] = &row
			continue
		}
		// Restarted with the operator's intents: kept by the stream, not
		// the state the row last showed (a resume sent to a paused tablet
		// whose workflow had closed was lost so).
		paused := s.intentOf(c.Tablet).pause
		row.State, row.Restarts = Starting, max(prev.Restarts, row.Restarts)+1
		row.Reason = fmt.Sprintf("restarted from its checkpoint: its workflow closed (%s) without a terminal report", c.Status)
		row.Updated = workflow.Now(ctx)
		s.log.Warn("tablet workflow closed without a terminal report; restarting it", "tablet", c.Tablet, "closed", c.Status, "checkpoint", row.Checkpoint)
		s.st.Tablets[c.Tablet] = &row
		st := &TabletState{Status: row, Checkpoint: row.Checkpoint, Exclude: row.Excluded, Pause: paused, Stop: s.st.Stop != nil, Intents: true}
		// The restarted workflow keeps the tablet's own start, so the sink
		// check "empty only while still at the start" keeps its meaning.
		restarts = append(restarts, childStart{id: c.Tablet, start: row.Start, state: st})
	}
	s.startChildren(ctx, restarts)
	s.restartRetried(ctx, retried)
}
