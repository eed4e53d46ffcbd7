// Command scale checks issue 8's goal, "a stream of 5000 tablets works on
// this machine", on the real binaries, and writes a JSON result.
//
// It starts, in a temporary directory, a Temporal dev server (its default
// dynamic config; --dynamic-config-value to change it), a tabletd with
// --tablets N, --replicas 2 and a trickle of writes (the data path is not
// what is measured), and one worker with --max-concurrent-activities N
// plus headroom. Then it starts one StreamWorkflow with a config sized for
// many tablets and polls the stream's `status` query until every tablet
// is Streaming, or the deadline. The stream starts at most 1000 tablet
// workflows per run and continues-as-new for the next wave
// (workflows/stream_topology.go), so the timeline shows the waves.
//
// The config: what a tablet costs the dev server (one SQLite connection
// for everything) while it streams is mostly its GetChanges heartbeats
// (the SDK sends one every 0.8 × run.heartbeatTimeout, at most every
// 60 s), the end of each GetChanges run (run.duration) and, on every
// topologyRefresh, a describe of its workflow; an idle tablet costs the
// worker and tabletd one long-poll per batch.maxWait. The defaults here
// (heartbeatTimeout 2m, run.duration 30m, topologyRefresh 1m, maxWait 5s)
// are sized for 5000 tablets on a 2-core machine, which make bench-full's
// 5000-tablet run checks; shorter settings (heartbeatTimeout 30s,
// run.duration 5m, topologyRefresh 30s, maxWait 1s) cost the dev server
// more per tablet, and the flags let a run measure where it falls behind
// (heartbeats timing out, workflow tasks stuck).
//
// Recorded: when 1000, 2000, … N tablets were Streaming (by the status
// query, and by tabletd: the tablets whose GetChanges reached a replica);
// each stream run (continue-as-new) with its start, its tablet-workflow
// starts per second, its history and the state it carried in; the
// worker's RSS before the stream, at the end and at its peak, per tablet;
// CPU seconds of each process while the tablets start and in a steady
// window after; the history event counts of the stream and of one tablet;
// and the warnings and errors the processes logged. A run that misses the
// goal is a result too: it says so, with the figures, keeps its logs and
// exits 0 (it exits 1 only when it could not measure).
//
//	go run ./bench/scale --bin ./bin --tablets 5000 --out bench/results/scale-5000.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/bench/internal/history"
	"github.com/tabletflow/tabletflow/bench/internal/procs"
	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/workflows"
)

const (
	keyspace  = "commerce"
	taskQueue = "scale"
	streamID  = "scale" // the StreamWorkflow's ID
	namespace = "default"
	// maxChildrenPerRun mirrors workflows' wave size, for the expected
	// number of runs only.
	maxChildrenPerRun = 1000
)

type result struct {
	Date    string `json:"date"`
	Command string `json:"command"`
	Goal    string `json:"goal"`
	// Verdict says in words whether every tablet reached Streaming, how
	// fast, and if not, where the stream stood.
	Verdict      string  `json:"verdict"`
	AllStreaming bool    `json:"all_streaming"`
	DeadlineS    float64 `json:"deadline_s"`

	Setup setup `json:"setup"`

	// From ExecuteWorkflow until every tablet was Streaming (by the status
	// query; 0: not reached), and until tabletd had served every tablet a
	// GetChanges (0: not reached).
	AllStreamingS float64 `json:"all_streaming_s"`
	AllServedS    float64 `json:"all_served_s"`
	// Timeline: when 1000, 2000, … N tablets were first seen Streaming in
	// the status query, and served by tabletd (null: not reached).
	Timeline []milestone `json:"timeline"`
	// FinalStates counts the tablets' states in the last status read.
	FinalStates    map[string]int `json:"final_states"`
	FinalStreaming int            `json:"final_streaming"`
	FinalServed    int            `json:"final_served"`
	FinalRows      int            `json:"final_status_rows"`
	// StatusQuery: its result's size and how long it took, at the end.
	StatusQueryBytes int     `json:"status_query_bytes"`
	StatusQueryS     float64 `json:"status_query_s"`
	StatusErrors     int     `json:"status_query_errors"`
	// StarterStatusS: `starter status --json` at the end, each of three
	// calls (the status query, then a describe of every running tablet
	// for its live heartbeat: docs/operating.md#live-status), wall time
	// of the process; StarterStatusError: why one failed.
	StarterStatusS     []float64 `json:"starter_status_s,omitempty"`
	StarterStatusError string    `json:"starter_status_error,omitempty"`
	LastStatusError    string    `json:"last_status_query_error,omitempty"`

	// Runs of the stream workflow (continue-as-new), first to current.
	StreamRuns         int       `json:"stream_runs"`
	StreamRunsExpected int       `json:"stream_runs_expected"`
	Runs               []runInfo `json:"runs"`
	StreamEventsTotal  int64     `json:"stream_history_events_all_runs"`
	// One tablet's workflow (its current run) and its events by type.
	TabletWorkflow      string           `json:"tablet_workflow"`
	TabletEvents        int64            `json:"tablet_history_events"`
	TabletEventsPerType map[string]int64 `json:"tablet_history_events_by_type"`
	// ReadTopologyBytes is what one topology read (the ReadTopology
	// activity's result, JSON as the SDK encodes it) adds to the stream's
	// history; FullListingBytes is the full listing with every replica
	// (ListTablets). The server refuses a payload above its blob size
	// limit (2 MiB by default).
	ReadTopologyBytes int `json:"read_topology_result_bytes"`
	FullListingBytes  int `json:"full_listing_bytes"`

	// Memory, MiB. The base is the idle worker before the stream starts;
	// per tablet is (RSS at the end − base) / tablets, in KiB.
	WorkerRSSBaseMiB       float64 `json:"worker_rss_base_mib"`
	WorkerRSSMiB           float64 `json:"worker_rss_mib"`
	WorkerPeakRSSMiB       float64 `json:"worker_peak_rss_mib"`
	WorkerRSSPerTabletKiB  float64 `json:"worker_rss_per_tablet_kib"`
	WorkerPeakPerTabletKiB float64 `json:"worker_peak_rss_per_tablet_kib"`
	DevServerPeakRSSMiB    float64 `json:"dev_server_peak_rss_mib"`
	TabletdPeakRSSMiB      float64 `json:"tabletd_peak_rss_mib"`

	// CPU seconds per process (and the host: busy over all cores) while
	// the tablets start (stream start → all Streaming or the deadline) and
	// in the steady window after.
	CPUStartup    map[string]float64 `json:"cpu_seconds_startup"`
	StartupWallS  float64            `json:"startup_wall_s"`
	CPUSteady     map[string]float64 `json:"cpu_seconds_steady,omitempty"`
	SteadyWindowS float64            `json:"steady_window_s,omitempty"`
	// SteadyStreaming: tablets Streaming at the end of the steady window;
	// SteadyRuns: stream runs started in it (continue-as-new while every
	// tablet streams: the stream's history size, not the waves).
	SteadyStreaming int `json:"steady_streaming,omitempty"`
	SteadyRuns      int `json:"steady_stream_runs,omitempty"`

	// Logged is what each process logged at warn level and above, by
	// message, most frequent first.
	Logged map[string][]logLine `json:"logged"`
	// Samples: every few polls, the stream as seen.
	Samples []sample `json:"samples"`
	// Dir is where the logs were kept (only when the run missed the goal
	// or --keep).
	Dir string `json:"kept_dir,omitempty"`
}

type setup struct {
	Host                    string          `json:"host"`
	LoadAvgAtStart          float64         `json:"host_load_avg_1m_at_start"`
	Tablets                 int             `json:"tablets"`
	Replicas                int             `json:"replicas"`
	ServersPerCell          int             `json:"servers_per_cell"`
	Cells                   int             `json:"cells"`
	WriteRate               float64         `json:"write_rate_records_per_s"`
	WorkerMaxActivities     int             `json:"worker_max_concurrent_activities"`
	WorkerPollers           int             `json:"worker_pollers"`
	StreamConfig            json.RawMessage `json:"stream_config"`
	DevServerArgs           []string        `json:"dev_server_args"`
	StatusPollIntervalS     float64         `json:"status_poll_interval_s"`
	MaxChildrenPerRun       int             `json:"max_children_per_run"`
	TabletdMaxTabletsRaised string          `json:"note,omitempty"`
}

type milestone struct {
	Tablets    int      `json:"tablets"`
	StreamingS *float64 `json:"streaming_s"`
	ServedS    *float64 `json:"served_s"`
}

type runInfo struct {
	Run    int    `json:"run"`
	RunID  string `json:"run_id"`
	Status string `json:"status"`
	// StartedS: the run's start, from ExecuteWorkflow; ClosedS its close.
	StartedS float64 `json:"started_s"`
	ClosedS  float64 `json:"closed_s,omitempty"`
	// InputBytes: the run's input (config + the state carried across
	// continue-as-new); the server refuses one above its blob size limit.
	InputBytes    int              `json:"input_bytes"`
	Events        int64            `json:"history_events"`
	HistoryBytes  int64            `json:"history_bytes"`
	EventsPerType map[string]int64 `json:"events_by_type"`
	Times         *runTimes        `json:"times,omitempty"`
}

type sample struct {
	T         float64        `json:"t_s"`
	Streaming int            `json:"streaming"`
	Served    int            `json:"served"`
	Rows      int            `json:"rows"`
	States    map[string]int `json:"states,omitempty"`
	Run       string         `json:"run,omitempty"`
	WorkerRSS float64        `json:"worker_rss_mib"`
	QueryS    float64        `json:"status_query_s"`
	Err       string         `json:"error,omitempty"`
}

type logLine struct {
	Count int    `json:"count"`
	Msg   string `json:"msg"`
	First string `json:"first"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// run starts the world (dev server, tabletd, an idle worker), starts the
// stream and watches its tablets reach Streaming, keeps measuring for a
// steady window, reads the histories and writes the result. It returns
// an error only when it could not measure.
func run() error {
	o := parseFlags()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	bin, err := filepath.Abs(o.binDir)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "tabletflow-scale-")
	if err != nil {
		return err
	}
	b := &bench{procs: procs.Group{Bin: bin, Dir: dir}}
	keepDir := o.keep
	defer func() {
		b.procs.StopAll()
		if keepDir {
			fmt.Fprintln(os.Stderr, "scale: kept", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	cfg, err := o.streamConfig(dir)
	if err != nil {
		return err
	}
	res := o.newResult()

	// The world: dev server, tabletd, worker.
	ds, err := b.startDevServer(bin, dir, res.Setup.DevServerArgs)
	if err != nil {
		return err
	}
	defer b.temporal.Close()

	publish.Logf("starting tabletd: %d tablets × %d replicas, %.0f records/s", o.tablets, o.replicas, o.rate)
	if err := b.startTabletd(ctx, o.tablets, o.replicas, o.rate); err != nil {
		return err
	}
	defer b.conn.Close()
	cfg = []byte(strings.Replace(string(cfg), `"TABLETD"`, strconv.Quote(b.tdAddr), 1))
	res.Setup.StreamConfig = cfg
	if err := b.sizeTopology(ctx, o.tablets, &res); err != nil {
		return err
	}
	if err := b.startIdleWorker(ctx, ds.Addr, o, &res); err != nil {
		return err
	}

	// The stream.
	w, err := b.startStream(ctx, o, cfg, &res)
	if err != nil {
		return err
	}
	// Interrupted (Ctrl-C): the result still says how far it got.
	interrupted := ctx.Err() != nil
	if interrupted {
		publish.Logf("interrupted: writing what was measured")
	}
	b.recordStartup(w, &res)
	if res.AllStreaming && o.steady > 0 && !interrupted {
		b.steadyWindow(ctx, o.steady, w, &res)
	}
	// What follows reads histories: its own deadline, and it runs even
	// after an interrupt.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	b.finalFigures(ctx, o.tablets, ds, &res)
	b.histories(ctx, o.tablets, &res)
	b.conclude(&res, o.tablets, w, interrupted)
	if !res.AllStreaming {
		keepDir = true
		res.Dir = dir
	}
	publish.Logf("%s", res.Verdict)
	return publish.JSON(o.out, res)
}

// options are the command's flags.
type options struct {
	binDir      string
	tablets     int
	replicas    int
	rate        float64
	out         string
	timeout     time.Duration
	steady      time.Duration
	poll        time.Duration
	pollers     int
	runDuration string
	heartbeat   string
	maxWait     string
	refresh     string
	devServer   func() []string // the dev server's arguments (procs.DevServerFlags)
	keep        bool
}

// parseFlags defines the command's flags and parses the command line.
func parseFlags() options {
	var o options
	flag.StringVar(&o.binDir, "bin", "./bin", "directory holding temporal, tabletd and worker")
	flag.IntVar(&o.tablets, "tablets", 5000, "tablets")
	flag.IntVar(&o.replicas, "replicas", 2, "replicas per tablet")
	flag.Float64Var(&o.rate, "rate", 10, "tabletd workload, records/s over all tablets: a trickle (each record is a sink commit with fsyncs; the data path is not what is measured)")
	flag.StringVar(&o.out, "out", "", "write the result JSON here too")
	flag.DurationVar(&o.timeout, "timeout", time.Hour, "deadline for every tablet to be Streaming, from the stream's start")
	flag.DurationVar(&o.steady, "steady", 5*time.Minute, "after every tablet streams, how long to keep measuring CPU, memory and continue-as-new")
	flag.DurationVar(&o.poll, "poll", 5*time.Second, "status query interval")
	flag.IntVar(&o.pollers, "pollers", 16, "worker --pollers")
	flag.StringVar(&o.runDuration, "run-duration", "30m", "stream config run.duration: one GetChanges activity's run (each run's end costs the server a few writes per tablet)")
	flag.StringVar(&o.heartbeat, "heartbeat-timeout", "2m", "stream config run.heartbeatTimeout: the SDK sends a heartbeat every 0.8 × this, at most every 60 s (a server write per tablet)")
	flag.StringVar(&o.maxWait, "max-wait", "5s", "stream config batch.maxWait: an idle tablet's long-poll (one tabletd call per tablet per maxWait)")
	flag.StringVar(&o.refresh, "topology-refresh", "1m", "stream config topologyRefresh (each refresh describes every tablet workflow)")
	o.devServer = procs.DevServerFlags()
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (kept anyway when the goal is missed)")
	flag.Parse()
	return o
}

// maxActivities is the worker's --max-concurrent-activities: one
// GetChanges per tablet, plus headroom.
func (o options) maxActivities() int {
	return o.tablets + o.tablets/10 + 100
}

// streamConfig is the stream's config, sized for many tablets, with the
// source's address still "TABLETD": run puts tabletd's in once it runs.
func (o options) streamConfig(dir string) ([]byte, error) {
	return json.Marshal(map[string]any{
		"source": map[string]any{"kind": "tabletd", "keyspace": keyspace, "address": "TABLETD"},
		"sink":   map[string]any{"kind": "jsonl", "path": filepath.Join(dir, "sink")},
		"batch":  map[string]any{"maxRecords": 1000, "maxWait": o.maxWait},
		"run":    map[string]any{"duration": o.runDuration, "heartbeatTimeout": o.heartbeat},
		// Cells and types as the defaults; a topology refresh every 30 s.
		"topologyRefresh": o.refresh,
	})
}

// newResult is the result with the run's goal and setup, before anything
// is measured (the stream's config is added once tabletd runs).
func (o options) newResult() result {
	res := result{
		Date:    time.Now().UTC().Format(time.RFC3339),
		Command: "go run ./bench/scale " + strings.Join(os.Args[1:], " "),
		Goal:    fmt.Sprintf("every one of %d tablets Streaming (issue 8: a stream of 5000 tablets works on this machine)", o.tablets),
		Setup: setup{
			Host: hostDesc(), LoadAvgAtStart: procstat.LoadAvg(), Tablets: o.tablets, Replicas: o.replicas, ServersPerCell: 2, Cells: 3,
			WriteRate: o.rate, WorkerMaxActivities: o.maxActivities(), WorkerPollers: o.pollers,
			DevServerArgs: o.devServer(), StatusPollIntervalS: o.poll.Seconds(),
			MaxChildrenPerRun: maxChildrenPerRun,
		},
		DeadlineS: o.timeout.Seconds(),
		Logged:    map[string][]logLine{},
	}
	if o.tablets > 4096 {
		res.Setup.TabletdMaxTabletsRaised = "tabletd's --tablets cap was 4096; raised to 9999 for this benchmark (tabletd/cluster)"
	}
	return res
}

// startDevServer starts the Temporal dev server in dir with args and
// dials it (b.temporal, which the caller closes).
func (b *bench) startDevServer(bin, dir string, args []string) (*testbed.DevServer, error) {
	publish.Logf("starting the dev server")
	ds, err := testbed.StartDevServer(filepath.Join(bin, "temporal"), dir, args...)
	if err != nil {
		return nil, err
	}
	b.procs.Add("temporal", ds.Proc)
	if b.temporal, err = client.Dial(client.Options{HostPort: ds.Addr, Namespace: namespace, Logger: temporalclient.Quiet{}}); err != nil {
		return nil, err
	}
	return ds, nil
}

// sizeTopology records what tabletd's topology weighs as JSON: one
// ReadTopology result and the full listing.
func (b *bench) sizeTopology(ctx context.Context, tablets int, res *result) error {
	var err error
	if res.FullListingBytes, res.ReadTopologyBytes, err = b.topologyBytes(ctx); err != nil {
		return err
	}
	publish.Logf("topology of %d tablets as JSON: %d bytes (ReadTopology), %d bytes (full listing)", tablets, res.ReadTopologyBytes, res.FullListingBytes)
	return nil
}

// startIdleWorker starts the worker on the dev server at addr and records
// its RSS once it has settled, idle: the base of the per-tablet figures.
func (b *bench) startIdleWorker(ctx context.Context, addr string, o options, res *result) error {
	publish.Logf("starting the worker: --max-concurrent-activities %d --pollers %d", o.maxActivities(), o.pollers)
	if err := b.startWorker(ctx, addr, o.maxActivities(), o.pollers); err != nil {
		return err
	}
	// The base: the idle worker, settled, before the stream starts.
	if err := procs.Sleep(ctx, 5*time.Second); err != nil {
		return err
	}
	var err error
	if res.WorkerRSSBaseMiB, _, err = testbed.Memory(b.worker.Pid()); err != nil {
		return err
	}
	publish.Logf("worker base RSS %.1f MiB", res.WorkerRSSBaseMiB)
	return nil
}

// startStream starts the StreamWorkflow with cfg and watches it until
// every tablet is Streaming, the deadline or an interrupt; it records the
// start-up's wall time and CPU.
func (b *bench) startStream(ctx context.Context, o options, cfg []byte, res *result) (watched, error) {
	cpu0 := b.cpu()
	began := time.Now()
	b.began = began
	if _, err := b.temporal.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: streamID, TaskQueue: taskQueue},
		"StreamWorkflow", json.RawMessage(cfg)); err != nil {
		return watched{}, fmt.Errorf("start the stream: %w", err)
	}
	w := b.watch(ctx, o.tablets, o.timeout, o.poll, res)
	res.StartupWallS = round(time.Since(began).Seconds())
	res.CPUStartup = b.cpu().Minus(cpu0)
	return w, nil
}

// recordStartup records where the start-up got to: whether and when
// every tablet was Streaming and served, the last status read and the
// worker's memory.
func (b *bench) recordStartup(w watched, res *result) {
	res.AllStreaming = w.allStreaming > 0
	res.AllStreamingS, res.AllServedS = round(w.allStreaming.Seconds()), round(w.allServed.Seconds())
	res.FinalStates, res.FinalStreaming, res.FinalServed, res.FinalRows = w.last.States, w.last.Streaming, w.last.Served, w.last.Rows
	res.WorkerRSSMiB, res.WorkerPeakRSSMiB, _ = testbed.Memory(b.worker.Pid())
}

// steadyWindow keeps measuring for steady (or until interrupted) once
// every tablet streams: a sample every 30 s, then the window's CPU, the
// last tablets seen Streaming and the worker's memory.
func (b *bench) steadyWindow(ctx context.Context, steady time.Duration, w watched, res *result) {
	publish.Logf("every tablet streams after %v; steady window of %v", w.allStreaming.Round(100*time.Millisecond), steady)
	cpu1 := b.cpu()
	t0 := time.Now()
	for time.Since(t0) < steady && ctx.Err() == nil {
		_ = procs.Sleep(ctx, min(30*time.Second, steady-time.Since(t0)))
		s := b.steadySample(ctx)
		res.Samples = append(res.Samples, s)
		publish.Logf("%5.0fs (steady): %d Streaming, run %s, worker RSS %.0f MiB %s", s.T, s.Streaming, short(s.Run), s.WorkerRSS, s.Err)
	}
	res.SteadyWindowS = round(time.Since(t0).Seconds())
	res.CPUSteady = b.cpu().Minus(cpu1)
	for _, s := range slices.Backward(res.Samples) {
		if s.Err == "" {
			res.SteadyStreaming = s.Streaming
			break
		}
	}
	res.WorkerRSSMiB, res.WorkerPeakRSSMiB, _ = testbed.Memory(b.worker.Pid())
}

// steadySample is the stream as seen now: the status query's counts (or
// its error), the tablets tabletd served, the stream's run and the
// worker's RSS.
func (b *bench) steadySample(ctx context.Context) sample {
	s := sample{T: round(time.Since(b.began).Seconds())}
	if st, _, took, err := b.status(ctx); err == nil {
		s.Streaming, s.Rows, s.States, s.QueryS = st.streaming, st.rows, st.states, round(took.Seconds())
	} else {
		s.Err = clip(err.Error(), 400)
	}
	s.Served, _ = b.served(ctx)
	if d, err := b.describe(ctx, streamID, ""); err == nil {
		s.Run = d.GetWorkflowExecutionInfo().GetExecution().GetRunId()
	}
	s.WorkerRSS, _, _ = testbed.Memory(b.worker.Pid())
	return s
}

// finalFigures records the figures of the end: the worker's RSS per
// tablet, the dev server's and tabletd's peak RSS, and the final status
// query's size, time and counts.
func (b *bench) finalFigures(ctx context.Context, tablets int, ds *testbed.DevServer, res *result) {
	if n := float64(tablets); n > 0 {
		res.WorkerRSSPerTabletKiB = round((res.WorkerRSSMiB - res.WorkerRSSBaseMiB) * 1024 / n)
		res.WorkerPeakPerTabletKiB = round((res.WorkerPeakRSSMiB - res.WorkerRSSBaseMiB) * 1024 / n)
	}
	_, res.DevServerPeakRSSMiB, _ = testbed.Memory(ds.Pid())
	_, res.TabletdPeakRSSMiB, _ = testbed.Memory(b.tabletd.Pid())

	// The final status query's size and time.
	if st, size, took, err := b.status(ctx); err == nil {
		res.StatusQueryBytes, res.StatusQueryS = size, round(took.Seconds())
		res.FinalStates, res.FinalStreaming, res.FinalRows = st.states, st.streaming, st.rows
	}
	for range 3 {
		took, err := b.starterStatus(ctx, ds.Addr)
		if err != nil {
			res.StarterStatusError = err.Error()
			break
		}
		res.StarterStatusS = append(res.StarterStatusS, round(took.Seconds()))
	}
}

// starterStatus times one `starter status --json` of the stream, as an
// operator runs it (live figures included).
func (b *bench) starterStatus(ctx context.Context, addr string) (time.Duration, error) {
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(sctx, filepath.Join(b.procs.Bin, "starter"), "status", streamID, "--json")
	cmd.Env = append(os.Environ(), "TEMPORAL_ADDRESS="+addr, "TEMPORAL_NAMESPACE="+namespace)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(t0)
	if err != nil {
		return took, fmt.Errorf("starter status: %w: %.300s", err, out)
	}
	return took, nil
}

// histories records the stream's runs (and those started in the steady
// window) and one tablet's history; a history it cannot read is logged
// and left out.
func (b *bench) histories(ctx context.Context, tablets int, res *result) {
	if err := b.runs(ctx, res); err != nil {
		publish.Logf("stream runs: %v", err)
	}
	res.StreamRunsExpected = (tablets + maxChildrenPerRun - 1) / maxChildrenPerRun
	if res.SteadyWindowS > 0 {
		for _, r := range res.Runs {
			if r.StartedS > res.AllStreamingS {
				res.SteadyRuns++
			}
		}
	}
	res.TabletWorkflow = workflows.TabletWorkflowID(streamID, "t-0001")
	if n, types, _, err := b.history(ctx, res.TabletWorkflow, ""); err == nil {
		res.TabletEvents, res.TabletEventsPerType = n, types
	} else {
		publish.Logf("tablet history: %v", err)
	}
}

// conclude records what each process logged at warn level and above, and
// the verdict.
func (b *bench) conclude(res *result, tablets int, w watched, interrupted bool) {
	for _, p := range b.procs.List() {
		res.Logged[p.Name] = scanLog(p.Log())
	}
	res.Verdict = verdict(res, tablets, w)
	if interrupted {
		res.Verdict = "interrupted before the deadline: " + res.Verdict
	}
}

// verdict says the outcome in one paragraph.
func verdict(r *result, n int, w watched) string {
	if r.AllStreaming {
		return fmt.Sprintf("goal met: all %d tablets Streaming %.0f s after the stream started (tabletd served every tablet after %.0f s), in %d stream runs; worker RSS %.0f MiB (%.0f MiB idle, %.1f KiB per tablet), peak %.0f MiB",
			n, r.AllStreamingS, r.AllServedS, r.StreamRuns, r.WorkerRSSMiB, r.WorkerRSSBaseMiB, r.WorkerRSSPerTabletKiB, r.WorkerPeakRSSMiB)
	}
	states := []string{}
	for _, k := range slices.Sorted(maps.Keys(r.FinalStates)) {
		states = append(states, fmt.Sprintf("%d %s", r.FinalStates[k], k))
	}
	why := ""
	if w.lastErr != "" {
		why = "; last status query error: " + w.lastErr
	}
	return fmt.Sprintf("goal NOT met: after %.0f s only %d of %d tablets were Streaming (status rows: %d; %s), tabletd had served %d; %d stream runs%s",
		r.StartupWallS, r.FinalStreaming, n, r.FinalRows, strings.Join(states, ", "), r.FinalServed, r.StreamRuns, why)
}

type watched struct {
	allStreaming, allServed time.Duration
	last                    sample
	lastErr                 string
}

// watch polls the status query and tabletd until every tablet streams
// and was served, or the deadline.
func (b *bench) watch(ctx context.Context, n int, timeout, every time.Duration, res *result) watched {
	var w watched
	marks := []int{}
	for m := maxChildrenPerRun; m < n; m += maxChildrenPerRun {
		marks = append(marks, m)
	}
	marks = append(marks, n)
	for _, m := range marks {
		res.Timeline = append(res.Timeline, milestone{Tablets: m})
	}
	deadline := b.began.Add(timeout)
	var lastSample, lastLog time.Time
	for ctx.Err() == nil {
		now := time.Since(b.began)
		s := sample{T: round(now.Seconds())}
		st, _, took, err := b.status(ctx)
		s.QueryS = round(took.Seconds())
		if err != nil {
			res.StatusErrors++
			w.lastErr = clip(err.Error(), 400)
			res.LastStatusError = w.lastErr
			s.Err = w.lastErr
			s.Streaming, s.Rows, s.States = w.last.Streaming, w.last.Rows, w.last.States
		} else {
			s.Streaming, s.Rows, s.States = st.streaming, st.rows, st.states
		}
		if served, err := b.served(ctx); err == nil {
			s.Served = served
		} else {
			s.Served = w.last.Served
		}
		if d, err := b.describe(ctx, streamID, ""); err == nil {
			s.Run = d.GetWorkflowExecutionInfo().GetExecution().GetRunId()
		}
		s.WorkerRSS, _, _ = testbed.Memory(b.worker.Pid())
		for i := range res.Timeline {
			m := &res.Timeline[i]
			if m.StreamingS == nil && s.Streaming >= m.Tablets {
				m.StreamingS = ptr(s.T)
			}
			if m.ServedS == nil && s.Served >= m.Tablets {
				m.ServedS = ptr(s.T)
			}
		}
		if w.allStreaming == 0 && s.Streaming >= n {
			w.allStreaming = now
		}
		if w.allServed == 0 && s.Served >= n {
			w.allServed = now
		}
		w.last = s
		if time.Since(lastSample) >= 10*time.Second || (w.allStreaming > 0 && w.allServed > 0) {
			lastSample = time.Now()
			res.Samples = append(res.Samples, s)
		}
		if time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			publish.Logf("%5.0fs: %d of %d Streaming (%v), tabletd served %d, run %s, worker RSS %.0f MiB, query %.2fs %s",
				s.T, s.Streaming, n, s.States, s.Served, short(s.Run), s.WorkerRSS, s.QueryS, s.Err)
		}
		if w.allStreaming > 0 && w.allServed > 0 {
			return w
		}
		if time.Now().After(deadline) {
			publish.Logf("deadline: %d of %d Streaming, %d served", s.Streaming, n, s.Served)
			return w
		}
		_ = procs.Sleep(ctx, every)
	}
	return w
}

type statusSummary struct {
	streaming, rows int
	states          map[string]int
}

// status runs the stream's status query and counts its rows by state; a
// tablet counts as Streaming with a replica.
func (b *bench) status(ctx context.Context) (statusSummary, int, time.Duration, error) {
	var out statusSummary
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t0 := time.Now()
	v, err := b.temporal.QueryWorkflow(qctx, streamID, "", workflows.QueryStatus)
	if err != nil {
		return out, 0, time.Since(t0), err
	}
	var raw json.RawMessage
	if err := v.Get(&raw); err != nil {
		return out, 0, time.Since(t0), err
	}
	took := time.Since(t0)
	var st workflows.StreamStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return out, len(raw), took, err
	}
	out.rows = len(st.Tablets)
	out.states = map[string]int{}
	for _, t := range st.Tablets {
		out.states[string(t.State)]++
		if t.State == workflows.Streaming && t.Replica != "" {
			out.streaming++
		}
	}
	if st.Topology != nil {
		out.states["(topology trouble: "+clip(st.Topology.Error, 200)+")"] = 1
	}
	return out, len(raw), took, nil
}

// served counts the tablets whose GetChanges reached a replica, by
// tabletd's account of the stream.
func (b *bench) served(ctx context.Context) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := b.topo.DescribeStream(qctx, &sourcepb.DescribeStreamRequest{Stream: streamID})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, t := range s.Tablets {
		if t.LastReplica != "" {
			n++
		}
	}
	return n, nil
}

// runs walks the stream's continue-as-new chain back from its current run.
func (b *bench) runs(ctx context.Context, res *result) error {
	d, err := b.describe(ctx, streamID, "")
	if err != nil {
		return err
	}
	runID := d.GetWorkflowExecutionInfo().GetExecution().GetRunId()
	var runs []runInfo
	for runID != "" && len(runs) < 1000 {
		d, err := b.describe(ctx, streamID, runID)
		if err != nil {
			return err
		}
		info := d.GetWorkflowExecutionInfo()
		r := runInfo{RunID: runID, Status: strings.TrimPrefix(info.GetStatus().String(), "WORKFLOW_EXECUTION_STATUS_"),
			StartedS: round(info.GetStartTime().AsTime().Sub(b.began).Seconds()),
			Events:   info.GetHistoryLength(), HistoryBytes: info.GetHistorySizeBytes()}
		if ct := info.GetCloseTime(); ct != nil && ct.IsValid() && !ct.AsTime().IsZero() {
			r.ClosedS = round(ct.AsTime().Sub(b.began).Seconds())
		}
		first, err := b.temporal.WorkflowService().GetWorkflowExecutionHistory(ctx, &workflowservice.GetWorkflowExecutionHistoryRequest{
			Namespace: namespace, Execution: info.GetExecution(), MaximumPageSize: 1})
		if err != nil {
			return err
		}
		prev := ""
		if ev := first.GetHistory().GetEvents(); len(ev) > 0 {
			a := ev[0].GetWorkflowExecutionStartedEventAttributes()
			for _, p := range a.GetInput().GetPayloads() {
				r.InputBytes += len(p.GetData())
			}
			prev = a.GetContinuedExecutionRunId()
		}
		if _, types, times, err := b.history(ctx, streamID, runID); err == nil {
			r.EventsPerType, r.Times = types, times
		}
		runs = append(runs, r)
		runID = prev
	}
	slices.Reverse(runs)
	for i := range runs {
		runs[i].Run = i + 1
		res.StreamEventsTotal += runs[i].Events
	}
	res.Runs, res.StreamRuns = runs, len(runs)
	return nil
}

// history counts a workflow run's events by type (runID "": the current
// run) and times its child starts and workflow tasks.
func (b *bench) history(ctx context.Context, id, runID string) (int64, map[string]int64, *runTimes, error) {
	events, err := history.Events(ctx, b.temporal, id, runID)
	if err != nil {
		return 0, nil, nil, err
	}
	types := map[string]int64{}
	var n int64
	var (
		childFirst, childLast time.Time
		children              int
		wtScheduled           = map[int64]time.Time{}
		wtStarted             = map[int64]time.Time{}
		wait, work            []float64
	)
	for _, ev := range events {
		n++
		types[strings.TrimPrefix(ev.GetEventType().String(), "EVENT_TYPE_")]++
		at := ev.GetEventTime().AsTime()
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
			if children == 0 {
				childFirst = at
			}
			childLast = at
			children++
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
			wtScheduled[ev.GetEventId()] = at
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED:
			a := ev.GetWorkflowTaskStartedEventAttributes()
			if s, ok := wtScheduled[a.GetScheduledEventId()]; ok {
				wait = append(wait, at.Sub(s).Seconds())
			}
			wtStarted[ev.GetEventId()] = at
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
			if s, ok := wtStarted[ev.GetWorkflowTaskCompletedEventAttributes().GetStartedEventId()]; ok {
				work = append(work, at.Sub(s).Seconds())
			}
		}
	}
	t := &runTimes{Children: children, TaskWaitS: spreadOf(wait), TaskWorkS: spreadOf(work)}
	if children > 0 {
		t.FirstChildS = round(childFirst.Sub(b.began).Seconds())
		t.LastChildS = round(childLast.Sub(b.began).Seconds())
		if d := childLast.Sub(childFirst).Seconds(); d > 0 && children > 1 {
			t.ChildrenPerS = round(float64(children-1) / d)
		}
	}
	return n, types, t, nil
}

// runTimes is how a run went: its tablet workflows' starts and its
// workflow tasks' schedule-to-start (wait) and start-to-complete (work).
type runTimes struct {
	Children     int     `json:"children_started"`
	FirstChildS  float64 `json:"first_child_started_s,omitempty"`
	LastChildS   float64 `json:"last_child_started_s,omitempty"`
	ChildrenPerS float64 `json:"children_started_per_s,omitempty"`
	TaskWaitS    spread  `json:"workflow_task_wait_s"`
	TaskWorkS    spread  `json:"workflow_task_work_s"`
}

// spread is a few order statistics, in seconds.
type spread struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	Max    float64 `json:"max"`
	Sum    float64 `json:"sum"`
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	slices.Sort(v)
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	q := func(f float64) float64 { return round(v[min(len(v)-1, int(f*float64(len(v))))]) }
	return spread{N: len(v), Median: q(0.5), P90: q(0.9), Max: round(v[len(v)-1]), Sum: round(sum)}
}

// topologyBytes is the size of the full listing and of what the
// ReadTopology activity returns, as the SDK encodes them (JSON).
func (b *bench) topologyBytes(ctx context.Context) (full, slim int, err error) {
	src, err := tabletd.Dial(b.tdAddr, keyspace, tabletd.Options{})
	if err != nil {
		return 0, 0, err
	}
	defer src.Close()
	tablets, err := src.ListTablets(ctx)
	if err != nil {
		return 0, 0, err
	}
	f, err := json.Marshal(tablets)
	if err != nil {
		return 0, 0, err
	}
	s, err := json.Marshal(activities.TopologyOf(tablets))
	return len(f), len(s), err
}

func (b *bench) startTabletd(ctx context.Context, tablets, replicas int, rate float64) error {
	addr, err := testbed.FreeAddr()
	if err != nil {
		return err
	}
	b.tdAddr = addr
	p, err := b.procs.Start("tabletd", "serve", "--listen", addr, "--tablets", strconv.Itoa(tablets), "--replicas", strconv.Itoa(replicas),
		"--rate", strconv.FormatFloat(rate, 'f', -1, 64), "--retention", "1h", "--log-level", "warn")
	if err != nil {
		return err
	}
	b.tabletd = p
	if b.conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20))); err != nil {
		return err
	}
	b.admin, b.topo = sourcepb.NewAdminClient(b.conn), sourcepb.NewTopologyClient(b.conn)
	return waitFor(ctx, p, "tabletd", 60*time.Second, func() error {
		_, err := b.admin.Workload(ctx, &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STATUS})
		return err
	})
}

func (b *bench) startWorker(ctx context.Context, addr string, maxAct, pollers int) error {
	p, err := b.procs.Start("worker", "--address", addr, "--task-queue", taskQueue, "--log-level", "warn",
		"--max-concurrent-activities", strconv.Itoa(maxAct), "--pollers", strconv.Itoa(pollers))
	if err != nil {
		return err
	}
	b.worker = p
	return waitFor(ctx, p, "worker", 60*time.Second, procs.Polling(ctx, b.temporal, taskQueue))
}

func hostDesc() string {
	mem := 0.0
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				mem = kb / (1 << 20)
			}
		}
	}
	return fmt.Sprintf("%d cores, %.0f GiB, %s/%s", runtime.NumCPU(), math.Round(mem), runtime.GOOS, runtime.GOARCH)
}

func ptr[T any](v T) *T { return &v }

func round(f float64) float64 { return math.Round(f*100) / 100 }

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// describe is DescribeWorkflow's raw response.
func (b *bench) describe(ctx context.Context, id, runID string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	d, err := b.temporal.DescribeWorkflow(ctx, id, runID)
	if err != nil {
		return nil, err
	}
	return d.RawResponse, nil
}
