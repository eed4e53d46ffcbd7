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
//   - tabletflow_seconds_since_last_commit{stream}: of the GetChanges runs
//     this worker has, the longest time since one's last sink commit. A
//     run commits after every read, one that found nothing too (its
//     checkpoint may move), so an idle tablet stays within about
//     batch.maxWait; a run whose reads or sink hang grows. A retry
//     attempt starts from its predecessor's last commit. A tablet between
//     runs, or with none (NoEligibleReplica, Stuck, ...), is not here: see
//     the next gauge. Each worker reports its own runs: the stream's worst
//     is the max over the workers.
//   - tabletflow_tablets_not_streaming{stream}: the stream's tablets that
//     are not streaming, for every running stream of the namespace, as the
//     worker's StreamStates counts them (from each stream's memo), read at
//     most every streamsEvery. Every worker with metrics reports every
//     stream: take the max over the workers.

// Run is one GetChanges run on this worker, for
// tabletflow_seconds_since_last_commit (nil when metrics are off).
type Run struct {
	clock  *runClock
	stream string
	last   time.Time // guarded by clock.mu
}

// runClock keeps the last commit of each run this worker has, by stream.
type runClock struct {
	mu   sync.Mutex
	runs map[string]map[*Run]bool
	now  func() time.Time
}

// RunStarted notes a run of a tablet of stream on this worker, whose last
// commit (a retry attempt's predecessor's, else the run's start) was at
// last. End it with Ended.
func (m *Metrics) RunStarted(stream string, last time.Time) *Run {
	if m == nil {
		return nil
	}
	c := m.runs
	r := &Run{clock: c, stream: stream, last: last}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs[stream] == nil {
		c.runs[stream] = map[*Run]bool{}
	}
	c.runs[stream][r] = true
	return r
}

// Committed notes the run's sink commit at.
func (r *Run) Committed(at time.Time) {
	if r == nil {
		return
	}
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	r.last = at
}

// Ended forgets the run.
func (r *Run) Ended() {
	if r == nil {
		return
	}
	c := r.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.runs[r.stream], r)
	if len(c.runs[r.stream]) == 0 {
		delete(c.runs, r.stream)
	}
}

var sinceCommitDesc = prometheus.NewDesc("tabletflow_seconds_since_last_commit",
	"Of the stream's GetChanges runs this worker has, the longest time since one's last sink commit (a read that found nothing commits too). Take the max over workers.",
	[]string{"stream"}, nil)

func (c *runClock) Describe(ch chan<- *prometheus.Desc) { ch <- sinceCommitDesc }

func (c *runClock) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for stream, runs := range c.runs {
		var worst time.Duration
		for r := range runs {
			worst = max(worst, now.Sub(r.last))
		}
		ch <- prometheus.MustNewConstMetric(sinceCommitDesc, prometheus.GaugeValue, worst.Seconds(), stream)
	}
}

// StreamStates counts, for each running stream of the namespace, its
// tablets that are not streaming.
type StreamStates func(ctx context.Context) (map[string]int, error)

// streamsEvery: the list behind tablets_not_streaming runs at most this
// often; scrapes in between get its last answer.
const streamsEvery = 10 * time.Second

// streamsTimeout bounds the list at a scrape.
const streamsTimeout = 5 * time.Second

// Streams registers tabletflow_tablets_not_streaming, read with list. A
// list that fails leaves the gauge out of the scrape (its absence is what
// an alert on it sees), and is tried again at the next one after
// streamsEvery. One scrape lists at a time; another meanwhile gets the
// last answer.
func Streams(reg prometheus.Registerer, list StreamStates) {
	reg.MustRegister(&streamGauge{list: list, now: time.Now})
}

var notStreamingDesc = prometheus.NewDesc("tabletflow_tablets_not_streaming",
	"The stream's tablets that are not streaming (every state but Streaming and Split), as its memo counts them; every worker with metrics reports every running stream of the namespace.",
	[]string{"stream"}, nil)

type streamGauge struct {
	list StreamStates
	now  func() time.Time

	listing sync.Mutex // held by the scrape that lists
	mu      sync.Mutex // guards the rest
	tried   time.Time
	counts  map[string]int // nil: the last list failed
}

func (g *streamGauge) Describe(ch chan<- *prometheus.Desc) { ch <- notStreamingDesc }

func (g *streamGauge) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	due := g.tried.IsZero() || g.now().Sub(g.tried) >= streamsEvery
	g.mu.Unlock()
	if due && g.listing.TryLock() {
		ctx, cancel := context.WithTimeout(context.Background(), streamsTimeout)
		counts, err := g.list(ctx)
		cancel()
		g.mu.Lock()
		g.tried, g.counts = g.now(), counts
		if err != nil {
			g.counts = nil
		}
		g.mu.Unlock()
		g.listing.Unlock()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, stream := range slices.Sorted(maps.Keys(g.counts)) {
		ch <- prometheus.MustNewConstMetric(notStreamingDesc, prometheus.GaugeValue, float64(g.counts[stream]), stream)
	}
}
