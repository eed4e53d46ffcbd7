package workflows

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// A resync gives one tablet a fresh source-side start and a copy of its
// rows, while the stream's other tablets go on (source.Resyncer). The
// operator names tablets whose workflow has ended (Expired, Failed,
// Stopped), or that run (Streaming, Retrying, NoEligibleReplica,
// Paused): those the stream first tells to stop (a final commit), and
// goes on once their Stopped report comes. Each is Resyncing while the
// Resync activity makes its new start (pending in StreamState.Resyncs, carried across continue-as-new,
// and made again by the next run under the same id, which the source
// answers with the same start), and then starts a new workflow from it,
// as a retry does. Its source delivers a resync-begin marker, the rows,
// and a resync-end marker: a sink or a consumer drops the tablet's
// earlier state by them (docs/sinks.md).

// Resyncing is the state of a tablet whose fresh start the stream is
// making (no workflow of the tablet runs meanwhile).
const Resyncing State = "Resyncing"

// ResyncRequest is the resync command's payload.
type ResyncRequest struct {
	Tablets []string `json:"tablets"`
	Reason  string   `json:"reason,omitempty"`
}

// PendingResync is a resync whose start is being made.
type PendingResync struct {
	Tablet string `json:"tablet"`
	// ID names the resync at the source: the same id answers the same
	// start.
	ID     string `json:"id"`
	Reason string `json:"reason,omitempty"`
	// From is the state the tablet was in, restored if the resync fails.
	From State `json:"from"`
	// Stopping: the tablet was running; the stream told it to stop and
	// waits for its terminal report before it makes the fresh start.
	Stopping bool `json:"stopping,omitempty"`
}

// resyncResult is what a Resync activity came back with.
type resyncResult struct {
	Tablet string            `json:"tablet"`
	ID     string            `json:"id"`
	Start  source.Checkpoint `json:"start"`
	Err    string            `json:"err,omitempty"`
}

// resyncable are the states a tablet may be resynced from: ended, or
// running (stopped first).
var (
	resyncable = []State{Expired, Failed, Stopped}
	stoppable  = []State{Streaming, Retrying, NoEligibleReplica, Paused}
)

func (s *stream) resync(ctx workflow.Context, raw json.RawMessage, apply bool) error {
	var req ResyncRequest
	if err := decodeCommand(raw, &req); err != nil {
		return err
	}
	if len(req.Tablets) == 0 {
		return fmt.Errorf("tablets: name the tablets to resync (a resync copies each tablet's rows again)")
	}
	if len(req.Reason) > maxReasonBytes {
		return fmt.Errorf("reason: %d bytes, at most %d", len(req.Reason), maxReasonBytes)
	}
	if err := validateTablets(req.Tablets, s.st.Tablets); err != nil {
		return err
	}
	if k := config.SourceKinds()[s.cfg.Source.Kind]; !k.Resync {
		return fmt.Errorf("source kind %q cannot resync a tablet", s.cfg.Source.Kind)
	}
	if s.st.Stop != nil {
		return fmt.Errorf("the stream is stopping; resync restarts tablets of a running stream")
	}
	if !s.durable() {
		return fmt.Errorf("this stream's run predates resync: it takes one after its next continue-as-new")
	}
	for i, id := range req.Tablets {
		st := s.st.Tablets[id].State
		switch {
		case s.resyncing(id):
			return fmt.Errorf("tablets[%d]: %s is being resynced already", i, id)
		case slices.Contains(stoppable, st) && s.pending[id] != nil:
			return fmt.Errorf("tablets[%d]: %s is still starting; resync it once it runs", i, id)
		case !slices.Contains(resyncable, st) && !slices.Contains(stoppable, st):
			return fmt.Errorf("tablets[%d]: %s is %s; resync takes a tablet that is %v, or that runs (%v)", i, id, st, resyncable, stoppable)
		}
	}
	if !apply {
		return nil
	}
	if workflow.GetVersion(ctx, changeResync, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		// Replayed from before it (a resync signal an older worker left
		// unread): refused rather than issue commands the history lacks.
		return fmt.Errorf("this stream's run predates resync: ask again")
	}
	var stop []string
	for _, id := range s.named(ctx, req.Tablets) {
		row := s.st.Tablets[id]
		s.st.ResyncSeq++
		p := PendingResync{Tablet: id, ID: fmt.Sprintf("%s/%d", id, s.st.ResyncSeq), Reason: req.Reason, From: row.State}
		if terminal(row.State) {
			s.st.Resyncs = append(s.st.Resyncs, p)
			s.makeStart(ctx, &s.st.Resyncs[len(s.st.Resyncs)-1], row)
			continue
		}
		p.Stopping = true
		s.st.Resyncs = append(s.st.Resyncs, p)
		stop = append(stop, id)
		row.Reason, row.Updated = p.said("resync asked by the operator: stopping it first (a final commit)"), workflow.Now(ctx)
	}
	s.tell(ctx, stop, TabletCommand{Kind: CmdStop})
	return nil
}

// resyncing reports whether a resync of tablet id is pending.
func (s *stream) resyncing(id string) bool {
	return slices.ContainsFunc(s.st.Resyncs, func(p PendingResync) bool { return p.Tablet == id })
}

// afterReport goes on with the resync of a running tablet once its
// report says it has ended: a split tablet's resync is dropped (its
// children carry its rows), any other goes on to its fresh start.
func (s *stream) afterReport(ctx workflow.Context, id string) {
	i := slices.IndexFunc(s.st.Resyncs, func(p PendingResync) bool { return p.Tablet == id && p.Stopping })
	row := s.st.Tablets[id]
	if i < 0 || row == nil || !terminal(row.State) {
		return
	}
	if row.State == Split {
		s.st.Resyncs = slices.Delete(s.st.Resyncs, i, i+1)
		row.Reason += "; the resync asked for it was dropped: the tablet split, its children carry its rows"
		return
	}
	s.makeStart(ctx, &s.st.Resyncs[i], row)
}

// makeStart makes the tablet of p, whose workflow has ended, Resyncing
// and runs its Resync activity; a failed one puts it back in the state
// it is in now.
func (s *stream) makeStart(ctx workflow.Context, p *PendingResync, row *TabletStatus) {
	p.Stopping, p.From = false, row.State
	row.State, row.Updated = Resyncing, workflow.Now(ctx)
	row.Reason = p.said("resync asked by the operator: making its fresh start at the source")
	s.makeResync(*p)
}

// said is what, followed by the operator's reason for the resync.
func (p PendingResync) said(what string) string {
	if p.Reason == "" {
		return what
	}
	return what + " (" + p.Reason + ")"
}

// makeResync runs the Resync activity of p beside the stream's loop and
// sends what it came back with to s.resynced.
func (s *stream) makeResync(p PendingResync) {
	if s.resynced == nil || p.Stopping {
		return // made by the loop's start (resumeResyncs), or once stopped
	}
	var a *activities.Activities
	r := resyncResult{Tablet: p.Tablet, ID: p.ID}
	var after source.Checkpoint // the tablet's last checkpoint
	if row := s.st.Tablets[p.Tablet]; row != nil {
		after = row.Checkpoint
	}
	s.besideLoop(s.loopCtx, 0, workflow.ActivityOptions{
		StartToCloseTimeout: 5 * time.Minute, Summary: "resync tablet " + p.Tablet + ": its fresh start at the source",
		RetryPolicy: &temporal.RetryPolicy{MaximumInterval: 30 * time.Second, NonRetryableErrorTypes: activities.NonRetryable},
	}, a.Resync, activities.ResyncInput{Stream: s.id, Source: s.cfg.Source, Tablet: p.Tablet, ID: p.ID, After: after}, &r.Start,
		func(ctx workflow.Context, err error) {
			if err != nil {
				r.Err = rootMessage(err)
			}
			s.resynced.Send(ctx, r)
		})
}

// resumeResyncs makes the resyncs an earlier run left pending, and tells
// a tablet still to stop for one to stop again (a continue-as-new may
// have come before its report).
func (s *stream) resumeResyncs(ctx workflow.Context) {
	var stop []string
	for _, p := range slices.Clone(s.st.Resyncs) {
		switch {
		case !p.Stopping:
			s.makeResync(p)
		case terminal(s.st.Tablets[p.Tablet].State):
			s.afterReport(ctx, p.Tablet)
		default:
			stop = append(stop, p.Tablet)
		}
	}
	s.tell(ctx, stop, TabletCommand{Kind: CmdStop})
}

// resyncedStart reports whether a child starts at its tablet's last
// resync's start.
func (s *stream) resyncedStart(c childStart) bool {
	row := s.st.Tablets[c.id]
	return row != nil && row.Resyncs > 0 && c.start == row.Start
}

// onResynced starts the tablet's new workflow from its fresh start (or,
// for a failed resync, puts it back in the state it was in, saying why).
func (s *stream) onResynced(ctx workflow.Context, r resyncResult) {
	i := slices.IndexFunc(s.st.Resyncs, func(p PendingResync) bool { return p.Tablet == r.Tablet && p.ID == r.ID })
	if i < 0 {
		return
	}
	p := s.st.Resyncs[i]
	s.st.Resyncs = slices.Delete(s.st.Resyncs, i, i+1)
	row := s.st.Tablets[r.Tablet]
	row.Updated = workflow.Now(ctx)
	if r.Err != "" {
		s.log.Warn("resync failed", "tablet", r.Tablet, "error", r.Err)
		row.State, row.LastError = p.From, r.Err
		row.Reason = "resync failed: " + r.Err
		return
	}
	row.Checkpoint, row.Start, row.Resyncs = r.Start, r.Start, row.Resyncs+1
	if s.st.Stop != nil {
		row.State, row.Reason = Stopped, "stopped by the operator before its resync's workflow started (its fresh start is made)"
		return
	}
	row.State, row.LastError = Starting, ""
	row.Reason = p.said(fmt.Sprintf("resynced by the operator: copying its rows from %s", r.Start))
	s.log.Info("resync made; starting the tablet's new workflow", "tablet", r.Tablet, "start", r.Start)
	// The resync is the operator's word for the tablet now: a pause asked
	// before (one that let it expire) is lifted.
	s.setPaused(false, r.Tablet)
	s.startChildren(ctx, []childStart{{id: r.Tablet, start: r.Start, retry: true,
		state: &TabletState{Status: *row, Checkpoint: r.Start, Intents: true}}})
}
