package promscrape

import (
	"math"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
)

// The quantile is of the window between two scrapes, merged over labels,
// and rounds up to its bucket's bound.
func TestQuantileOfAWindowMergesLabelsAndRoundsUpToTheBucket(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lag_seconds", Buckets: []float64{0.1, 0.5, 1, 2}}, []string{"stream"})
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "acks_total"}, []string{"stream"})
	reg.MustRegister(h, c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	for range 50 { // before the window: slow, must not count
		h.WithLabelValues("a").Observe(1.5)
	}
	before, err := Get(srv.URL)
	require.NoError(t, err)
	for i := range 100 {
		stream := []string{"a", "b"}[i%2]
		v := 0.05
		if i >= 98 { // the slowest 2 %
			v = 0.7
		}
		h.WithLabelValues(stream).Observe(v)
		c.WithLabelValues(stream).Inc()
	}
	after, err := Get(srv.URL)
	require.NoError(t, err)

	p98, n := Quantile(before, after, "lag_seconds", 0.98)
	require.Equal(t, uint64(100), n)
	require.Equal(t, 0.1, p98)
	p99, _ := Quantile(before, after, "lag_seconds", 0.99)
	require.Equal(t, 1.0, p99, "0.7 is in the bucket up to 1")
	require.Equal(t, 100.0, Delta(before, after, "acks_total"))
	require.Equal(t, map[float64]uint64{0.1: 98, 0.5: 98, 1: 100, 2: 100, math.Inf(1): 100},
		Buckets(before, after, "lag_seconds"), "the window's observations by bucket, the 50 before it left out")
	require.Nil(t, Buckets(before, after, "no_such_seconds"))
	none, n := Quantile(after, after, "lag_seconds", 0.99)
	require.True(t, math.IsNaN(none))
	require.Zero(t, n)
}

// Sum adds up only the samples whose labels pass the filter.
func TestSumKeepsOnlyTheSamplesWhoseLabelsPass(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "records_total"}, []string{"stream", "tablet"})
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lag_seconds"}, []string{"tablet"})
	reg.MustRegister(c, g)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	c.WithLabelValues("a", "t-1").Add(5)
	c.WithLabelValues("a", "t-2").Add(7)
	c.WithLabelValues("b", "t-2").Add(100)
	g.WithLabelValues("t-1").Set(2.5)

	s, err := Get(srv.URL)
	require.NoError(t, err)
	require.Equal(t, 112.0, s.Sums["records_total"])
	require.Equal(t, 12.0, s.Sum("records_total", func(l map[string]string) bool { return l["stream"] == "a" }))
	require.Equal(t, 7.0, s.Sum("records_total", func(l map[string]string) bool { return l["stream"] == "a" && l["tablet"] != "t-1" }))
	require.Equal(t, 2.5, s.Sum("lag_seconds", func(map[string]string) bool { return true }))
	require.Zero(t, s.Sum("missing_total", func(map[string]string) bool { return true }))
}
