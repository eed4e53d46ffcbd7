package main

import (
	"context"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/workflows"
)

// stages splits one exclude trial into where its time went, from the
// workflows' histories: each stage is the latest, over the last three
// tablets to leave the replica (by tabletd's account), of when it happened
// (seconds after the signal was sent). Reading every moved tablet's
// history takes a while at hundreds of tablets: stages_read_s measures
// it.
type stages struct {
	// StreamTook: the stream recorded the exclude signal.
	StreamTook float64 `json:"stream_took_signal_s"`
	// OldClosed: the tablets' GetChanges on the excluded replica closed.
	OldClosed float64 `json:"old_getchanges_closed_s"`
	// The next three are over the tablets that did not move in place.
	// NewScheduled: their next GetChanges was scheduled (after the pick).
	NewScheduled float64 `json:"new_getchanges_scheduled_s"`
	// NewStarted: a worker started it.
	NewStarted float64 `json:"new_getchanges_started_s"`
	// TaskWait: how long the workflow task that reacts to the old
	// GetChanges closing waited for a worker to start it (seconds).
	TaskWait float64 `json:"workflow_task_wait_s"`
	// Moved: the tablets heard from their GetChanges that it moved to
	// another replica in place (its progress signal); the three stages
	// before it stay 0 for a move in place.
	Moved float64 `json:"moved_in_place_signal_s"`
	// InPlace: how many of the last three moved in place.
	InPlace int `json:"moved_in_place"`
	// Last: the last tablets to leave by tabletd's account, slowest first.
	Last []straggler `json:"last_to_leave"`
	// ReadS: how long reading the histories for these stages took.
	ReadS float64 `json:"stages_read_s"`
}

// stagesOf reads the stream's and the moved tablets' histories.
func (b *bed) stagesOf(id string, tablets []string, t0 time.Time) stages {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	since := func(t time.Time) float64 { return round(t.Sub(t0).Seconds()) }
	var s stages
	it := b.temporal.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			break
		}
		if a := ev.GetWorkflowExecutionSignaledEventAttributes(); a != nil && a.GetSignalName() == workflows.CmdExclude && ev.GetEventTime().AsTime().After(t0) {
			s.StreamTook = since(ev.GetEventTime().AsTime())
			break
		}
	}
	for _, tab := range tablets {
		wid := workflows.TabletWorkflowID(id, tab)
		it := b.temporal.GetWorkflowHistory(ctx, wid, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		var closed, scheduled, moved time.Time
		var wftStarted time.Time
		for it.HasNext() {
			ev, err := it.Next()
			if err != nil {
				break
			}
			at := ev.GetEventTime().AsTime()
			if at.Before(t0) {
				continue
			}
			if ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED && !closed.IsZero() && wftStarted.IsZero() {
				wftStarted = at
			}
			if a := ev.GetWorkflowExecutionSignaledEventAttributes(); a != nil && a.GetSignalName() == activities.SignalProgress && moved.IsZero() {
				var p activities.Progress
				if converter.GetDefaultDataConverter().FromPayloads(a.GetInput(), &p) == nil && p.Switched != nil {
					moved = at
				}
			}
			switch ev.GetEventType() {
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED,
				enumspb.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, enumspb.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
				if closed.IsZero() {
					closed = at
				}
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
				if !closed.IsZero() && scheduled.IsZero() {
					scheduled = at
				}
			}
		}
		if !moved.IsZero() {
			// Moved in place: the stages of a new run do not apply (a
			// run that ended by itself meanwhile is no part of it).
			s.Moved = max(s.Moved, since(moved))
			s.InPlace++
			continue
		}
		s.OldClosed = max(s.OldClosed, since(closed))
		if !closed.IsZero() && !wftStarted.IsZero() {
			s.TaskWait = max(s.TaskWait, round(wftStarted.Sub(closed).Seconds()))
		}
		s.NewScheduled = max(s.NewScheduled, since(scheduled))
		if d, err := b.temporal.DescribeWorkflow(ctx, wid, ""); err == nil {
			for _, p := range d.RawResponse.GetPendingActivities() {
				if st := p.GetLastStartedTime(); st != nil && st.AsTime().After(t0) {
					s.NewStarted = max(s.NewStarted, since(st.AsTime()))
				}
			}
		}
	}
	return s
}
