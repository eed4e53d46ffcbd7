package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/testbed/promscrape"
)

// scrape serves reg as a worker does and reads its /metrics page.
func scrape(t *testing.T, reg *prometheus.Registry) promscrape.Scrape {
	t.Helper()
	addr, stop, err := Serve("127.0.0.1:0", reg)
	require.NoError(t, err)
	defer stop()
	s, err := promscrape.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	return s
}

// series is name's samples by "stream/tablet".
func series(s promscrape.Scrape, name string) map[string]float64 {
	out := map[string]float64{}
	for _, v := range s.Series[name] {
		out[v.Labels["stream"]+"/"+v.Labels["tablet"]] = v.Value
	}
	return out
}

func TestSlotStatsAreExportedAsSlotLagAndRetentionHeadroomBytes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.SlotStats("orders", "s1", 4096, 16<<20)
	m.SlotStats("orders", "s2", 0, -1) // no max_slot_wal_keep_size
	m.SlotStats("items", "s1", 123, 0) // at the limit: the next WAL invalidates it

	s := scrape(t, reg)
	require.Equal(t, map[string]float64{"orders/s1": 4096, "orders/s2": 0, "items/s1": 123}, series(s, "tabletflow_slot_lag_bytes"))
	require.Equal(t, map[string]float64{"orders/s1": 16 << 20, "items/s1": 0}, series(s, "tabletflow_retention_headroom_bytes"),
		"no headroom series for a slot without a limit")

	// The latest reading wins; a limit lifted leaves no stale headroom.
	m.SlotStats("orders", "s1", 8192, -1)
	m.SlotStats("orders", "s2", 10, 1<<20)
	s = scrape(t, reg)
	require.Equal(t, map[string]float64{"orders/s1": 8192, "orders/s2": 10, "items/s1": 123}, series(s, "tabletflow_slot_lag_bytes"))
	require.Equal(t, map[string]float64{"orders/s2": 1 << 20, "items/s1": 0}, series(s, "tabletflow_retention_headroom_bytes"))
}

func TestNilMetricsRecordNothing(t *testing.T) {
	var m *Metrics
	require.NotPanics(t, func() { m.SlotStats("orders", "s1", 1, 1) })
}
