package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"go.temporal.io/sdk/converter"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/workflows"
)

// starter runs the starter binary against the env's dev server.
func (e *env) starter(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(binDir, "starter"), args...)
	cmd.Env = append(os.Environ(), "TEMPORAL_ADDRESS="+e.addr)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestStarterStartsWatchesAndDrivesAStream(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "100")
	e.startWorker()
	out := filepath.Join(e.dir, "out")

	// A bad config is refused locally, naming the field.
	bad := filepath.Join(e.dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"source": {"kind": "tabletd", "address": "x:1", "keyspace": "k"},
		"sink": {"kind": "jsonl", "path": "/tmp/x"}, "batch": {"maxRecordz": 5}}`), 0o644))
	msg, err := e.starter("start", "-f", bad)
	require.Error(t, err)
	require.Contains(t, msg, "batch.maxRecordz: unknown field")

	// The stream starts on this test's task queue: the starter's config is
	// the same JSON the Temporal CLI takes.
	cfg := filepath.Join(e.dir, "starter.json")
	require.NoError(t, os.WriteFile(cfg, e.config(out, nil), 0o644))
	msg, err = e.starter("start", "-f", cfg, "--task-queue", e.taskQueue)
	require.NoError(t, err, msg)
	require.Contains(t, msg, "stream starter started")
	require.Contains(t, msg, "/namespaces/default/workflows/starter")
	st := e.waitStatus("starter", "every tablet streaming", time.Minute, allStreaming(4))

	msg, err = e.starter("status", "starter")
	require.NoError(t, err, msg)
	for _, want := range []string{"t-0001", "Streaming", "TABLET"} {
		require.Contains(t, msg, want)
	}

	// Operator commands as updates: a bad one is an error back here.
	msg, err = e.starter("exclude", "starter", "--aliases", "zone9-0000000999")
	require.Error(t, err)
	require.Contains(t, msg, "not a replica of this stream")
	alias := busiest(st)
	msg, err = e.starter("exclude", "starter", "--aliases", alias, "--reason", "starter test", "--ttl", "1h")
	require.NoError(t, err, msg)
	e.waitStatus("starter", "the exclusion in effect", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		if !offReplica(st, alias) {
			return false, summary(st)
		}
		return len(st.Exclude) == 1 && st.Exclude[0].Reason == "starter test", summary(st)
	})
	msg, err = e.starter("pause", "starter", "--tablets", "t-0002", "--signal")
	require.NoError(t, err, msg)
	e.waitStatus("starter", "t-0002 paused", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, "t-0002").State == workflows.Paused, summary(st)
	})
	msg, err = e.starter("resume", "starter", "--tablets", "t-0002")
	require.NoError(t, err, msg)
	e.waitStatus("starter", "t-0002 streams again", 30*time.Second, allStreaming(4))

	tunables := filepath.Join(e.dir, "tunables.json")
	require.NoError(t, os.WriteFile(tunables, []byte(`{"batch": {"maxRecords": 0}}`), 0o644))
	msg, err = e.starter("configure", "starter", "-f", tunables)
	require.Error(t, err, "configure is validated like the config")
	require.Contains(t, msg, "batch.maxRecords")

	msg, err = e.starter("stop", "starter")
	require.NoError(t, err, msg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, e.temporal.GetWorkflow(ctx, "starter", "").Get(ctx, nil))
	require.True(t, strings.Contains(msg, "stop done"), msg)
}

// starterStatus is starter status --json of a stream, decoded.
func (e *env) starterStatus(stream string, args ...string) workflows.StreamStatus {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "starter"), append([]string{"status", stream, "--json"}, args...)...)
	cmd.Env = append(os.Environ(), "TEMPORAL_ADDRESS="+e.addr)
	out, err := cmd.Output()
	require.NoError(e.t, err, string(out))
	var st workflows.StreamStatus
	require.NoError(e.t, json.Unmarshal(out, &st), string(out))
	return st
}

// Live status: while records flow, every streaming tablet's checkpoint
// and records move within 5 s in the stream's status query (the stream
// reads its tablets' heartbeats every statusRefresh, 3 s by default) and
// in starter status (which reads them again), though a tablet reports
// only when a run ends (run.duration 5 m here); the stream's memo has
// its live totals, moving too.
func TestStatusShowsEachStreamingTabletsCheckpointMovingWithin5s(t *testing.T) {
	e := newEnv(t, "--tablets", "3", "--rate", "50")
	e.workerArgs = append(e.workerArgs, "--live-every", "2s")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	const stream = "live"
	e.startStream(stream, e.config(out, map[string]any{"run": map[string]any{"duration": "5m"}}))
	e.waitStatus(stream, "every tablet streaming", time.Minute, allStreaming(3))
	e.eventually("records reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n > 100, fmt.Sprintf("%d records", n)
	})

	for _, args := range [][]string{nil, {"--live=false"}} {
		name := "starter status"
		if args != nil {
			name = "the status query (starter status --live=false)"
		}
		first := e.starterStatus(stream, args...)
		began := time.Now()
		moved := map[string]bool{}
		for len(moved) < len(first.Tablets) {
			require.Less(t, time.Since(began), 5*time.Second, "tablets whose checkpoint moved in %s within 5 s: %v", name, moved)
			now := e.starterStatus(stream, args...)
			for _, tab := range now.Tablets {
				was := tabletStatus(first, tab.ID)
				if tab.State == workflows.Streaming && tab.Checkpoint.Compare(was.Checkpoint) > 0 && tab.Records > was.Records && tab.Live != nil {
					moved[tab.ID] = true
				}
			}
		}
		t.Logf("%s: every tablet moved within %s", name, time.Since(began).Round(time.Millisecond))
	}

	memo := func() workflows.LiveTotals {
		var l workflows.LiveTotals
		p := e.describe(stream, "").WorkflowExecutionInfo.GetMemo().GetFields()[workflows.MemoLive]
		if p != nil {
			require.NoError(t, converter.GetDefaultDataConverter().FromPayload(p, &l))
		}
		return l
	}
	was := memo()
	e.eventually("the memo's live records move", 10*time.Second, func() (bool, string) {
		now := memo()
		return now.Records > was.Records && now.RecordsPerSecond > 0, fmt.Sprintf("%+v, was %+v", now, was)
	})
	msg, err := e.starter("status", stream)
	require.NoError(t, err, msg)
	require.Contains(t, msg, "LIVE")
	require.Regexp(t, `total: \d+ records, - rec/s, 3 of 3 tablets streaming`, msg)
}
