package metrics

import (
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetrics "go.temporal.io/sdk/client"
)

// sdkLabels are the tags the Temporal SDK puts on its metrics. Every SDK
// metric gets all of them (absent ones empty), because Prometheus wants one
// label set per metric name; other tags are dropped.
var sdkLabels = []string{"namespace", "client_name", "worker_type", "poller_type", "workflow_type",
	"activity_type", "task_queue", "operation", "failure_reason", "cause", "nexus_service", "nexus_operation"}

// SDKHandler adapts the Temporal SDK's metrics to Prometheus.
type SDKHandler struct {
	r    *sdkRegistry
	tags map[string]string
}

type sdkRegistry struct {
	reg      prometheus.Registerer
	mu       sync.Mutex
	counters map[string]*prometheus.CounterVec
	gauges   map[string]*prometheus.GaugeVec
	timers   map[string]*prometheus.HistogramVec
}

var _ sdkmetrics.MetricsHandler = SDKHandler{}

// NewSDKHandler returns a handler registering the SDK's metrics with reg.
func NewSDKHandler(reg prometheus.Registerer) SDKHandler {
	return SDKHandler{r: &sdkRegistry{reg: reg, counters: map[string]*prometheus.CounterVec{},
		gauges: map[string]*prometheus.GaugeVec{}, timers: map[string]*prometheus.HistogramVec{}}}
}

// WithTags returns a handler adding tags.
func (h SDKHandler) WithTags(tags map[string]string) sdkmetrics.MetricsHandler {
	t := maps.Clone(h.tags)
	if t == nil {
		t = map[string]string{}
	}
	maps.Copy(t, tags)
	return SDKHandler{r: h.r, tags: t}
}

func (h SDKHandler) labels() []string {
	out := make([]string, len(sdkLabels))
	for i, l := range sdkLabels {
		out[i] = h.tags[l]
	}
	return out
}

func name(n string) string { return strings.ReplaceAll(n, ".", "_") }

// Counter returns a counter.
func (h SDKHandler) Counter(n string) sdkmetrics.MetricsCounter {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	v := h.r.counters[n]
	if v == nil {
		v = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name(n), Help: "Temporal SDK counter " + n}, sdkLabels)
		if err := h.r.reg.Register(v); err != nil {
			return nop{}
		}
		h.r.counters[n] = v
	}
	return counter{v.WithLabelValues(h.labels()...)}
}

// Gauge returns a gauge.
func (h SDKHandler) Gauge(n string) sdkmetrics.MetricsGauge {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	v := h.r.gauges[n]
	if v == nil {
		v = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name(n), Help: "Temporal SDK gauge " + n}, sdkLabels)
		if err := h.r.reg.Register(v); err != nil {
			return nop{}
		}
		h.r.gauges[n] = v
	}
	return gauge{v.WithLabelValues(h.labels()...)}
}

// Timer returns a timer, as a histogram in seconds.
func (h SDKHandler) Timer(n string) sdkmetrics.MetricsTimer {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	v := h.r.timers[n]
	if v == nil {
		v = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name(n) + "_seconds", Help: "Temporal SDK timer " + n,
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, sdkLabels)
		if err := h.r.reg.Register(v); err != nil {
			return nop{}
		}
		h.r.timers[n] = v
	}
	return timer{v.WithLabelValues(h.labels()...)}
}

type counter struct{ c prometheus.Counter }

func (c counter) Inc(n int64) { c.c.Add(float64(n)) }

type gauge struct{ g prometheus.Gauge }

func (g gauge) Update(v float64) { g.g.Set(v) }

type timer struct{ o prometheus.Observer }

func (t timer) Record(d time.Duration) { t.o.Observe(d.Seconds()) }

// nop is returned when a name clashes with a metric of another kind.
type nop struct{}

func (nop) Inc(int64)            {}
func (nop) Update(float64)       {}
func (nop) Record(time.Duration) {}
