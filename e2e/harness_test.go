// Package e2e runs tabletflow end to end: a real Temporal dev server (the
// Temporal CLI), real tabletd and worker processes, real gRPC over
// loopback. One dev server is shared by the package's tests; each test
// uses its own task queue, tabletd and sink directory.
package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	tabletdsrc "github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/workflows"
)

var (
	temporalCLI  string // the Temporal CLI
	binDir       string // the project's binaries, built for this run
	temporalAddr string // the shared dev server's frontend
	temporalUI   string // and its Web UI
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root, err := filepath.Abs("..")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	temporal := os.Getenv("TEMPORAL_CLI")
	if temporal == "" {
		temporal = filepath.Join(root, "bin", "temporal")
	}
	temporalCLI = temporal
	if _, err := os.Stat(temporal); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: no Temporal CLI at %s: run `make test` (it installs bin/temporal) or set TEMPORAL_CLI\n", temporal)
		return 1
	}
	dir, err := os.MkdirTemp("", "tabletflow-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = filepath.Join(dir, "bin")
	if err := testbed.Build(root, binDir, "./tabletd", "./worker", "./starter"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	// Continue-as-new is suggested early, so the tests cross it. The
	// dev servers' SQLite runs in WAL mode (testbed.SQLiteWAL): with its
	// default fsync at every write a slow disk set the pace of the tests
	// (the chaos suite's server restarts keep the defaults).
	server, err := testbed.StartDevServer(temporal, dir, append([]string{"--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=300"}, testbed.SQLiteWAL...)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer server.Stop()
	temporalAddr, temporalUI = server.Addr, server.UI
	return m.Run()
}

// freePort is testbed.FreePort for tests: no free port, no test.
func freePort() int {
	p, err := testbed.FreePort()
	if err != nil {
		panic(err) // no loopback port: nothing in this package can run
	}
	return p
}

// env is one test's world: a tabletd, workers on the test's own task
// queue, a sink directory, and clients.
type env struct {
	t         *testing.T
	dir       string
	addr      string // the dev server: the shared one, or the test's own (newEnvOn)
	taskQueue string
	tabletd   *testbed.Proc
	tdAddr    string
	admin     sourcepb.AdminClient
	topo      sourcepb.TopologyClient
	temporal  client.Client
	workers   []*testbed.Proc
	logs      []*testbed.Proc
	// metrics is the last started worker's Prometheus endpoint.
	metrics string
	// certs, if set, secure every connection with mutual TLS, and token
	// is the bearer token tabletd requires (newTLSEnv).
	certs *testbed.Certs
	token string
	// workerArgs are more flags for every worker this env starts;
	// codecEndpoint, if set, is the Temporal CLI's --codec-endpoint.
	workerArgs    []string
	codecEndpoint string
}

// tokenEnv holds tabletd's bearer token in a newTLSEnv.
const tokenEnv = "TF_E2E_TABLETD_TOKEN"

func newEnv(t *testing.T, tabletdArgs ...string) *env {
	t.Helper()
	return newEnvOn(t, temporalAddr, tabletdArgs...)
}

// newEnvOn is newEnv against the dev server at addr (see startDevServer).
func newEnvOn(t *testing.T, addr string, tabletdArgs ...string) *env {
	t.Helper()
	return newEnvWith(t, addr, nil, tabletdArgs...)
}

// newTLSEnv is newEnv with mutual TLS on every connection, with certs:
// tabletd serves it and requires a bearer token, the workers and the
// test's clients present the client certificate (and the token), and addr
// is a TLS frontend of Temporal (a testbed.TLSProxy).
func newTLSEnv(t *testing.T, addr string, certs testbed.Certs, tabletdArgs ...string) *env {
	t.Helper()
	return newEnvWith(t, addr, &certs, tabletdArgs...)
}

func newEnvWith(t *testing.T, addr string, certs *testbed.Certs, tabletdArgs ...string) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), addr: addr, taskQueue: "tq-" + strings.ReplaceAll(t.Name(), "/", "-"), certs: certs}
	e.tdAddr = fmt.Sprintf("127.0.0.1:%d", freePort())
	args := append([]string{"serve", "--listen", e.tdAddr, "--log-level", "warn"}, tabletdArgs...)
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	var temporalTLS *tls.Config
	if certs != nil {
		// The worker finds the token in its environment (source.tokenEnv).
		e.token = fmt.Sprintf("tabletd-token-%x", rand.Uint64())
		t.Setenv(tokenEnv, e.token)
		args = append(args, "--tls-cert", certs.ServerCert, "--tls-key", certs.ServerKey, "--tls-ca", certs.CA,
			"--token-env", tokenEnv)
		creds, err := tabletdsrc.Credentials(certs.Client(true))
		require.NoError(t, err)
		dial = []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithPerRPCCredentials(tabletdsrc.Bearer(e.token, true))}
		temporalTLS, err = certs.Client(true).Client()
		require.NoError(t, err)
	}
	p, err := testbed.Start(filepath.Join(e.dir, "tabletd.log"), filepath.Join(binDir, "tabletd"), args...)
	require.NoError(t, err)
	e.tabletd = p
	e.logs = append(e.logs, p)
	t.Cleanup(p.Stop)
	conn, err := grpc.NewClient(e.tdAddr, dial...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	e.admin = sourcepb.NewAdminClient(conn)
	e.topo = sourcepb.NewTopologyClient(conn)
	e.eventually("tabletd answers", 30*time.Second, func() (bool, string) {
		_, err := e.admin.Workload(context.Background(), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STATUS})
		return err == nil, fmt.Sprint(err)
	})
	c, err := client.Dial(client.Options{HostPort: e.addr, Logger: temporalclient.Quiet{},
		ConnectionOptions: client.ConnectionOptions{TLS: temporalTLS}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	e.temporal = c
	t.Cleanup(func() {
		if t.Failed() {
			// TABLETFLOW_KEEP_LOGS=dir keeps a failed test's whole logs.
			keep := os.Getenv("TABLETFLOW_KEEP_LOGS")
			for _, p := range e.logs {
				t.Logf("--- %s ---\n%s", filepath.Base(p.Log()), p.Tail())
				if keep != "" {
					if b, err := os.ReadFile(p.Log()); err == nil {
						dst := filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_")+"-"+filepath.Base(p.Log()))
						if os.MkdirAll(keep, 0o755) == nil && os.WriteFile(dst, b, 0o644) == nil {
							t.Logf("kept %s", dst)
						}
					}
				}
			}
		}
	})
	return e
}

// startWorker starts a worker process on the test's task queue.
func (e *env) startWorker() *testbed.Proc {
	e.t.Helper()
	n := len(e.workers)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	e.metrics = "http://" + metricsAddr + "/metrics"
	args := []string{"--address", e.addr, "--task-queue", e.taskQueue, "--log-level", "info", "--stop-timeout", "20s",
		"--metrics-addr", metricsAddr}
	if e.certs != nil {
		args = append(args, e.tlsFlags()...)
	}
	args = append(args, e.workerArgs...)
	p, err := testbed.Start(filepath.Join(e.dir, fmt.Sprintf("worker-%d.log", n)), filepath.Join(binDir, "worker"), args...)
	require.NoError(e.t, err)
	e.workers = append(e.workers, p)
	e.logs = append(e.logs, p)
	e.t.Cleanup(p.Stop)
	return p
}

// tlsFlags are the worker's and starter's flags for Temporal over mutual
// TLS with the env's client certificate.
func (e *env) tlsFlags() []string {
	return []string{"--tls-ca", e.certs.CA, "--tls-cert", e.certs.ClientCert, "--tls-key", e.certs.ClientKey}
}

// config returns a stream config (as JSON) reading this env's tabletd
// into sink dir out, with extra top-level fields merged in.
func (e *env) config(out string, extra map[string]any) json.RawMessage {
	src := map[string]any{"kind": "tabletd", "address": e.tdAddr, "keyspace": "commerce"}
	if e.certs != nil {
		src["tls"], src["tokenEnv"] = e.certs.Client(true), tokenEnv
	}
	cfg := map[string]any{
		"source": src,
		"sink":   map[string]any{"kind": "jsonl", "path": out},
		"run":    map[string]any{"duration": "5s", "heartbeatTimeout": "5s"},
		"retry":  map[string]any{"initialInterval": "200ms", "maximumInterval": "2s", "maximumAttempts": 5},
	}
	for k, v := range extra {
		cfg[k] = v
	}
	b, err := json.Marshal(cfg)
	require.NoError(e.t, err)
	return b
}

// startStream starts a StreamWorkflow with the given config.
func (e *env) startStream(id string, cfg json.RawMessage) client.WorkflowRun {
	e.t.Helper()
	run, err := e.temporal.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{
		ID: id, TaskQueue: e.taskQueue,
	}, "StreamWorkflow", cfg)
	require.NoError(e.t, err)
	return run
}

// status queries a stream's status.
func (e *env) status(id string) (workflows.StreamStatus, error) {
	var st workflows.StreamStatus
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := e.temporal.QueryWorkflow(ctx, id, "", workflows.QueryStatus)
	if err != nil {
		return st, err
	}
	return st, v.Get(&st)
}

// waitStatus polls a stream's status until cond holds.
func (e *env) waitStatus(id, what string, within time.Duration, cond func(workflows.StreamStatus) (bool, string)) workflows.StreamStatus {
	e.t.Helper()
	var st workflows.StreamStatus
	e.eventually(what, within, func() (bool, string) {
		var err error
		st, err = e.status(id)
		if err != nil {
			return false, err.Error()
		}
		return cond(st)
	})
	return st
}

// tabletStatus finds one tablet in a status.
func tabletStatus(st workflows.StreamStatus, id string) workflows.TabletStatus {
	for _, t := range st.Tablets {
		if t.ID == id {
			return t
		}
	}
	return workflows.TabletStatus{}
}

// streamAll starts stream id with the test config into the sink
// directory <dir>/out and waits until all n tablets stream; it returns
// the run, the sink directory and that status.
func (e *env) streamAll(id string, n int) (client.WorkflowRun, string, workflows.StreamStatus) {
	out := filepath.Join(e.dir, "out")
	run := e.startStream(id, e.config(out, nil))
	st := e.waitStatus(id, "every tablet streaming", time.Minute, allStreaming(n))
	return run, out, st
}

// allStreaming is a waitStatus condition: n tablets, all Streaming.
func allStreaming(n int) func(workflows.StreamStatus) (bool, string) {
	return inState(n, workflows.Streaming)
}

// inState is a waitStatus condition: n tablets, all in state.
func inState(n int, state workflows.State) func(workflows.StreamStatus) (bool, string) {
	return func(st workflows.StreamStatus) (bool, string) {
		k := 0
		for _, t := range st.Tablets {
			if t.State == state {
				k++
			}
		}
		return k == n && len(st.Tablets) == n, summary(st)
	}
}

// offReplica reports whether every tablet streams, none from alias.
func offReplica(st workflows.StreamStatus, alias string) bool {
	for _, t := range st.Tablets {
		if t.Replica == alias || t.State != workflows.Streaming {
			return false
		}
	}
	return true
}

// summary renders a status compactly for failure messages.
func summary(st workflows.StreamStatus) string {
	var b strings.Builder
	for _, t := range st.Tablets {
		fmt.Fprintf(&b, "%s=%s@%s(%s%s) ", t.ID, t.State, t.Replica, t.Reason, t.LastError)
	}
	fmt.Fprintf(&b, "exclude=%v rejected=%v", st.Exclude, st.Rejected)
	return b.String()
}

// cli runs the Temporal CLI against the env's dev server. A command the
// server refused without recording it — "Workflow is busy" (it could not
// take the workflow's lock in time: many signals at once on a loaded
// machine) or "workflow is closing" (it came as the run continued as new)
// — is repeated, as docs/operating.md tells an operator to, for up to 30 s; any
// other error fails.
func (e *env) cli(args ...string) string {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		full := append(slices.Clip(args), "--address", e.addr)
		if e.certs != nil {
			full = append(full, "--tls-ca-path", e.certs.CA, "--tls-cert-path", e.certs.ClientCert, "--tls-key-path", e.certs.ClientKey)
		}
		if e.codecEndpoint != "" {
			full = append(full, "--codec-endpoint", e.codecEndpoint)
		}
		cmd := exec.Command(temporalCLI, full...)
		out, err := cmd.CombinedOutput()
		refused := strings.Contains(string(out), "Workflow is busy") || strings.Contains(string(out), "workflow is closing")
		if err != nil && refused && time.Now().Before(deadline) {
			e.t.Logf("temporal %v: refused (%s), repeating", args, strings.TrimSpace(string(out)))
			time.Sleep(200 * time.Millisecond)
			continue
		}
		require.NoError(e.t, err, "temporal %v: %s", args, out)
		return string(out)
	}
}

// signal sends an operator signal with the Temporal CLI, as an operator
// would.
func (e *env) signal(id, name, input string) {
	e.t.Helper()
	e.cli("workflow", "signal", "--workflow-id", id, "--name", name, "--input", input)
}

// fault injects a fault with the tabletd admin API.
func (e *env) fault(req *sourcepb.FaultRequest) {
	e.t.Helper()
	_, err := e.admin.Fault(context.Background(), req)
	require.NoError(e.t, err)
}

// heal undoes a server's (or replica's) faults.
func (e *env) heal(server, tablet string) {
	e.t.Helper()
	_, err := e.admin.Heal(context.Background(), &sourcepb.HealRequest{Server: server, Tablet: tablet})
	require.NoError(e.t, err)
}

// workload sends a workload command to tabletd.
func (e *env) workload(action sourcepb.WorkloadRequest_Action) {
	e.t.Helper()
	_, err := e.admin.Workload(context.Background(), &sourcepb.WorkloadRequest{Action: action})
	require.NoError(e.t, err)
}

// sinkRecords counts the records the JSONL sink holds (committed).
func sinkRecords(dir string) uint64 {
	r, err := jsonl.DigestDir(dir)
	if err != nil {
		return 0
	}
	return r.Total.Records
}

// requireExact waits until the sink holds exactly what the stream is due
// (tabletd's digest: count and hash) and checks it holds no duplicate and
// that positions strictly increase in each tablet's file.
func (e *env) requireExact(stream, out string, within time.Duration) {
	e.t.Helper()
	e.eventually("the sink holds exactly the stream's records", within, func() (bool, string) {
		due, err := e.admin.Digest(context.Background(), &sourcepb.DigestRequest{Stream: stream})
		if err != nil {
			return false, err.Error()
		}
		got, err := jsonl.DigestDir(out)
		if err != nil {
			return false, err.Error()
		}
		return due.Records == got.Total.Records && due.Hash == got.Total.Hash,
			fmt.Sprintf("due %d records hash %s, sink %d records hash %s, %d duplicates",
				due.Records, digest.HashHex(due.Hash), got.Total.Records, digest.HashHex(got.Total.Hash), len(got.Duplicates))
	})
	got, err := jsonl.DigestDir(out)
	require.NoError(e.t, err)
	require.Empty(e.t, got.Duplicates, "no (tablet, position) twice")
	e.requireOrdered(out)
}

// requireOrdered checks that within each tablet's JSONL file the
// committed positions strictly increase: nothing was written twice or
// behind a later record, across runs, restarts and continue-as-new.
func (e *env) requireOrdered(out string) {
	e.t.Helper()
	lines, err := jsonl.ReadDir(out)
	require.NoError(e.t, err)
	require.NotEmpty(e.t, lines, "the sink holds records")
	for tablet, ls := range lines {
		var prev source.Checkpoint
		for i, l := range ls {
			pos, err := source.ParseCheckpoint(l.Position)
			require.NoError(e.t, err, "%s line %d", tablet, i+1)
			require.False(e.t, pos.IsZero(), "%s line %d: no position", tablet, i+1)
			require.Positive(e.t, pos.Compare(prev), "%s line %d: position %s after %s", tablet, i+1, pos, prev)
			prev = pos
		}
	}
}

// startDevServer starts a dev server of the test's own (for dynamic
// config the shared one lacks), its SQLite in WAL mode as the shared
// one's, and returns its frontend address.
func startDevServer(t *testing.T, extra ...string) string {
	t.Helper()
	s, err := testbed.StartDevServer(temporalCLI, t.TempDir(), append(slices.Clone(testbed.SQLiteWAL), extra...)...)
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	return s.Addr
}

// eventually polls cond until it holds, failing with what it last saw.
func (e *env) eventually(what string, within time.Duration, cond func() (bool, string)) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		ok, seen := cond()
		if ok {
			return
		}
		last = seen
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within %v; last saw: %s", what, within, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// recordHistory writes a workflow run's history as JSON (the format of
// `temporal workflow show -o json`) into $TABLETFLOW_RECORD_HISTORIES, for
// the replay tests in workflows/testdata. Without the variable it does
// nothing.
func (e *env) recordHistory(workflowID, runID, name string) {
	e.t.Helper()
	dir := os.Getenv("TABLETFLOW_RECORD_HISTORIES")
	if dir == "" {
		return
	}
	it := e.temporal.GetWorkflowHistory(context.Background(), workflowID, runID, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	h := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(e.t, err)
		h.Events = append(h.Events, ev)
	}
	b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(h)
	require.NoError(e.t, err)
	require.NoError(e.t, os.WriteFile(filepath.Join(dir, name+".json"), b, 0o644))
}
