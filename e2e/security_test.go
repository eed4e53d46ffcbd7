package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/proto"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// TestStreamOverMutualTLSEverywhere runs a stream with every connection on
// mutual TLS and a CA the test made: the starter and the worker reach
// Temporal through a TLS-terminating frontend that requires a client
// certificate, tabletd serves its topology and tablet servers with mutual
// TLS and a bearer token, and the worker dials it with the files named in
// the stream config and the token from the variable it names. The data is
// exact; a client without a certificate is refused; a frontend with plain
// (server-only) TLS takes a client that trusts its CA; and neither the key
// files nor the token reach the stream's histories.
func TestStreamOverMutualTLSEverywhere(t *testing.T) {
	certs, err := testbed.MakeCerts(t.TempDir())
	require.NoError(t, err)
	mutual, err := certs.Server(true).Server()
	require.NoError(t, err)
	frontend, err := testbed.StartTLSProxy(temporalAddr, mutual)
	require.NoError(t, err)
	t.Cleanup(frontend.Stop)

	e := newTLSEnv(t, frontend.Addr, certs, "--tablets", "4", "--rate", "200")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	cfg := filepath.Join(e.dir, "tls-stream.json")
	require.NoError(t, os.WriteFile(cfg, e.config(out, nil), 0o644))
	msg, err := e.starter(append([]string{"start", "-f", cfg, "--task-queue", e.taskQueue}, e.tlsFlags()...)...)
	require.NoError(t, err, msg)
	e.waitStatus("tls-stream", "every tablet streaming over TLS", time.Minute, allStreaming(4))

	// Without a client certificate the frontend refuses the starter.
	msg, err = e.starter("status", "tls-stream", "--tls-ca", certs.CA)
	require.Error(t, err, "a client without a certificate must be refused: %s", msg)
	// What the refusal looks like depends on when TLS 1.3 reports it (a
	// bad certificate alert, or a broken pipe); the starter names where.
	require.Contains(t, msg, "connect to Temporal at "+frontend.Addr)

	// Server-only TLS: the starter needs only the CA.
	oneWay, err := certs.Server(false).Server()
	require.NoError(t, err)
	tlsOnly, err := testbed.StartTLSProxy(temporalAddr, oneWay)
	require.NoError(t, err)
	t.Cleanup(tlsOnly.Stop)
	msg, err = e.starter("status", "tls-stream", "--address", tlsOnly.Addr, "--tls-ca", certs.CA)
	require.NoError(t, err, msg)
	require.Contains(t, msg, "Streaming")

	// The Temporal CLI, as an operator drives it, over mutual TLS.
	e.signal("tls-stream", "pause", `{"tablets": ["t-0002"]}`)
	e.waitStatus("tls-stream", "t-0002 paused", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, "t-0002").State == workflows.Paused, summary(st)
	})
	e.signal("tls-stream", "resume", `{"tablets": ["t-0002"]}`)
	e.waitStatus("tls-stream", "t-0002 streams again", 30*time.Second, allStreaming(4))

	e.workload(sourcepb.WorkloadRequest_PAUSE)
	e.requireExact("tls-stream", out, 2*time.Minute)
	msg, err = e.starter(append([]string{"stop", "tls-stream"}, e.tlsFlags()...)...)
	require.NoError(t, err, msg)

	// The token, and each key's PEM and its base64 lines after the first
	// (which is the same for every P-256 key: the algorithm's header).
	secrets := [][]byte{[]byte(e.token)}
	for _, f := range []string{certs.ClientKey, certs.ServerKey} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		secrets = append(secrets, b)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for _, l := range lines[2 : len(lines)-1] {
			secrets = append(secrets, []byte(l))
		}
		require.Greater(t, len(lines), 3, "a PEM key of several lines")
	}
	e.requireNoSecretInHistories("tls-stream", secrets...)
}

// requireNoSecretInHistories reads every event of every run of the stream
// and of its tablets (closed ones too) and fails if any secret appears in
// their bytes: payloads, failures, memos, search attributes.
func (e *env) requireNoSecretInHistories(stream string, secrets ...[]byte) {
	e.t.Helper()
	events := 0
	runs := e.eachEvent(e.temporal, stream, func(run string, ev *historypb.HistoryEvent) {
		events++
		b, err := proto.Marshal(ev)
		require.NoError(e.t, err)
		for _, s := range secrets {
			require.False(e.t, bytes.Contains(b, s), "event %d (%s) of %s holds a secret", ev.EventId, ev.EventType, run)
		}
	})
	// The stream and each of its tablets: the read covered them.
	require.Greater(e.t, runs, 1, "runs of %s read", stream)
	e.t.Logf("no secret in %d events of %d runs", events, runs)
}

// eachEvent calls f with every event, as stored, of every run of the
// stream and of its tablets (found by their search attribute), with the
// run's "workflowID/runID"; it returns how many runs it read.
func (e *env) eachEvent(c client.Client, stream string, f func(run string, ev *historypb.HistoryEvent)) int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	query := fmt.Sprintf("%s = '%s'", workflows.SAStream.GetName(), stream)
	runs := 0
	var token []byte
	for {
		resp, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: query, NextPageToken: token})
		require.NoError(e.t, err)
		for _, ex := range resp.Executions {
			runs++
			it := c.GetWorkflowHistory(ctx, ex.Execution.WorkflowId, ex.Execution.RunId, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
			for it.HasNext() {
				ev, err := it.Next()
				require.NoError(e.t, err)
				f(ex.Execution.WorkflowId+"/"+ex.Execution.RunId, ev)
			}
		}
		if token = resp.NextPageToken; len(token) == 0 {
			return runs
		}
	}
}
