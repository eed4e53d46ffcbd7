package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/workflows"
)

func TestStreamDeliversExactlyTheSourcesRecords(t *testing.T) {
	e := newEnv(t, "--tablets", "8", "--rate", "400")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	e.startStream("exact", e.config(out, nil))

	e.eventually("every tablet streaming", 60*time.Second, func() (bool, string) {
		st, err := e.status("exact")
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, tab := range st.Tablets {
			if tab.State == workflows.Streaming {
				n++
			}
		}
		return n == 8, fmt.Sprintf("%d of %d tablets streaming: %+v", n, len(st.Tablets), st.Tablets)
	})
	e.eventually("records reach the sink", 60*time.Second, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 2000, fmt.Sprintf("%d records", n)
	})
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("exact", out, 2*time.Minute)
}

func TestWorkerKilledMidStreamLosesAndRepeatsNothing(t *testing.T) {
	e := newEnv(t, "--tablets", "8", "--rate", "400")
	first := e.startWorker()
	out := filepath.Join(e.dir, "out")
	e.startStream("crash", e.config(out, nil))
	e.eventually("records reach the sink", 60*time.Second, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 2000, fmt.Sprintf("%d records", n)
	})
	first.Kill() // mid-stream, mid-batch: no chance to commit
	before := sinkRecords(out)
	e.startWorker()
	e.eventually("the new worker takes over", 90*time.Second, func() (bool, string) {
		n := sinkRecords(out)
		return n > before+2000, fmt.Sprintf("%d records, %d at the kill", n, before)
	})
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("crash", out, 2*time.Minute)
}
