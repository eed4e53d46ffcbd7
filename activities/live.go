package activities

import (
	"context"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"
	"golang.org/x/sync/errgroup"

	"github.com/tabletflow/tabletflow/source"
)

// Live status (docs/operating.md#live-status): a running GetChanges
// records its progress as of its last commit in its heartbeat, which the
// worker sends to the server (no history event). ReadLive reads it back
// from each running tablet's workflow description; the stream workflow
// does so every statusRefresh for its status query and memo
// (ReadLiveFigures), and starter status once per refresh.

// LiveFigures is what a tablet's pending GetChanges run says of itself.
type LiveFigures struct {
	Tablet string `json:"tablet"`
	// Checkpoint, Records, Batches and LagSeconds are the run's as of its
	// last commit (Records and Batches: this run's only).
	Checkpoint source.Checkpoint `json:"checkpoint"`
	Records    int64             `json:"records,omitempty"`
	Batches    int64             `json:"batches,omitempty"`
	LagSeconds float64           `json:"lagSeconds,omitempty"`
	// LastCommit is when the run last committed (by the worker's clock);
	// zero: not since it began.
	LastCommit time.Time `json:"lastCommit,omitzero"`
	// At is when the server got the heartbeat.
	At time.Time `json:"at"`
	// Running: a worker runs the attempt now (not one waiting for its
	// retry or for a worker).
	Running bool `json:"running,omitempty"`
	// Failing: the run's predecessor failed and it has not committed
	// since (its heartbeat carries the error).
	Failing bool `json:"failing,omitempty"`
	// Totals are the tablet's records and batches with the run's, where
	// the run was told what the tablet had counted before it (none: a
	// run started by a tablet workflow from before Counted).
	Totals *Counted `json:"totals,omitempty"`
}

// ReadLiveInput names a stream's running tablets.
type ReadLiveInput struct {
	// WorkflowPrefix is the tablets' workflow ID without the tablet's
	// ID (workflows.TabletWorkflowID(stream, "")).
	WorkflowPrefix string   `json:"workflowPrefix"`
	Tablets        []string `json:"tablets"`
}

// liveCalls bounds the describes in flight at once.
const liveCalls = 32

// ReadLive describes each tablet's workflow and returns the figures of
// its pending GetChanges run, in the order of in.Tablets. A tablet with
// no pending run that heartbeat, or whose workflow could not be
// described, has none: a read that fails shows older figures, never an
// error.
func ReadLive(ctx context.Context, d WorkflowDescriber, dc converter.DataConverter, in ReadLiveInput) []LiveFigures {
	if dc == nil {
		dc = converter.GetDefaultDataConverter()
	}
	found := make([]*LiveFigures, len(in.Tablets))
	var g errgroup.Group // its errors stay nil: a tablet not described has no figures
	g.SetLimit(liveCalls)
	for i, tablet := range in.Tablets {
		g.Go(func() error {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			desc, err := d.DescribeWorkflow(dctx, in.WorkflowPrefix+tablet, "")
			if err != nil || desc.RawResponse == nil {
				return nil
			}
			for _, pa := range desc.RawResponse.GetPendingActivities() {
				if pa.GetActivityType().GetName() != "GetChanges" || pa.GetHeartbeatDetails() == nil {
					continue
				}
				var hb Heartbeat
				if dc.FromPayloads(pa.GetHeartbeatDetails(), &hb) != nil {
					continue
				}
				found[i] = &LiveFigures{
					Tablet: tablet, Checkpoint: hb.Checkpoint, Records: hb.Records, Batches: hb.Batches,
					LagSeconds: hb.LagSeconds, LastCommit: hb.LastSuccess, At: pa.GetLastHeartbeatTime().AsTime(),
					Running: pa.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED,
					Failing: hb.LastError != "",
				}
				if c := hb.Counted; c != nil {
					found[i].Totals = &Counted{Records: c.Records + hb.Records, Batches: c.Batches + hb.Batches}
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	out := []LiveFigures{}
	for _, f := range found {
		if f != nil {
			out = append(out, *f)
		}
	}
	return out
}

// readLiveFor bounds one ReadLiveFigures: what it has read by then it
// returns, well within its activity's 30 s start-to-close timeout.
const readLiveFor = 20 * time.Second

// ReadLiveFigures is ReadLive as an activity, for the stream's status
// query and memo.
func (a *Activities) ReadLiveFigures(ctx context.Context, in ReadLiveInput) ([]LiveFigures, error) {
	d, ok := a.Client.(WorkflowDescriber)
	if !ok {
		a.logger().Warn("read live figures: the Temporal client cannot describe workflows; skipped")
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, readLiveFor)
	defer cancel()
	return ReadLive(ctx, d, a.DataConverter, in), nil
}
