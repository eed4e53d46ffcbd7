package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"
)

// WorkflowDescriber describes workflow executions; client.Client is one.
type WorkflowDescriber interface {
	DescribeWorkflow(ctx context.Context, workflowID, runID string) (*client.WorkflowExecutionDescription, error)
}

// TabletRef names a tablet and its workflow.
type TabletRef struct {
	Tablet     string `json:"tablet"`
	WorkflowID string `json:"workflowID"`
}

// CheckTabletsInput lists the tablets a stream believes are running.
type CheckTabletsInput struct {
	Tablets []TabletRef `json:"tablets"`
	// StatusQuery is the query that returns a tablet's status.
	StatusQuery string `json:"statusQuery"`
}

// ClosedTablet is a tablet whose workflow is not running, or is stuck.
type ClosedTablet struct {
	Tablet string `json:"tablet"`
	// Status is how its latest run closed ("Completed", "Terminated",
	// "TimedOut", "Failed", "Canceled", or "NotFound"), or TaskFailing: it
	// runs, but its workflow task has failed TaskAttempts times in a row
	// (a panic in workflow code, a non-determinism after an upgrade), so
	// it is stuck where it is.
	Status       string `json:"status"`
	TaskAttempts int32  `json:"taskAttempts,omitempty"`
	// Final is the closed run's last status (its status query), when it
	// could be read: a terminal report the stream never received is in it.
	Final json.RawMessage `json:"final,omitempty"`
}

// checkParallel bounds the describe calls CheckTablets runs at once.
const checkParallel = 8

// TaskFailing is ClosedTablet.Status of a tablet whose workflow task has
// failed at least taskFailingAttempts times in a row.
const (
	TaskFailing         = "TaskFailing"
	taskFailingAttempts = 3
)

// CheckTablets describes each tablet's workflow (its latest run) and
// returns those that are not running, with their final status where it
// can be read. The stream calls it on every topology refresh, so that a
// tablet that closed without a terminal report — terminated, reset, timed
// out — never stays "Streaming" in its status.
func (a *Activities) CheckTablets(ctx context.Context, in CheckTabletsInput) ([]ClosedTablet, error) {
	d, ok := a.Client.(WorkflowDescriber)
	if !ok {
		a.logger().Warn("check tablets: the Temporal client cannot describe workflows; skipped")
		return nil, nil
	}
	var (
		mu     sync.Mutex
		closed []ClosedTablet
		errs   []error
		wg     sync.WaitGroup
		slots  = make(chan struct{}, checkParallel)
	)
	for _, ref := range in.Tablets {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			c, err := a.checkTablet(ctx, d, ref, in.StatusQuery)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("tablet %s: %w", ref.Tablet, err))
			case c != nil:
				closed = append(closed, *c)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errors.Join(errs...) // retried; nothing is decided on a partial picture
	}
	return closed, nil
}

func (a *Activities) checkTablet(ctx context.Context, d WorkflowDescriber, ref TabletRef, query string) (*ClosedTablet, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	desc, err := d.DescribeWorkflow(dctx, ref.WorkflowID, "")
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return &ClosedTablet{Tablet: ref.Tablet, Status: "NotFound"}, nil
	}
	if err != nil {
		return nil, err
	}
	info := desc.RawResponse.GetWorkflowExecutionInfo()
	st := info.GetStatus()
	if st == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING || st == enumspb.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW {
		if n := desc.RawResponse.GetPendingWorkflowTask().GetAttempt(); n >= taskFailingAttempts {
			return &ClosedTablet{Tablet: ref.Tablet, Status: TaskFailing, TaskAttempts: n}, nil
		}
		return nil, nil
	}
	c := &ClosedTablet{Tablet: ref.Tablet, Status: closeStatus(st)}
	if query != "" {
		// A closed workflow still answers queries (a worker replays it).
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		v, err := a.Client.QueryWorkflow(qctx, ref.WorkflowID, info.GetExecution().GetRunId(), query)
		if err == nil {
			var raw json.RawMessage
			if err = v.Get(&raw); err == nil {
				c.Final = raw
			}
		}
		if err != nil {
			a.logger().Info("check tablets: closed tablet's status not readable", zap.String("tablet", ref.Tablet), zap.Error(err))
		}
	}
	return c, nil
}

// closeStatus names a closed workflow's status in words.
func closeStatus(s enumspb.WorkflowExecutionStatus) string {
	switch s {
	case enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED:
		return "Completed"
	case enumspb.WORKFLOW_EXECUTION_STATUS_FAILED:
		return "Failed"
	case enumspb.WORKFLOW_EXECUTION_STATUS_CANCELED:
		return "Canceled"
	case enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED:
		return "Terminated"
	case enumspb.WORKFLOW_EXECUTION_STATUS_TIMED_OUT:
		return "TimedOut"
	}
	return s.String()
}
