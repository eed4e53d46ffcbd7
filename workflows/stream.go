package workflows

import (
	"encoding/json"
	"fmt"
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
	c, err := config.Decode(cfg)
	if err != nil {
		return temporal.NewNonRetryableApplicationError("stream config: "+err.Error(), ErrBadConfig, nil)
	}
	s := &stream{id: workflow.GetInfo(ctx).WorkflowExecution.ID, raw: cfg, cfg: c, st: state}
	if s.st == nil {
		s.st = &StreamState{Tablets: map[string]*TabletStatus{}, Exclude: c.Exclude}
		for i := range s.st.Exclude {
			s.st.Exclude[i].Expires = expiry(workflow.Now(ctx), s.st.Exclude[i].TTL)
		}
	}
	s.log = log.With(workflow.GetLogger(ctx), "stream", s.id)
	return s.run(ctx)
}

type stream struct {
	id      string
	raw     json.RawMessage
	cfg     config.Stream
	st      *StreamState
	log     log.Logger
	reports workflow.ReceiveChannel
}

func (s *stream) run(ctx workflow.Context) error {
	if err := workflow.SetQueryHandler(ctx, QueryStatus, s.status); err != nil {
		return err
	}
	if err := workflow.SetQueryHandler(ctx, activities.QueryExclusions, func() ([]config.Exclusion, error) {
		return s.exclusions(workflow.Now(ctx)), nil
	}); err != nil {
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
	if !s.st.SourceStream {
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
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, SAStream.ValueSet(s.id)); err != nil {
		s.log.Warn("search attributes not updated", "error", err)
	}
	for {
		if err := ctx.Err(); err != nil {
			// Cancelled: the tablets (abandoned children) stop by
			// themselves when their next report finds the stream closed.
			return temporal.NewCanceledError("stream cancelled")
		}
		if err := s.refresh(ctx, actx); err != nil {
			return err
		}
		s.details(ctx)
		refresh := workflow.NewTimer(ctx, s.cfg.TopologyRefresh.D())
		for waiting := true; waiting; {
			sel := workflow.NewSelector(ctx)
			sel.AddFuture(refresh, func(workflow.Future) { waiting = false })
			sel.AddReceive(s.reports, func(ch workflow.ReceiveChannel, _ bool) {
				var r TabletStatus
				ch.Receive(ctx, &r)
				s.onReport(ctx, r)
			})
			sel.Select(ctx)
			s.details(ctx)
			if workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
				return s.continueAsNew(ctx)
			}
		}
	}
}

// continueAsNew drains the signal channel, waits for handlers, and starts
// the next run with the state.
func (s *stream) continueAsNew(ctx workflow.Context) error {
	for {
		var r TabletStatus
		if !s.reports.ReceiveAsync(&r) {
			break
		}
		s.onReport(ctx, r)
	}
	if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
		return err
	}
	return workflow.NewContinueAsNewError(ctx, StreamWorkflow, s.raw, s.st)
}

// onReport records a tablet's report; a split starts the children.
func (s *stream) onReport(ctx workflow.Context, r TabletStatus) {
	if r.ID == "" {
		s.reject(ctx, SignalTabletReport, "report without a tablet id")
		return
	}
	prev := s.st.Tablets[r.ID]
	s.st.Tablets[r.ID] = &r
	if r.State == Split && (prev == nil || prev.State != Split) {
		handoff, err := source.ParseCheckpoint(r.Handoff)
		if err != nil {
			s.log.Error("split report with a bad hand-off", "tablet", r.ID, "error", err)
			return
		}
		s.startTablets(ctx, r.Children, handoff)
	}
}

// refresh lists the tablets and starts a workflow for each one the stream
// does not track and may start: a first-generation tablet, or one whose
// parent is gone from the topology or has split in this stream. Children
// of a parent still being read wait for its split report.
func (s *stream) refresh(ctx, actx workflow.Context) error {
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
	listed := map[string]bool{}
	for _, t := range tablets {
		listed[t.ID] = true
	}
	var start []string
	for _, t := range tablets {
		if s.st.Tablets[t.ID] != nil {
			continue
		}
		if p := s.st.Tablets[t.Parent]; t.Parent == "" || !listed[t.Parent] || (p != nil && p.State == Split) {
			start = append(start, t.ID)
		}
	}
	s.startTablets(ctx, start, source.Checkpoint{})
	return nil
}

// startTablets starts TabletWorkflows (ABANDON, deterministic IDs),
// adopting any that is already running.
func (s *stream) startTablets(ctx workflow.Context, ids []string, start source.Checkpoint) {
	type started struct {
		id  string
		fut workflow.ChildWorkflowFuture
	}
	var futs []started
	total := len(s.st.Tablets) + len(ids)
	for _, id := range ids {
		if s.st.Tablets[id] != nil {
			continue
		}
		s.st.Tablets[id] = &TabletStatus{ID: id, State: Starting, Checkpoint: start.String()}
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:        TabletWorkflowID(s.id, id),
			ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_ABANDON,
			StaticSummary:     fmt.Sprintf("tablet %s of stream %s", id, s.id),
			TypedSearchAttributes: temporal.NewSearchAttributes(
				SAStream.ValueSet(s.id), SATablet.ValueSet(id), SAState.ValueSet(string(Starting)), SAReplica.ValueSet("")),
		})
		fut := workflow.ExecuteChildWorkflow(cctx, TabletWorkflow, TabletInput{
			Stream: s.id, Tablet: id, Config: s.cfg, Start: start, Tablets: total,
		}, (*TabletState)(nil))
		futs = append(futs, started{id, fut})
	}
	for _, f := range futs {
		var exec workflow.Execution
		err := f.fut.GetChildWorkflowExecution().Get(ctx, &exec)
		switch {
		case err == nil:
			s.log.Info("tablet workflow started", "tablet", f.id, "workflowID", exec.ID)
		case temporal.IsWorkflowExecutionAlreadyStartedError(err):
			s.log.Info("adopting the running tablet workflow", "tablet", f.id)
		default:
			s.st.Tablets[f.id].State = Failed
			s.st.Tablets[f.id].Reason = "tablet workflow did not start: " + err.Error()
		}
	}
}

// exclusions returns the operator exclude list without expired entries.
func (s *stream) exclusions(now time.Time) []config.Exclusion {
	out := []config.Exclusion{}
	for _, e := range s.st.Exclude {
		if e.Expires.IsZero() || now.Before(e.Expires) {
			out = append(out, e)
		}
	}
	return out
}

// status is the `status` query.
func (s *stream) status() (StreamStatus, error) {
	out := StreamStatus{Stream: s.id, Tablets: []TabletStatus{}, Exclude: s.st.Exclude, Rejected: s.st.Rejected}
	if out.Exclude == nil {
		out.Exclude = []config.Exclusion{}
	}
	if out.Rejected == nil {
		out.Rejected = []Rejected{}
	}
	for _, t := range s.st.Tablets {
		out.Tablets = append(out.Tablets, *t)
	}
	slices.SortFunc(out.Tablets, func(a, b TabletStatus) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// reject records a bad signal payload: logged and shown in the status,
// never a failed workflow.
func (s *stream) reject(ctx workflow.Context, signal, reason string) {
	s.log.Warn("signal rejected", "signal", signal, "reason", reason)
	s.st.Rejected = append(s.st.Rejected, Rejected{Signal: signal, Reason: reason, At: workflow.Now(ctx)})
	if len(s.st.Rejected) > maxRejected {
		s.st.Rejected = s.st.Rejected[len(s.st.Rejected)-maxRejected:]
	}
}

// details says in words how the stream is doing, for the Web UI.
func (s *stream) details(ctx workflow.Context) {
	counts := map[State]int{}
	var records int64
	for _, t := range s.st.Tablets {
		counts[t.State]++
		records += t.Records
	}
	var parts []string
	for _, st := range []State{Streaming, Retrying, NoEligibleReplica, Paused, Starting, Split, Expired, Failed} {
		if n := counts[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	workflow.SetCurrentDetails(ctx, fmt.Sprintf("stream **%s**: %d tablets (%s), %d records written",
		s.id, len(s.st.Tablets), strings.Join(parts, ", "), records))
}

// expiry turns a TTL into an instant (zero: never).
func expiry(now time.Time, ttl config.Duration) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	return now.Add(ttl.D())
}
