package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// The chaos suite: parts of the system fail while a stream runs, and every
// case ends with the same proof (requireExact): after the workload stops
// and the stream drains, the sink holds exactly tabletd's digest of the
// stream, no (tablet, position) twice, positions increasing per tablet.
// `make test` runs the short profile; `make chaos` (TABLETFLOW_CHAOS=long)
// the long one, with many more rounds.

// chaosProfile sizes the rounds.
type chaosProfile struct {
	name string
	// kills of the worker; restarts of the dev server; how long tabletd's
	// servers flap.
	kills, restarts int
	flap            time.Duration
}

func chaos() chaosProfile {
	if os.Getenv("TABLETFLOW_CHAOS") == "long" {
		return chaosProfile{name: "long", kills: 40, restarts: 4, flap: 4 * time.Minute}
	}
	return chaosProfile{name: "short", kills: 10, restarts: 1, flap: time.Minute}
}

// randomMoment is a random pause between faults, not an assertion.
func randomMoment(min, spread time.Duration) {
	time.Sleep(min + rand.N(spread))
}

// recordsPerTablet is each tablet's committed record count in a JSONL sink.
func recordsPerTablet(out string) map[string]uint64 {
	r, err := jsonl.DigestDir(out)
	if err != nil {
		return nil
	}
	n := map[string]uint64{}
	for id, d := range r.Tablets {
		n[id] = d.Records
	}
	return n
}

func TestChaosWorkerKilledAtRandomMoments(t *testing.T) {
	p := chaos()
	e := newEnv(t, "--tablets", "6", "--rate", "300")
	worker := e.startWorker()
	_, out, _ := e.streamAll("chaos-kill", 6)
	for i := range p.kills + 1 {
		// Each kill hits a worker that is streaming: records flow first.
		at := sinkRecords(out)
		e.eventually(fmt.Sprintf("records flow before kill %d", i+1), 2*time.Minute, func() (bool, string) {
			n := sinkRecords(out)
			return n > at+200, fmt.Sprintf("%d records, %d after the last kill", n, at)
		})
		if i == p.kills {
			break
		}
		randomMoment(0, 2*time.Second)
		worker.Kill() // SIGKILL, mid-batch or mid-commit, wherever it is
		worker = e.startWorker()
		t.Logf("kill %d of %d (%s profile): %d records in the sink", i+1, p.kills, p.name, sinkRecords(out))
	}
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("chaos-kill", out, 3*time.Minute)
}

// Two workers share the task queue; one is killed. Its tablets go on from
// the other once their activities miss the heartbeat timeout and retry
// after the retry interval. The deadline adds a margin for what else the
// victim held: a workflow task it had started waits out its 10 s timeout,
// a sticky one the 5 s schedule-to-start timeout, on a loaded 2-core
// machine; the time measured is logged.
func TestChaosOneOfTwoWorkersKilledItsTabletsMoveToTheOther(t *testing.T) {
	e := newEnv(t, "--tablets", "8", "--rate", "400")
	victim := e.startWorker()
	e.startWorker()
	_, out, _ := e.streamAll("chaos-two", 8) // heartbeatTimeout 5s, retry initialInterval 200ms
	e.eventually("every tablet has records", time.Minute, func() (bool, string) {
		n := recordsPerTablet(out)
		return len(n) == 8, fmt.Sprint(n)
	})
	randomMoment(0, 2*time.Second)
	at := recordsPerTablet(out)
	killed := time.Now()
	victim.Kill()
	const heartbeat, retry, margin = 5 * time.Second, 200 * time.Millisecond, 20 * time.Second
	e.eventually("every tablet commits again after the kill", heartbeat+retry+margin, func() (bool, string) {
		n := recordsPerTablet(out)
		var stalled []string
		for id, c := range at {
			if n[id] <= c {
				stalled = append(stalled, id)
			}
		}
		return len(stalled) == 0, fmt.Sprintf("not yet committing again: %v", stalled)
	})
	t.Logf("every tablet committing again %.1fs after the kill (heartbeat timeout %v + retry %v)", time.Since(killed).Seconds(), heartbeat, retry)
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("chaos-two", out, 2*time.Minute)
}

// The Temporal dev server is killed (SIGKILL) mid-stream and started again
// on the same database file: the worker reconnects and the stream goes on
// from what the server had recorded.
func TestChaosTemporalServerKilledAndRestarted(t *testing.T) {
	p := chaos()
	server, err := testbed.StartDevServer(temporalCLI, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { server.Stop() }) // the process running at the end, after restarts
	e := newEnvOn(t, server.Addr, "--tablets", "4", "--rate", "300")
	e.logs = append(e.logs, server.Proc) // its log, shown on failure (the path outlives restarts)
	e.startWorker()
	_, out, _ := e.streamAll("chaos-server", 4)
	for i := range p.restarts {
		randomMoment(time.Second, 3*time.Second)
		require.NoError(t, server.Restart(), "restart %d: %s", i+1, server.Tail())
		at := sinkRecords(out)
		e.eventually(fmt.Sprintf("records flow after restart %d", i+1), 2*time.Minute, func() (bool, string) {
			n := sinkRecords(out)
			return n > at+300, fmt.Sprintf("%d records, %d at the restart", n, at)
		})
	}
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("chaos-server", out, 3*time.Minute)
	e.waitStatus("chaos-server", "every tablet streaming", time.Minute, allStreaming(4))
}

// tabletd's servers go down and up at random (about 30 % down at any
// moment), with latency and error-rate faults on the rest, and a tablet
// splits meanwhile.
func TestChaosTabletdServersFlapWithFaultsAndASplit(t *testing.T) {
	p := chaos()
	e := newEnv(t, "--tablets", "4", "--rate", "300", "--servers-per-cell", "2")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	e.startStream("chaos-flap", e.config(out, map[string]any{"topologyRefresh": "2s",
		"retry": map[string]any{"initialInterval": "200ms", "maximumInterval": "1s", "maximumAttempts": 3}}))
	st := e.waitStatus("chaos-flap", "every tablet streaming", time.Minute, allStreaming(4))
	servers := map[string]bool{}
	for _, tab := range st.Tablets {
		list, err := e.topo.GetTablet(context.Background(), &sourcepb.GetTabletRequest{Tablet: tab.ID})
		require.NoError(t, err)
		for _, r := range list.Replicas {
			servers[r.Alias] = true
		}
	}
	var aliases []string
	for a := range servers {
		aliases = append(aliases, a)
	}
	down := map[string]bool{}
	end := time.Now().Add(p.flap)
	split := time.Now().Add(p.flap / 2)
	var children []string
	for time.Now().Before(end) {
		a := aliases[rand.N(len(aliases))]
		switch {
		case down[a]:
			e.heal(a, "")
			delete(down, a)
		case float64(len(down)+1) <= 0.3*float64(len(aliases)) && rand.N(2) == 0:
			e.fault(&sourcepb.FaultRequest{Server: a, Down: true})
			down[a] = true
		case rand.N(2) == 0:
			e.fault(&sourcepb.FaultRequest{Server: a, Latency: durationpb.New(time.Duration(rand.N(300)) * time.Millisecond)})
		default:
			e.fault(&sourcepb.FaultRequest{Server: a, Code: "UNAVAILABLE", ErrorRate: 0.2})
		}
		if children == nil && time.Now().After(split) {
			// A split needs the tablet's primary: tried again next round
			// while it is down.
			if resp, err := e.admin.Split(context.Background(), &sourcepb.SplitRequest{Tablet: "t-0002"}); err == nil {
				children = resp.Children
				t.Logf("split t-0002 into %v with %d of %d servers down", children, len(down), len(aliases))
			}
		}
		randomMoment(200*time.Millisecond, time.Second)
	}
	require.NotNil(t, children, "the split happened during the faults")
	for _, a := range aliases {
		e.heal(a, "")
	}
	// The operator's way back from exclusions the faults caused.
	include, err := json.Marshal(map[string]any{"aliases": aliases})
	require.NoError(t, err)
	e.signal("chaos-flap", "include", string(include))
	e.waitStatus("chaos-flap", "the children and the other tablets streaming again", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		ok := tabletStatus(st, "t-0002").State == workflows.Split
		for _, tab := range st.Tablets {
			if tab.ID != "t-0002" {
				ok = ok && tab.State == workflows.Streaming
			}
		}
		return ok && len(st.Tablets) == 6, summary(st)
	})
	e.workload(sourcepb.WorkloadRequest_STOP)
	e.requireExact("chaos-flap", out, 3*time.Minute)
}
