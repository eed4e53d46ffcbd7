package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/testbed/promscrape"
)

// scrape reads the worker's metrics: the sum of each family's samples
// (a histogram's sample count).
func scrape(url string) (map[string]float64, error) {
	m, err := promscrape.Get(url)
	return m.Sums, err
}

func TestWorkerMetricsMoveWhileStreaming(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "200")
	e.startWorker()
	e.streamAll("metrics", 4)

	var first map[string]float64
	e.eventually("records counted", 30*time.Second, func() (bool, string) {
		m, err := scrape(e.metrics)
		if err != nil {
			return false, err.Error()
		}
		first = m
		return m["tabletflow_records_written_total"] > 0, fmt.Sprint(m["tabletflow_records_written_total"])
	})
	for _, name := range []string{"tabletflow_batches_written_total", "tabletflow_getchanges_seconds",
		"tabletflow_selections_total", "tabletflow_retention_headroom_seconds", "tabletflow_lag_seconds",
		"tabletflow_jsonl_syncfs_total", "tabletflow_jsonl_fdatasync_total"} {
		_, ok := first[name]
		require.True(t, ok, "metric %s exported", name)
	}
	require.Positive(t, first["tabletflow_selections_total"])
	require.Positive(t, first["tabletflow_retention_headroom_seconds"], "headroom is the retention while polled")
	sdk := 0
	for name := range first {
		if len(name) > 9 && name[:9] == "temporal_" {
			sdk++
		}
	}
	require.Positive(t, sdk, "the Temporal SDK's metrics are exported too")

	e.eventually("counters move", 30*time.Second, func() (bool, string) {
		m, err := scrape(e.metrics)
		if err != nil {
			return false, err.Error()
		}
		// Every commit is synced, by the group's syncfs or file by file
		// (which one depends on the kernel and the system's dirty data).
		syncs := func(m map[string]float64) float64 {
			return m["tabletflow_jsonl_syncfs_total"] + m["tabletflow_jsonl_fdatasync_total"]
		}
		return m["tabletflow_records_written_total"] > first["tabletflow_records_written_total"] &&
				m["tabletflow_batches_written_total"] > first["tabletflow_batches_written_total"] &&
				syncs(m) > syncs(first),
			fmt.Sprintf("records %v → %v, JSONL syncs %v → %v", first["tabletflow_records_written_total"],
				m["tabletflow_records_written_total"], syncs(first), syncs(m))
	})

	// A retried error is counted by code.
	st, err := e.status("metrics")
	require.NoError(t, err)
	r := tabletStatus(st, "t-0001").Replica
	e.fault(&sourcepb.FaultRequest{Server: r, Tablet: "t-0001", Code: "UNAVAILABLE"})
	e.eventually("retries counted", 30*time.Second, func() (bool, string) {
		m, err := scrape(e.metrics)
		if err != nil {
			return false, err.Error()
		}
		return m["tabletflow_retries_total"] > 0, fmt.Sprint(m["tabletflow_retries_total"])
	})
	e.heal(r, "t-0001")

	// The alerting gauges: every tablet streaming, none not streaming and
	// the worst running tablet's last commit recent; then every replica of
	// t-0002 excluded: one tablet not streaming, counted until it streams
	// again.
	alerting := func(want float64) func() (bool, string) {
		return func() (bool, string) {
			s, err := promscrape.Get(e.metrics)
			if err != nil {
				return false, err.Error()
			}
			notStreaming, notOK := streamSample(s, "tabletflow_tablets_not_streaming", "metrics")
			since, sinceOK := streamSample(s, "tabletflow_seconds_since_last_commit", "metrics")
			return notOK && notStreaming == want && sinceOK && since < 10,
				fmt.Sprintf("tablets not streaming %v (exported: %v), seconds since the last commit %v (exported: %v)", notStreaming, notOK, since, sinceOK)
		}
	}
	e.eventually("no tablet not streaming", time.Minute, alerting(0))
	var aliases []string
	for _, r := range e.replicasOf("t-0002") {
		aliases = append(aliases, r.Alias)
	}
	in, _ := json.Marshal(map[string]any{"aliases": aliases, "tablet": "t-0002", "reason": "drain"})
	e.signal("metrics", "exclude", string(in))
	e.eventually("t-0002 not streaming", time.Minute, alerting(1))
	e.signal("metrics", "include", fmt.Sprintf(`{"aliases": [%q]}`, aliases[0]))
	e.eventually("t-0002 streams again", time.Minute, alerting(0))
}

// streamSample is the value of name's series for stream in s, and whether
// there is one.
func streamSample(s promscrape.Scrape, name, stream string) (float64, bool) {
	for _, v := range s.Series[name] {
		if v.Labels["stream"] == stream {
			return v.Value, true
		}
	}
	return 0, false
}
