package metrics

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Two per-stream gauges for alerting, computed when Prometheus scrapes:
//
//   - tabletflow_seconds_since_last_commit{stream}: of the tablets whose
//     GetChanges run this worker has, the longest time since one's last
//     sink commit. A run commits after every read, one that found nothing
//     too (its checkpoint may move), so an idle tablet stays within about
//     batch.maxWait; a tablet whose reads or sink hang grows. A tablet
//     between runs, or with none (Retrying, Stuck, ...), is not here: see
//     the next gauge. Each worker reports its own tablets: the stream's
//     worst is the max over the workers.
//   - tabletflow_tablets_not_streaming{stream}: the stream's tablets in any
//     state but Streaming and Split (a split tablet's children stream in
//     its place), as the stream's memo counts them (tabletStates), for
//     every running stream of the namespace, read with one visibility list
//     at most every streamsEvery. Every worker with metrics reports every
//     stream: take the max over the workers.

// runClock keeps the last commit of each tablet whose run this worker has.
type runClock struct {
	mu   sync.Mutex
	last map[string]map[string]time.Time // by stream, by tablet
	now  func() time.Time
}

// RunStarted notes a run of tablet on this worker whose last commit (its
// run's, or its tablet's last run's) was at last.
func (m *Metrics) RunStarted(stream, tablet string, last time.Time) {
	m.committedAt(stream, tablet, last)
}

// CommittedAt notes a run's sink commit at.
func (m *Metrics) CommittedAt(stream, tablet string, at time.Time) { m.committedAt(stream, tablet, at) }

func (m *Metrics) committedAt(stream, tablet string, at time.Time) {
	if m == nil {
		return
	}
	c := m.runs
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last[stream] == nil {
		c.last[stream] = map[string]time.Time{}
	}
	c.last[stream][tablet] = at
}

// RunEnded forgets tablet's run on this worker.
func (m *Metrics) RunEnded(stream, tablet string) {
	if m == nil {
		return
	}
	c := m.runs
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.last[stream], tablet)
	if len(c.last[stream]) == 0 {
		delete(c.last, stream)
	}
}

var sinceCommitDesc = prometheus.NewDesc("tabletflow_seconds_since_last_commit",
	"Of the stream's tablets whose GetChanges run this worker has, the longest time since one's last sink commit (a read that found nothing commits too). Take the max over workers.",
	[]string{"stream"}, nil)

func (c *runClock) Describe(ch chan<- *prometheus.Desc) { ch <- sinceCommitDesc }

func (c *runClock) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for stream, tablets := range c.last {
		var worst time.Duration
		for _, at := range tablets {
			worst = max(worst, now.Sub(at))
		}
		ch <- prometheus.MustNewConstMetric(sinceCommitDesc, prometheus.GaugeValue, worst.Seconds(), stream)
	}
}

// StreamStates lists the namespace's running streams, each with its
// tablets counted by state (the stream's memo, tabletStates).
type StreamStates func(ctx context.Context) (map[string]map[string]int, error)

// streamsEvery: the visibility list behind tablets_not_streaming runs at
// most this often; scrapes in between get its last answer.
const streamsEvery = 10 * time.Second

// streamsTimeout bounds the list at a scrape.
const streamsTimeout = 5 * time.Second

// Streams registers tabletflow_tablets_not_streaming, read with list.
// A list that fails leaves the gauge out of the scrape (its absence is
// what an alert on it sees), and is tried again at the next one.
func Streams(reg prometheus.Registerer, list StreamStates) {
	reg.MustRegister(&streamGauge{list: list, now: time.Now})
}

var notStreamingDesc = prometheus.NewDesc("tabletflow_tablets_not_streaming",
	"The stream's tablets in a state other than Streaming and Split, as its memo counts them (tabletStates); every worker with metrics reports every running stream of the namespace.",
	[]string{"stream"}, nil)

type streamGauge struct {
	list StreamStates
	now  func() time.Time

	mu     sync.Mutex
	read   time.Time
	states map[string]map[string]int
}

func (g *streamGauge) Describe(ch chan<- *prometheus.Desc) { ch <- notStreamingDesc }

func (g *streamGauge) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.states == nil || g.now().Sub(g.read) >= streamsEvery {
		ctx, cancel := context.WithTimeout(context.Background(), streamsTimeout)
		states, err := g.list(ctx)
		cancel()
		if err != nil {
			g.states = nil
			return
		}
		g.states, g.read = states, g.now()
	}
	for _, stream := range slices.Sorted(maps.Keys(g.states)) {
		n := 0
		for state, count := range g.states[stream] {
			if state != "Streaming" && state != "Split" {
				n += count
			}
		}
		ch <- prometheus.MustNewConstMetric(notStreamingDesc, prometheus.GaugeValue, float64(n), stream)
	}
}
