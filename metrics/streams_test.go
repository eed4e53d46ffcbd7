package metrics

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// The seconds since the last commit of a stream are its worst run's on
// this worker: a run starts at its last commit (a retry's predecessor's),
// each commit resets it, and a run that ends is left out (a stream with
// none left is not reported), even when another run of the same tablet
// is still on (an attempt that outlived its timeout).
func TestSecondsSinceLastCommitIsTheStreamsWorstRun(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	m.runs.now = func() time.Time { return now }

	t1 := m.RunStarted("orders", now.Add(-40*time.Second)) // a retry: its last commit was 40 s ago
	t2 := m.RunStarted("orders", now)
	items := m.RunStarted("items", now.Add(-3*time.Second))
	require.Equal(t, map[string]float64{"orders/": 40, "items/": 3}, series(scrape(t, reg), "tabletflow_seconds_since_last_commit"))

	t1.Committed(now.Add(-time.Second))
	now = now.Add(10 * time.Second)
	require.Equal(t, map[string]float64{"orders/": 11, "items/": 13}, series(scrape(t, reg), "tabletflow_seconds_since_last_commit"),
		"t1 committed: t2, 10 s without one, is the worst")

	again := m.RunStarted("orders", now) // t2's next attempt, while t2 is still on
	items.Ended()
	t2.Ended()
	require.Equal(t, map[string]float64{"orders/": 11}, series(scrape(t, reg), "tabletflow_seconds_since_last_commit"))
	t1.Ended()
	again.Ended()
	require.Empty(t, series(scrape(t, reg), "tabletflow_seconds_since_last_commit"))

	var off *Metrics
	require.NotPanics(t, func() {
		r := off.RunStarted("orders", now)
		r.Committed(now)
		r.Ended()
	})
}

// Tablets not streaming are the list's counts, per running stream; the
// list runs at most every streamsEvery, and a failed one leaves the gauge
// out until a list works.
func TestTabletsNotStreamingAreTheListsCountsReadEvery10s(t *testing.T) {
	reg := prometheus.NewRegistry()
	counts := map[string]int{"orders": 4, "items": 0}
	var lists int
	var fail error
	g := &streamGauge{now: time.Now, list: func(context.Context) (map[string]int, error) {
		lists++
		return counts, fail
	}}
	reg.MustRegister(g)
	want := map[string]float64{"orders/": 4, "items/": 0}
	require.Equal(t, want, series(scrape(t, reg), "tabletflow_tablets_not_streaming"))
	counts = map[string]int{"orders": 0}
	require.Equal(t, want, series(scrape(t, reg), "tabletflow_tablets_not_streaming"), "within streamsEvery: the last list's")
	require.Equal(t, 1, lists)

	g.tried = g.tried.Add(-streamsEvery)
	fail = errors.New("visibility down")
	require.Empty(t, series(scrape(t, reg), "tabletflow_tablets_not_streaming"), "a failed list: no series")
	g.tried = g.tried.Add(-streamsEvery)
	fail = nil
	require.Equal(t, map[string]float64{"orders/": 0}, series(scrape(t, reg), "tabletflow_tablets_not_streaming"),
		"the next list: a stream that ended is gone")
	require.Equal(t, 3, lists)
}
