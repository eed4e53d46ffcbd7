// Package promscrape reads a worker's Prometheus metrics for the
// benchmarks: counters summed over their labels, and histograms merged
// over their labels so that a window's quantile comes from two scrapes.
package promscrape

import (
	"fmt"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one reading of a /metrics page.
type Scrape struct {
	At time.Time
	// Sums: each counter's or gauge's samples summed over their labels,
	// and each histogram's sample count.
	Sums map[string]float64
	// Histograms: each histogram's cumulative bucket counts by upper
	// bound, summed over its labels.
	Histograms map[string]map[float64]uint64
	// Series: each counter's and gauge's samples one by one, with their
	// labels (see Sum).
	Series map[string][]Sample
}

// Sample is one counter or gauge sample.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Sum adds up name's samples whose labels keep accepts.
func (s Scrape) Sum(name string, keep func(labels map[string]string) bool) float64 {
	var sum float64
	for _, v := range s.Series[name] {
		if keep(v.Labels) {
			sum += v.Value
		}
	}
	return sum
}

// Get scrapes url.
func Get(url string) (Scrape, error) {
	out := Scrape{At: time.Now(), Sums: map[string]float64{}, Histograms: map[string]map[float64]uint64{}, Series: map[string][]Sample{}}
	resp, err := http.Get(url)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("%s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return out, err
	}
	for name, f := range families {
		for _, m := range f.Metric {
			switch {
			case m.Counter != nil, m.Gauge != nil:
				v := m.Counter.GetValue() + m.Gauge.GetValue() // the other is nil: 0
				out.Sums[name] += v
				labels := make(map[string]string, len(m.Label))
				for _, l := range m.Label {
					labels[l.GetName()] = l.GetValue()
				}
				out.Series[name] = append(out.Series[name], Sample{Labels: labels, Value: v})
			case m.Histogram != nil:
				out.Sums[name] += float64(m.Histogram.GetSampleCount())
				h := out.Histograms[name]
				if h == nil {
					h = map[float64]uint64{}
					out.Histograms[name] = h
				}
				inf := false
				for _, b := range m.Histogram.Bucket {
					h[b.GetUpperBound()] += b.GetCumulativeCount()
					inf = inf || math.IsInf(b.GetUpperBound(), 1)
				}
				if !inf { // the text format lists +Inf; other sources may not
					h[math.Inf(1)] += m.Histogram.GetSampleCount()
				}
			}
		}
	}
	return out, nil
}

// Delta is what name's sum grew by from before to after.
func Delta(before, after Scrape, name string) float64 {
	return after.Sums[name] - before.Sums[name]
}

// Buckets returns the observations histogram name got between before and
// after, cumulative by bucket upper bound (+Inf: all of them); nil when
// after has no such histogram.
func Buckets(before, after Scrape, name string) map[float64]uint64 {
	a, b := after.Histograms[name], before.Histograms[name]
	if len(a) == 0 {
		return nil
	}
	out := make(map[float64]uint64, len(a))
	for ub, n := range a {
		out[ub] = n - b[ub]
	}
	return out
}

// Quantile returns the upper bound of the bucket that holds the q-quantile
// of the observations histogram name got between before and after (an
// upper bound of the quantile: never flattering), and their count. With
// no observations it returns NaN.
func Quantile(before, after Scrape, name string, q float64) (float64, uint64) {
	window := Buckets(before, after, name)
	bounds := make([]float64, 0, len(window))
	for ub := range window {
		bounds = append(bounds, ub)
	}
	sort.Float64s(bounds)
	total := window[math.Inf(1)]
	if total == 0 {
		return math.NaN(), 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	for _, ub := range bounds {
		if window[ub] >= rank {
			return ub, total
		}
	}
	return math.Inf(1), total
}
