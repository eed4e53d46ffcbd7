package metrics

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// The seconds since the last commit of a stream are its worst running
// tablet's on this worker: a tablet's run starts at its last commit,
// each commit resets it, and a run that ends takes its tablet out (a
// stream with none left is not reported).
func TestSecondsSinceLastCommitIsTheStreamsWorstRunningTablet(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	m.runs.now = func() time.Time { return now }

	m.RunStarted("orders", "t1", now.Add(-40*time.Second)) // a retry: its last commit was 40 s ago
	m.RunStarted("orders", "t2", now)
	m.RunStarted("items", "t1", now.Add(-3*time.Second))
	require.Equal(t, map[string]float64{"orders/": 40, "items/": 3}, series(scrape(t, reg), "tabletflow_seconds_since_last_commit"))

	m.CommittedAt("orders", "t1", now.Add(-time.Second))
	now = now.Add(10 * time.Second)
	require.Equal(t, map[string]float64{"orders/": 11, "items/": 13}, series(scrape(t, reg), "tabletflow_seconds_since_last_commit"),
		"t1 committed: t2, 10 s without one, is the worst")

	m.RunEnded("items", "t1")
	m.RunEnded("orders", "t2")
	require.Equal(t, map[string]float64{"orders/": 11}, series(scrape(t, reg), "tabletflow_seconds_since_last_commit"))

	var nilM *Metrics
	require.NotPanics(t, func() {
		nilM.RunStarted("orders", "t1", now)
		nilM.CommittedAt("orders", "t1", now)
		nilM.RunEnded("orders", "t1")
	})
}

// Tablets not streaming count every state but Streaming and Split, per
// running stream (one with no counts yet: 0); the list runs at most every
// streamsEvery, and a failed one leaves the gauge out until a list works.
func TestTabletsNotStreamingCountsTheMemosStatesButStreamingAndSplit(t *testing.T) {
	reg := prometheus.NewRegistry()
	states := map[string]map[string]int{
		"orders": {"Streaming": 5, "Retrying": 1, "NoEligibleReplica": 2, "Split": 1, "Expired": 1},
		"items":  {"Streaming": 3},
		"new":    {},
	}
	var lists int
	var fail error
	g := &streamGauge{now: time.Now, list: func(context.Context) (map[string]map[string]int, error) {
		lists++
		return states, fail
	}}
	reg.MustRegister(g)
	want := map[string]float64{"orders/": 4, "items/": 0, "new/": 0}
	require.Equal(t, want, series(scrape(t, reg), "tabletflow_tablets_not_streaming"))
	states = map[string]map[string]int{"orders": {"Streaming": 10}}
	require.Equal(t, want, series(scrape(t, reg), "tabletflow_tablets_not_streaming"), "within streamsEvery: the last list's")
	require.Equal(t, 1, lists)

	g.read = g.read.Add(-streamsEvery)
	fail = errors.New("visibility down")
	require.Empty(t, series(scrape(t, reg), "tabletflow_tablets_not_streaming"), "a failed list: no series")
	fail = nil
	require.Equal(t, map[string]float64{"orders/": 0}, series(scrape(t, reg), "tabletflow_tablets_not_streaming"),
		"the next scrape lists again: a stream that ended is gone")
	require.Equal(t, 3, lists)
}
