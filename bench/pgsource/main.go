// Command pgsource measures tabletflow reading one PostgreSQL shard end to
// end against a raw pglogrepl loop over the same WAL, in one run, and
// writes a JSON result.
//
// It starts, in a temporary directory, a test bed of one shard (a primary
// and one physical standby, PostgreSQL 18 from `make pg`) and a Temporal
// dev server. Before anything is written it creates every reader's logical
// slot on the standby (pgoutput), so each covers the same WAL:
//
//   - the stream "flow": the adapter's EnsureStream, as the StreamWorkflow of
//     that ID does (its own call then finds it: idempotent);
//   - the stream "reader": the same, for the adapter loop below;
//   - the slot "tfbench_raw", on the publication of "flow".
//
// Then it writes a fixed workload into the primary (--records row changes,
// transactions of mostly 4 or 5 rows, pipelined on --writers connections),
// waits for the standby to replay it, and reads it three times from the
// standby, one reader after the other:
//
//   - raw: a plain loop on a replication connection: pglogrepl.Parse of
//     every message, each row change encoded as the JSONL line the
//     tabletflow stream writes (the bench's own encoder, checked byte for
//     byte against tabletflow's output), one write + fsync + standby status
//     update per batch of --batch records. The floor: what a hand-written
//     CDC consumer of this WAL costs.
//   - reader: the adapter's postgres.Reader and the JSONL sink in a loop
//     (GetChanges → Write → Commit → Ack), no Temporal: where tabletflow's
//     cost is the adapter and the exactly-once sink, not orchestration.
//   - tabletflow: the worker binary with the DSNs in its environment and a
//     StreamWorkflow reading the standby into a JSONL directory, timed from
//     ExecuteWorkflow until the standby's slot is confirmed at the last
//     transaction (the ack follows the sink's commit).
//
// Every output is checked: the three files hold the same lines (the stream
// name aside) and the expected count; the sinks' digests find no position
// twice; replaying tabletflow's records gives the primary's tables.
//
// For the two loops in this program the result splits the wall time into
// reading, writing+syncing and acknowledging; --cpuprofile profiles them
// (raw and reader), to say where the adapter's time goes.
//
// It is a program, not a testing.B, so that `go test`'s timeout cannot cut
// it and so that it can run the real binaries.
//
//	go run ./bench/pgsource --bin ./bin --out bench/results/pgsource.json
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/client"

	_ "github.com/tabletflow/tabletflow/adapters" // the kinds config.Decode checks
	"github.com/tabletflow/tabletflow/bench/internal/pass"
	"github.com/tabletflow/tabletflow/bench/internal/procs"
	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

const (
	shardID      = "s1"
	flowID       = "flow"   // the StreamWorkflow's ID, hence its source-side stream
	readerStream = "reader" // the adapter loop's stream
	rawSlot      = "tfbench_raw"
	taskQueue    = "bench"
	goalRatio    = 0.8
	// maxWait is the batch's long poll, tabletflow's default.
	maxWait = config.DefaultMaxWait
	// loopTimeout bounds each reader's run.
	loopTimeout = 3 * time.Minute
)

// The shard's replicas as the stream's config names them.
var (
	primary = postgres.ShardReplica{Alias: "zone1-s1p", Cell: "zone1", Type: string(source.TypePrimary), DSNEnv: "TF_BENCH_S1_P_DSN"}
	standby = postgres.ShardReplica{Alias: "zone2-s1a", Cell: "zone2", Type: string(source.TypeReplica), DSNEnv: "TF_BENCH_S1_A_DSN"}
)

type result struct {
	publish.Origin

	Records      uint64  `json:"records"`
	Transactions int     `json:"transactions"`
	WALBytes     uint64  `json:"wal_bytes"`
	BatchRecords int     `json:"batch_records"`
	WriteSeconds float64 `json:"workload_write_seconds"`
	WriteRate    float64 `json:"workload_records_per_s"`
	Verified     string  `json:"verified"`

	Raw        pass.Figures `json:"raw"`
	Reader     pass.Figures `json:"reader"`
	Tabletflow pass.Figures `json:"tabletflow"`
	// TabletflowReplicationStartS: from ExecuteWorkflow until the
	// standby's walsender for the stream's slot was active (workflow, child
	// workflow, replica selection, the GetChanges activity connecting).
	TabletflowReplicationStartS float64 `json:"tabletflow_replication_start_s"`
	WorkerPeakRSSMiB            float64 `json:"worker_peak_rss_mib"`

	// Ratio is tabletflow / raw, end to end; the goal is on it.
	Ratio       float64 `json:"ratio"`
	SteadyRatio float64 `json:"steady_ratio"`
	ReaderRatio float64 `json:"reader_ratio"`
	GoalRatio   float64 `json:"goal_ratio"`
	MeetsGoal   bool    `json:"meets_goal"`
	Verdict     string  `json:"verdict"`

	HostLoadAvg1mAtStart float64 `json:"host_load_avg_1m_at_start"`
}

func main() { procs.Main("pgsource", run) }

func run() error {
	rn := procs.NewRun("pgsource")
	records := flag.Int("records", 500_000, "row changes to write (the exact count is what the transactions affected)")
	writers := flag.Int("writers", 4, "connections writing the workload at once")
	batch := flag.Int("batch", 1000, "records per batch, for every reader (tabletflow's default)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this program during the raw and reader loops here (the figures then carry its cost)")
	flag.Parse()

	ctx, stop, bin, dir, err := rn.Start()
	if err != nil {
		return err
	}
	defer stop()
	b := &bench{procs: procs.Group{Bin: bin, Dir: dir}, batch: *batch, devServer: rn.DevServer()}
	failed := true
	defer func() { rn.End(&b.procs, failed, b.close) }()

	res := result{Origin: publish.Now("go run ./bench/pgsource"), BatchRecords: *batch, GoalRatio: goalRatio,
		HostLoadAvg1mAtStart: procstat.LoadAvg()}
	if err := b.start(ctx, rn, dir); err != nil {
		return err
	}
	start, err := b.createReaders(ctx)
	if err != nil {
		return err
	}

	w, err := b.write(ctx, *records, *writers)
	if err != nil {
		return fmt.Errorf("workload: %w", err)
	}
	res.Records, res.Transactions, res.WALBytes = w.records, w.txs, w.walBytes
	res.WriteSeconds, res.WriteRate = w.took.Seconds(), float64(w.records)/w.took.Seconds()
	publish.Logf("workload: %d row changes in %d transactions, %d bytes of WAL, in %v (%.0f records/s); standby replayed",
		w.records, w.txs, w.walBytes, w.took.Round(time.Millisecond), res.WriteRate)

	if *cpuProfile != "" {
		stopProfile, err := profile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
		res.Command += " (profiled: figures not for quoting)"
	}
	rawDir := filepath.Join(dir, "raw")
	raw, err := b.raw(ctx, rawDir, w.records)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	res.Raw = raw.Figures
	publish.Logf("raw: %s", raw.Figures)

	readerDir := filepath.Join(dir, "reader")
	if res.Reader, err = b.reader(ctx, readerDir, w.records, start[readerStream]); err != nil {
		return fmt.Errorf("reader: %w", err)
	}
	publish.Logf("reader: %s", res.Reader)

	if *cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if err := b.startWorker(ctx); err != nil {
		return err
	}
	flowDir := filepath.Join(dir, "flow")
	fl, err := b.flow(ctx, flowDir, start[flowID], raw.last)
	if err != nil {
		return fmt.Errorf("tabletflow: %w", err)
	}
	res.TabletflowReplicationStartS = fl.replicating.Seconds()
	if _, res.WorkerPeakRSSMiB, err = testbed.Memory(b.worker.Pid()); err != nil {
		return fmt.Errorf("worker memory: %w", err)
	}

	v, err := b.verify(ctx, w.records, rawDir, readerDir, flowDir, fl.firstAck)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	res.Verified = v.summary
	res.Tabletflow = fl.result(w.records, v.flowFirstAck)
	publish.Logf("tabletflow: %s (replication started after %v)", res.Tabletflow, fl.replicating.Round(time.Millisecond))

	res.Ratio = res.Tabletflow.RecordsPerS / res.Raw.RecordsPerS
	res.SteadyRatio = res.Tabletflow.SteadyRecordsPerS / res.Raw.SteadyRecordsPerS
	res.ReaderRatio = res.Reader.RecordsPerS / res.Raw.RecordsPerS
	res.MeetsGoal = res.Ratio >= goalRatio
	verdict := "missed"
	if res.MeetsGoal {
		verdict = "met"
	}
	res.Verdict = fmt.Sprintf("goal tabletflow/raw >= %.2f %s: %.2f (%.0f against %.0f records/s end to end; steady %.2f; adapter loop without Temporal %.2f)",
		goalRatio, verdict, res.Ratio, res.Tabletflow.RecordsPerS, res.Raw.RecordsPerS, res.SteadyRatio, res.ReaderRatio)
	res.Setup = setupNotes(*writers, *batch)
	res.Setup = append(res.Setup, "the dev server's extra arguments: "+strings.Join(b.devServer, " "))
	publish.Logf("%s", res.Verdict)

	if err := publish.JSON(rn.Out(), res); err != nil {
		return err
	}
	failed = false
	return nil
}

// profile starts a CPU profile into path; the returned func stops it and
// closes the file (StopCPUProfile may have run already).
func profile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// setupNotes say what was measured, for the result file.
func setupNotes(writers, batch int) []string {
	return []string{
		"bed: pgbed, 1 shard = PostgreSQL 18 primary + 1 physical standby on loopback (fsync=off, full_page_writes=off, wal_level=logical); every reader reads the standby",
		"slots: the streams 'flow' (tabletflow) and 'reader' (adapter loop) made by the adapter's EnsureStream, and 'tfbench_raw' on flow's publication, all pgoutput, all created on the standby before the workload: the same WAL",
		fmt.Sprintf("workload: written before any reading, pipelined on %d connections, each transaction one round trip: insert an order and an item, update the previous order (REPLICA IDENTITY FULL: whole old row), delete the item of two transactions back, every 8th also deletes an order; then the standby replays it", writers),
		fmt.Sprintf("raw: one replication connection (pglogrepl.StartReplication, proto_version 1, the adapter's plugin options), pglogrepl.Parse of every message, each row change encoded by the bench as the stream's JSONL line (positions (commit end LSN, ordinal), key from the primary key, before/after as JSON), one write+fsync and one standby status update per batch of %d records or more (whole transactions); timed from connecting to the last fsync", batch),
		fmt.Sprintf("reader: the adapter's postgres.Reader over the standby and the JSONL sink in one loop, GetChanges(maxRecords %d, maxWait %v) -> Write -> Commit (data fsync, manifest temp file fsync, rename, dir fsync) -> Ack, as the GetChanges activity does, without Temporal; timed from opening the sink to the last commit", batch, maxWait),
		fmt.Sprintf("tabletflow: Temporal dev server (temporal server start-dev) and the worker binary (DSNs in its environment), a StreamWorkflow of the shard (selection REPLICA, batch %d records / %v, run 1m) into a JSONL directory; timed from ExecuteWorkflow until the standby's slot is confirmed at the last transaction's end LSN (the ack follows the sink's commit), polled every 20 ms", batch, maxWait),
		"order: raw, then reader, then tabletflow, one after the other on the same 2 cores; the first commit time and steady rate of tabletflow count the records at or below the first LSN its slot was confirmed at",
		"verified: the three outputs hold the same lines byte for byte (the stream name aside) and the workload's count; the sinks' digests find no position twice; replaying tabletflow's records gives the primary's tables",
	}
}

// bench is the run's world: the bed, the dev server, the worker, clients.
type bench struct {
	procs     procs.Group
	batch     int
	devServer []string // the dev server's extra arguments

	bed      *pgbed.Cluster
	server   *testbed.DevServer
	temporal client.Client
	srcCfg   postgres.Config
	env      map[string]string // DSN variables, for the adapter and the worker
	src      *postgres.Source
	admin    *pgx.Conn // superuser on the standby: slot positions, walsender pids
	worker   *procs.Proc
}

func (b *bench) shard() *pgbed.Shard { return b.bed.Shards[0] }

// start runs the bed and the dev server side by side, then connects to
// both.
func (b *bench) start(ctx context.Context, rn *procs.Run, dir string) error {
	var err error
	b.server, b.temporal, err = b.procs.StartDevServer(b.devServer, func() (err error) {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		b.bed, err = pgbed.Start(sctx, pgbed.Options{Dir: filepath.Join(dir, "pg"), Shards: 1, Standbys: 1})
		if b.bed != nil {
			rn.Bed(b.bed.Close, b.bedLogs)
		}
		return err
	})
	if err != nil {
		return err
	}
	sh := b.shard()
	b.env = map[string]string{primary.DSNEnv: sh.Primary.DSN(), standby.DSNEnv: sh.Standbys[0].DSN()}
	b.srcCfg = postgres.Config{Kind: "postgres", Tables: pgbed.Tables,
		Shards: []postgres.Shard{{ID: shardID, Replicas: []postgres.ShardReplica{primary, standby}}}}
	if b.src, err = postgres.New(b.srcCfg, func(k string) string { return b.env[k] }); err != nil {
		return err
	}
	b.admin, err = sh.Standbys[0].Connect(ctx)
	publish.Logf("bed and dev server up")
	return err
}

// createReaders makes every reader's slot before anything is written and
// returns where the two streams start the shard.
func (b *bench) createReaders(ctx context.Context) (map[string]source.Checkpoint, error) {
	start := map[string]source.Checkpoint{}
	for _, id := range []string{flowID, readerStream} {
		st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: id, Tables: pgbed.Tables, StartFrom: source.StartEarliest})
		if err != nil {
			return nil, fmt.Errorf("ensure stream %s: %w", id, err)
		}
		start[id] = st.Start[shardID]
	}
	lsn, err := b.shard().Standbys[0].CreateLogicalSlot(ctx, rawSlot, "pgoutput")
	if err != nil {
		return nil, err
	}
	publish.Logf("slots: %s at %s, %s at %s, %s at %s", flowID, pglogrepl.LSN(start[flowID].Term),
		readerStream, pglogrepl.LSN(start[readerStream].Term), rawSlot, lsn)
	return start, nil
}

// startWorker runs the worker binary with the DSN variables in its
// environment and waits until it polls the task queue.
func (b *bench) startWorker(ctx context.Context) error {
	var env []string
	for k, v := range b.env {
		env = append(env, k+"="+v)
	}
	var err error
	b.worker, err = b.procs.StartWorker(ctx, b.temporal, b.server.Addr, taskQueue, env)
	return err
}

// close closes the clients (the run stops the children and the bed).
func (b *bench) close() {
	if b.temporal != nil {
		b.temporal.Close()
	}
	if b.src != nil {
		_ = b.src.Close()
	}
	if b.admin != nil {
		_ = b.admin.Close(context.Background())
	}
}

// bedLogs is the end of each server's log.
func (b *bench) bedLogs() string {
	var s strings.Builder
	for _, n := range b.bed.Nodes() {
		fmt.Fprintf(&s, "--- %s (%s) ---\n%s\n", n.Name, n.LogPath(), n.Tail())
	}
	return strings.TrimSuffix(s.String(), "\n")
}

// cpu is the CPU time used so far, in seconds: by each child process, by
// this program ("bench"), by the walsender process walsender (if not 0)
// and by the host ("host_busy": all cores, steal included).
func (b *bench) cpu(walsender int) procstat.Snapshot {
	return b.procs.Usage("walsender", walsender)
}
