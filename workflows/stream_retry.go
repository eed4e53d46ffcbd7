package workflows

import (
	"encoding/json"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/source"
)

// A Failed tablet's terminal report reaches the stream before its
// workflow has closed (the tablet confirms the report first). A retry in
// between cannot start the new workflow under the tablet's ID, and
// adopting the closing one left the row Starting with no workflow behind
// it (changeRetryAfterClose): the stream waits for the old one to close
// instead, and then starts the new one.

// retryCheck is how often the stream asks whether the previous workflows
// of retried tablets have closed, while any waits for that.
const retryCheck = 2 * time.Second

// waitForClose records that the operator's retry of tablet id found its
// previous workflow still running: the tablet's new workflow starts once
// that one has closed (restartRetried).
func (s *stream) waitForClose(id string) {
	s.st.Tablets[id].Reason = "retried by the operator: waits for its previous workflow to close"
	if !slices.Contains(s.st.Retried, id) {
		s.st.Retried = append(s.st.Retried, id)
	}
	s.checkRetried()
}

// checkRetried checks the previous workflows of the retried tablets every
// retryCheck while any waits, in a workflow goroutine beside the stream's
// loop, and sends the closed ones it finds to s.retried.
func (s *stream) checkRetried() {
	if s.checkingRetried || len(s.st.Retried) == 0 || s.retried == nil {
		return
	}
	s.checkingRetried = true
	workflow.Go(s.loopCtx, func(ctx workflow.Context) {
		defer func() { s.checkingRetried = false }()
		var a *activities.Activities
		cctx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: time.Minute, Summary: "check the previous workflows of retried tablets",
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 10 * time.Second, MaximumAttempts: 3},
		})
		for len(s.st.Retried) > 0 {
			if err := workflow.Sleep(ctx, retryCheck); err != nil {
				return
			}
			var refs []activities.TabletRef
			for _, id := range s.st.Retried {
				refs = append(refs, activities.TabletRef{Tablet: id, WorkflowID: TabletWorkflowID(s.id, id)})
			}
			var closed []activities.ClosedTablet
			if err := workflow.ExecuteActivity(cctx, a.CheckTablets, activities.CheckTabletsInput{Tablets: refs, StatusQuery: QueryStatus}).Get(ctx, &closed); err != nil {
				s.log.Warn("checking the previous workflows of retried tablets failed; again shortly", "error", err)
				s.checkFailed(ctx, err)
				continue
			}
			s.st.Checks = nil
			if len(closed) > 0 {
				s.retried.Send(ctx, closed)
			}
		}
	})
}

// restartRetried starts the new workflow of each retried tablet whose
// previous workflow closed: from the later of its checkpoint and the
// closed one's, keeping its counters and its own start.
func (s *stream) restartRetried(ctx workflow.Context, closed []activities.ClosedTablet) {
	var starts []childStart
	for _, c := range closed {
		row := s.st.Tablets[c.Tablet]
		if !slices.Contains(s.st.Retried, c.Tablet) || c.Status == activities.TaskFailing || row == nil {
			continue
		}
		s.st.Retried = slices.DeleteFunc(s.st.Retried, func(id string) bool { return id == c.Tablet })
		var final TabletStatus
		if len(c.Final) > 0 && json.Unmarshal(c.Final, &final) == nil && final.ID == c.Tablet {
			row.Checkpoint = source.Max(row.Checkpoint, final.Checkpoint)
			row.Records, row.Batches = max(row.Records, final.Records), max(row.Batches, final.Batches)
			row.Seq = max(row.Seq, final.Seq)
		}
		if s.st.Stop != nil && s.keepsIntents(ctx) {
			// A stopping stream starts no tablet workflow
			// (changeOperatorIntents).
			row.State, row.Reason, row.Updated = Stopped, "stopped by the operator before its retry started", workflow.Now(ctx)
			continue
		}
		row.Reason, row.Updated = "retried by the operator", workflow.Now(ctx)
		s.log.Info("the retried tablet's previous workflow closed; starting its new one", "tablet", c.Tablet, "checkpoint", row.Checkpoint)
		starts = append(starts, childStart{id: c.Tablet, start: row.Start, retry: true,
			state: &TabletState{Status: *row, Checkpoint: row.Checkpoint, Intents: true, Stop: s.st.Stop != nil, Pause: s.intentOf(c.Tablet).pause}})
	}
	s.startChildren(ctx, starts)
}

// retryAfterClose reports whether a retry waits for the tablet's previous
// workflow to close (changeRetryAfterClose). Asked for only when a retry
// finds it still running.
func (s *stream) retryAfterClose(ctx workflow.Context) bool {
	return s.retried != nil && workflow.GetVersion(ctx, changeRetryAfterClose, workflow.DefaultVersion, 1) >= 1
}
