package main

import (
	"context"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/workflows"
)

// Live status (docs/operating.md#live-status): the stream's status query
// shows its running tablets' figures as of its last read of their
// heartbeats (every statusRefresh). starter status reads them once more,
// so that what it shows is as fresh as the server's heartbeats: one
// describe per running tablet per refresh, no history event.

// withLive is st with each running tablet's pending run read now, where
// that is past what st shows.
func withLive(ctx context.Context, c client.Client, dc converter.DataConverter, st workflows.StreamStatus) workflows.StreamStatus {
	var ids []string
	for _, t := range st.Tablets {
		if workflows.MayRun(t.State) {
			ids = append(ids, t.ID)
		}
	}
	if len(ids) == 0 {
		return st
	}
	figures := activities.ReadLive(ctx, c, dc, activities.ReadLiveInput{WorkflowPrefix: workflows.TabletWorkflowID(st.Stream, ""), Tablets: ids})
	return workflows.WithLive(st, figures)
}

// liveAge is how old each live row's heartbeat is at now.
func liveAge(st workflows.StreamStatus, now time.Time) map[string]time.Duration {
	age := map[string]time.Duration{}
	for _, t := range st.Tablets {
		if t.Live != nil {
			age[t.ID] = max(now.Sub(t.Live.At), 0)
		}
	}
	return age
}
