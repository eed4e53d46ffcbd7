// Package metrics is what a worker exposes to Prometheus: tabletflow's own
// per-stream, per-tablet metrics, and the Temporal SDK's metrics through a
// handler adapter.
package metrics

import (
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are tabletflow's own metrics. A nil *Metrics records nothing, so
// activities need no checks.
type Metrics struct {
	Records    *prometheus.CounterVec
	Batches    *prometheus.CounterVec
	Lag        *prometheus.GaugeVec
	Headroom   *prometheus.GaugeVec
	Slot       *prometheus.GaugeVec
	SlotSafe   *prometheus.GaugeVec
	Retries    *prometheus.CounterVec
	Exclusions *prometheus.CounterVec
	Selections *prometheus.CounterVec
	Latency    *prometheus.HistogramVec
	CommitLag  *prometheus.HistogramVec
	Acks       *prometheus.CounterVec
	runs       *runClock
}

// New registers tabletflow's metrics with reg.
func New(reg prometheus.Registerer) *Metrics {
	f := func(c prometheus.Collector) prometheus.Collector { reg.MustRegister(c); return c }
	st := []string{"stream", "tablet"}
	runs := &runClock{runs: map[string]map[*Run]bool{}, now: time.Now}
	reg.MustRegister(runs)
	return &Metrics{
		runs: runs,
		Records: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tabletflow_records_written_total",
			Help: "Records written to the sink and committed."}, st)).(*prometheus.CounterVec),
		Batches: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tabletflow_batches_written_total",
			Help: "Sink commits (with the group commit one may hold several reads; a read that only moves the checkpoint counts too)."}, st)).(*prometheus.CounterVec),
		Lag: f(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tabletflow_lag_seconds",
			Help: "0 when the tablet's last poll was caught up, else now minus the commit time of the newest record written."}, st)).(*prometheus.GaugeVec),
		Headroom: f(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tabletflow_retention_headroom_seconds",
			Help: "Time left before the source expires the tablet for this stream: its retention less the time since the last successful poll."}, st)).(*prometheus.GaugeVec),
		Slot: f(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tabletflow_slot_lag_bytes",
			Help: "Sources that keep history in a slot (PostgreSQL): WAL the replica's slot holds for the stream, past the committed checkpoint."}, st)).(*prometheus.GaugeVec),
		SlotSafe: f(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tabletflow_retention_headroom_bytes",
			Help: "Sources that keep history in a slot (PostgreSQL): WAL that may still be written before the replica's slot is invalidated (safe_wal_size); absent when the server sets no limit."}, st)).(*prometheus.GaugeVec),
		Retries: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tabletflow_retries_total",
			Help: "GetChanges failures retried on the same replica, by error code."}, append(st, "code"))).(*prometheus.CounterVec),
		Exclusions: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tabletflow_exclusions_total",
			Help: "Reads moved off a replica by an exclusion: automatic (retry elsewhere) or operator."}, append(st, "kind"))).(*prometheus.CounterVec),
		Selections: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tabletflow_selections_total",
			Help: "Replicas picked by the tablet picker, by cell."}, []string{"stream", "cell"})).(*prometheus.CounterVec),
		Latency: f(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tabletflow_getchanges_seconds",
			Help:    "From sending the first read of a sink commit to the commit: the long-poll wait, the group commit's linger and the commit included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"stream"})).(*prometheus.HistogramVec),
		CommitLag: f(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tabletflow_commit_lag_seconds",
			Help:    "Per sink commit holding records: when it became durable less the source commit time of its oldest record (the commit's worst record).",
			Buckets: commitLagBuckets}, []string{"stream"})).(*prometheus.HistogramVec),
		Acks: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tabletflow_acks_total",
			Help: "Checkpoint acknowledgements sent to the source."}, []string{"stream"})).(*prometheus.CounterVec),
	}
}

// commitLagBuckets are fine around the linger and the second (the lag a
// live stream is judged by), and reach a minute.
var commitLagBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.25, 1.5, 2, 3, 5, 10, 30, 60}

// SlotStats records a slot's lag and headroom in bytes; a negative safe
// (the server sets no limit) removes the tablet's headroom, so that none
// from an earlier limit stays behind.
func (m *Metrics) SlotStats(stream, tablet string, lag, safe int64) {
	if m == nil {
		return
	}
	m.Slot.WithLabelValues(stream, tablet).Set(float64(lag))
	if safe >= 0 {
		m.SlotSafe.WithLabelValues(stream, tablet).Set(float64(safe))
	} else {
		m.SlotSafe.DeleteLabelValues(stream, tablet)
	}
}

// Batch records one committed batch.
func (m *Metrics) Batch(stream, tablet string, records int, took time.Duration, lag float64, headroom time.Duration) {
	if m == nil {
		return
	}
	m.Records.WithLabelValues(stream, tablet).Add(float64(records))
	m.Batches.WithLabelValues(stream, tablet).Inc()
	m.Lag.WithLabelValues(stream, tablet).Set(lag)
	m.Latency.WithLabelValues(stream).Observe(took.Seconds())
	if headroom > 0 {
		m.Headroom.WithLabelValues(stream, tablet).Set(headroom.Seconds())
	}
}

// Committed records a commit's lag: from the source commit time of its
// oldest record to now.
func (m *Metrics) Committed(stream string, lag time.Duration) {
	if m != nil {
		m.CommitLag.WithLabelValues(stream).Observe(lag.Seconds())
	}
}

// Acked records an acknowledgement sent to the source.
func (m *Metrics) Acked(stream string) {
	if m != nil {
		m.Acks.WithLabelValues(stream).Inc()
	}
}

// Retry records a retry-same failure, and the retention left since the
// last successful poll.
func (m *Metrics) Retry(stream, tablet, code string, headroom time.Duration) {
	if m == nil {
		return
	}
	m.Retries.WithLabelValues(stream, tablet, code).Inc()
	if headroom != 0 {
		m.Headroom.WithLabelValues(stream, tablet).Set(headroom.Seconds())
	}
}

// Excluded records a read moved off a replica; kind is "automatic" or
// "operator".
func (m *Metrics) Excluded(stream, tablet, kind string) {
	if m != nil {
		m.Exclusions.WithLabelValues(stream, tablet, kind).Inc()
	}
}

// Selected records a pick.
func (m *Metrics) Selected(stream, cell string) {
	if m != nil {
		m.Selections.WithLabelValues(stream, cell).Inc()
	}
}

// Serve serves reg's metrics on addr at /metrics until the listener
// closes; it returns the bound address (addr may end in :0).
func Serve(addr string, reg *prometheus.Registry) (string, func() error, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	// Go's profiles, for "where does the worker's CPU go" (the metrics
	// address is an operator's port, off unless set).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the worker goes on without metrics
		}
	}()
	return lis.Addr().String(), srv.Close, nil
}

// SinkSyncs registers the JSONL sink's sync calls, read from syncs
// (jsonl.Syncs): syncfs(2)s of the group sync, and fdatasync(2)s.
func SinkSyncs(reg prometheus.Registerer, syncs func() (syncfs, datasync uint64)) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tabletflow_jsonl_syncfs_total",
			Help: "syncfs(2) calls of the JSONL sink's group sync: one makes the commits of every tablet waiting on the filesystem durable."},
			func() float64 { s, _ := syncs(); return float64(s) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tabletflow_jsonl_fdatasync_total",
			Help: "fdatasync(2) calls of the JSONL sink's commits: a file synced on its own."},
			func() float64 { _, d := syncs(); return float64(d) }))
}
