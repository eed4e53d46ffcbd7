package activities

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/source"
)

// describer is a fake Temporal client: each workflow ID's latest run's
// status (absent: not found), and the status query's answer of each.
type describer struct {
	status  map[string]enumspb.WorkflowExecutionStatus
	attempt map[string]int32 // the pending workflow task's attempt
	final   map[string]string
	failing string // describing this ID fails
}

func (d *describer) SignalWorkflow(context.Context, string, string, string, any) error { return nil }

func (d *describer) QueryWorkflow(_ context.Context, id, runID, query string, _ ...any) (converter.EncodedValue, error) {
	if runID != "run-"+id || query != "status" {
		return nil, errors.New("unexpected query")
	}
	f, ok := d.final[id]
	if !ok {
		return nil, errors.New("query failed: no worker")
	}
	return rawValue(f), nil
}

func (d *describer) DescribeWorkflow(_ context.Context, id, _ string) (*client.WorkflowExecutionDescription, error) {
	if id == d.failing {
		return nil, serviceerror.NewUnavailable("frontend down")
	}
	st, ok := d.status[id]
	if !ok {
		return nil, serviceerror.NewNotFound("workflow not found")
	}
	return &client.WorkflowExecutionDescription{RawResponse: &workflowservice.DescribeWorkflowExecutionResponse{
		WorkflowExecutionInfo: &workflowpb.WorkflowExecutionInfo{
			Execution: &commonpb.WorkflowExecution{WorkflowId: id, RunId: "run-" + id}, Status: st,
		},
		PendingWorkflowTask: &workflowpb.PendingWorkflowTaskInfo{Attempt: d.attempt[id]},
	}}, nil
}

// rawValue is a query answer holding JSON.
type rawValue string

func (v rawValue) HasValue() bool { return v != "" }
func (v rawValue) Get(ptr any) error {
	return json.Unmarshal([]byte(v), ptr)
}

func TestCheckTabletsReportsClosedTabletsWithTheirFinalStatus(t *testing.T) {
	d := &describer{
		status: map[string]enumspb.WorkflowExecutionStatus{
			"s/tablet/t-1": enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING,
			"s/tablet/t-2": enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED,
			"s/tablet/t-3": enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED,
			"s/tablet/t-5": enumspb.WORKFLOW_EXECUTION_STATUS_TIMED_OUT,
			"s/tablet/t-6": enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING,
			"s/tablet/t-7": enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING,
		},
		// t-6's workflow task keeps failing (a panic); t-7's failed once.
		attempt: map[string]int32{"s/tablet/t-6": 5, "s/tablet/t-7": 2},
		final:   map[string]string{"s/tablet/t-3": `{"id":"t-3","state":"Split"}`, "s/tablet/t-2": `{"id":"t-2","state":"Streaming"}`},
	}
	a := &Activities{Client: d}
	var refs []TabletRef
	for _, id := range []string{"t-1", "t-2", "t-3", "t-4", "t-5", "t-6", "t-7"} {
		refs = append(refs, TabletRef{Tablet: id, WorkflowID: "s/tablet/" + id})
	}
	got, err := a.CheckTablets(context.Background(), CheckTabletsInput{Tablets: refs, StatusQuery: "status"})
	require.NoError(t, err)
	byTablet := map[string]ClosedTablet{}
	for _, c := range got {
		byTablet[c.Tablet] = c
	}
	// A running tablet is not reported; every other one is, with how it
	// closed and its last status where a query can read it.
	require.Equal(t, map[string]ClosedTablet{
		"t-2": {Tablet: "t-2", Status: "Terminated", Final: json.RawMessage(`{"id":"t-2","state":"Streaming"}`)},
		"t-3": {Tablet: "t-3", Status: "Completed", Final: json.RawMessage(`{"id":"t-3","state":"Split"}`)},
		"t-4": {Tablet: "t-4", Status: "NotFound"},
		"t-5": {Tablet: "t-5", Status: "TimedOut"},
		"t-6": {Tablet: "t-6", Status: TaskFailing, TaskAttempts: 5},
	}, byTablet)
}

func TestCheckTabletsFailsWholeWhenADescribeFails(t *testing.T) {
	d := &describer{status: map[string]enumspb.WorkflowExecutionStatus{"s/tablet/t-1": enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED}, failing: "s/tablet/t-2"}
	a := &Activities{Client: d}
	_, err := a.CheckTablets(context.Background(), CheckTabletsInput{Tablets: []TabletRef{
		{Tablet: "t-1", WorkflowID: "s/tablet/t-1"}, {Tablet: "t-2", WorkflowID: "s/tablet/t-2"},
	}})
	// Nothing is decided on a partial picture: the stream tries again.
	require.ErrorContains(t, err, "frontend down")
}

func TestTopologyOfKeepsTabletsParentsAndEachAliasOnce(t *testing.T) {
	got := TopologyOf([]source.Tablet{
		{ID: "t-1", Replicas: []source.Replica{{Alias: "zone2-2", Cell: "zone2", Healthy: true}, {Alias: "zone1-1"}}},
		{ID: "t-2", Parent: "t-1", Replicas: []source.Replica{{Alias: "zone1-1"}}},
	})
	require.Equal(t, Topology{
		Tablets: []TopologyTablet{{ID: "t-1"}, {ID: "t-2", Parent: "t-1"}},
		Aliases: []string{"zone1-1", "zone2-2"},
	}, got)
	require.Equal(t, Topology{Tablets: []TopologyTablet{}, Aliases: []string{}}, TopologyOf(nil), "empty, never null")
}
