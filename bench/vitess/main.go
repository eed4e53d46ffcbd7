// Command vitess measures tabletflow reading one Vitess shard end to end
// against a raw VStream loop on the same vttablet over the same backlog,
// in one run, and writes a JSON result.
//
// It starts, in a temporary directory, the Vitess test bed
// (testbed/vitessbed: keyspace commerce, shards -80 and 80-, each a
// primary and a replica in each of zone2 and zone3, over MariaDB) and a
// Temporal dev server. It stops replication on the shard's zone3 replica
// (no reader uses it, and it would otherwise replay the backlog while the
// readers run), writes a fixed backlog into shard -80's primary (--records
// row changes, transactions of mostly 4 or 5 rows, on --writers
// connections straight to its MariaDB), waits for the zone2 replica to
// replay it, and then reads the backlog from that replica's vttablet in
// --pairs pairs, the two sides of a pair one after the other, the raw
// loop first in the odd pairs and tabletflow first in the even ones:
//
//   - raw: a plain loop on the vttablet's own queryservice VStream (the
//     call the adapter makes, with its filter) from the backlog's start
//     to its last transaction, each row change encoded as the JSONL line
//     the tabletflow stream writes (the bench's own encoder, checked byte
//     for byte against tabletflow's output), one write and fdatasync per
//     batch of --batch records or more (whole transactions). The floor:
//     what a hand-written consumer of this VStream costs.
//   - tabletflow: the worker binary and a StreamWorkflow of the keyspace
//     (selection REPLICA in zone2 only, so it reads the same vttablet)
//     into a JSONL directory whose manifest for the shard already holds
//     the backlog's start (a sink's checkpoint is where a tablet resumes:
//     a Vitess stream has no other way to start before its first read).
//     Timed from ExecuteWorkflow until the sink's manifest holds the last
//     transaction's checkpoint (the sink's commit point), polled every
//     20 ms; then the stream is stopped and waited for.
//
// Then, once, the adapter alone (--reader): the adapter's Reader and the
// JSONL sink in a loop, no Temporal, to tell the adapter's and the sink's
// cost from the orchestration's.
//
// Every output is checked: each holds the same lines as the first raw
// pass's (the stream name aside) and the backlog's count; the sinks'
// digests find no position twice; replaying tabletflow's records gives
// the shard's tables as its primary holds them.
//
// The goal is on the median pair's ratio tabletflow/raw, end to end.
// --cpu-profile and --trace take the worker's CPU profile and execution
// trace over the first tabletflow pass, --worker-arg passes the worker
// more flags and --linger sets the stream's batch.linger, to find where
// tabletflow's time goes (docs/benchmarks.md).
//
// It is a program, not a testing.B, so that `go test`'s timeout cannot cut
// it and so that it can run the real binaries.
//
//	go run ./bench/vitess --bin ./bin --out bench/results/vitess.json
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"golang.org/x/sys/unix"

	_ "github.com/tabletflow/tabletflow/adapters" // the kinds config.Decode checks
	"github.com/tabletflow/tabletflow/bench/internal/pass"
	"github.com/tabletflow/tabletflow/bench/internal/procs"
	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

const (
	shardID     = "-80"
	readCell    = "zone2" // the cell of the replica every side reads
	idleCell    = "zone3" // the cell of the replica whose replication is stopped
	taskQueue   = "bench"
	goalRatio   = 0.8
	aimRatio    = 0.9
	passTimeout = 3 * time.Minute // bounds each pass
)

type result struct {
	publish.Origin

	Records      uint64  `json:"records"`
	Transactions int     `json:"transactions"`
	From         string  `json:"from_position"`
	To           string  `json:"to_position"`
	BatchRecords int     `json:"batch_records"`
	WriteSeconds float64 `json:"workload_write_seconds"`
	WriteRate    float64 `json:"workload_records_per_s"`
	Replica      string  `json:"replica"`
	Verified     string  `json:"verified"`

	Pairs []pair `json:"pairs"`
	// The median pair's (by ratio) figures: the goal is on Ratio.
	Ratio                 float64 `json:"ratio"`
	SteadyRatio           float64 `json:"steady_ratio"`
	RawRecordsPerS        float64 `json:"raw_records_per_s"`
	TabletflowRecordsPerS float64 `json:"tabletflow_records_per_s"`
	// Reader is the adapter loop, run once after the pairs; ReaderRatio
	// its rate over the median of the raw passes'.
	Reader      *side   `json:"reader,omitempty"`
	ReaderRatio float64 `json:"reader_ratio,omitempty"`
	// WorkerPeakRSSMiB is the worker's peak resident set over the run.
	WorkerPeakRSSMiB float64 `json:"worker_peak_rss_mib"`

	GoalRatio float64 `json:"goal_ratio"`
	AimRatio  float64 `json:"aim_ratio"`
	MeetsGoal bool    `json:"meets_goal"`
	Verdict   string  `json:"verdict"`

	HostLoadAvg1mAtStart float64 `json:"host_load_avg_1m_at_start"`
}

// pair is one raw pass and one tabletflow pass, run back to back.
type pair struct {
	First       string  `json:"first"` // "raw" or "tabletflow"
	Raw         side    `json:"raw"`
	Tabletflow  side    `json:"tabletflow"`
	Ratio       float64 `json:"ratio"`
	SteadyRatio float64 `json:"steady_ratio"`
}

// side is one reader's pass over the whole backlog. Its CPU seconds are
// this program's ("bench"), the worker's and the dev server's, the
// vttablet's serving the VStream ("vttablet"), and the host's.
type side = pass.Figures

// newSide is a pass's figures, logged: records in took in batches, the
// first batch durable after first with firstCount records.
func newSide(name string, records uint64, took, first time.Duration, firstCount uint64, batches int, cpu map[string]float64) side {
	s := pass.New(records, took, first, firstCount, batches, cpu)
	publish.Logf("%s: %s", name, s)
	return s
}

func main() { procs.Main("vitess", run) }

func run() error {
	rn := procs.NewRun("vitess")
	records := flag.Int("records", 1_000_000, "row changes to write into the shard (about: whole transactions of 4 or 5 rows)")
	writers := flag.Int("writers", 4, "connections writing the backlog at once")
	batch := flag.Int("batch", 1000, "records per batch, for every reader (tabletflow's default)")
	pairs := flag.Int("pairs", 3, "pairs of a raw and a tabletflow pass")
	reader := flag.Bool("reader", true, "after the pairs, read the backlog once more with the adapter's Reader and the JSONL sink, no Temporal")
	cpuProfile := flag.String("cpu-profile", "", "write the worker's Go CPU profile over the first tabletflow pass to this file (the worker then serves metrics too)")
	trace := flag.String("trace", "", "write a Go execution trace of the worker over 2 s of the first tabletflow pass, from 1 s in, to this file (the worker then serves metrics too)")
	linger := flag.Duration("linger", -1, "the stream's batch.linger (negative: tabletflow's default, which the goal is measured with)")
	var workerArgs procs.StringList
	flag.Var(&workerArgs, "worker-arg", "an extra argument for the worker (repeatable), e.g. --worker-arg=--adaptive-gomaxprocs=false")
	flag.Parse()
	if *pairs < 1 || *records < 100 || *writers < 1 || *batch < 1 {
		return errors.New("--pairs, --writers and --batch must be at least 1, --records at least 100")
	}

	ctx, stop, bin, dir, err := rn.Start()
	if err != nil {
		return err
	}
	defer stop()
	b := &bench{procs: procs.Group{Bin: bin, Dir: dir}, batch: *batch, devServer: rn.DevServer(), cpuProfile: *cpuProfile,
		trace: *trace, workerArgs: workerArgs, linger: *linger}
	failed := true
	defer func() { rn.End(&b.procs, failed, b.close) }()

	res := result{Origin: publish.Now("go run ./bench/vitess"), BatchRecords: *batch, GoalRatio: goalRatio, AimRatio: aimRatio,
		HostLoadAvg1mAtStart: procstat.LoadAvg()}
	if err := b.start(ctx, rn); err != nil {
		return err
	}
	res.Replica = b.replica().Alias
	w, err := b.write(ctx, txsFor(*records, *writers), *writers)
	if err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	res.Records, res.Transactions, res.From, res.To = w.records, w.txs, w.from, w.to
	res.WriteSeconds, res.WriteRate = w.took.Seconds(), float64(w.records)/w.took.Seconds()
	publish.Logf("backlog: %d row changes in %d transactions (%s to %s) in %v (%.0f records/s); %s replayed them",
		w.records, w.txs, w.from, w.to, w.took.Round(time.Millisecond), res.WriteRate, res.Replica)
	if err := b.startWorker(ctx); err != nil {
		return err
	}

	ref := filepath.Join(dir, "raw-1")
	var lastTerm uint64
	for i := range *pairs {
		p := pair{First: "raw"}
		if i%2 == 1 {
			p.First = "tabletflow"
		}
		rawDir, flowDir := filepath.Join(dir, fmt.Sprintf("raw-%d", i+1)), filepath.Join(dir, fmt.Sprintf("flow-%d", i+1))
		rawSide := func() error {
			r, err := b.raw(ctx, rawDir, w)
			if err != nil {
				return fmt.Errorf("raw pass %d: %w", i+1, err)
			}
			p.Raw, lastTerm = r.side, r.lastTerm
			return nil
		}
		flowSide := func() error {
			if lastTerm == 0 {
				return errors.New("a raw pass must come first: it finds the backlog's last transaction")
			}
			f, err := b.flow(ctx, filepath.Base(flowDir), flowDir, w, lastTerm, i == 0)
			if err != nil {
				return fmt.Errorf("tabletflow pass %d: %w", i+1, err)
			}
			p.Tabletflow = f
			return nil
		}
		sides := []func() error{rawSide, flowSide}
		if p.First == "tabletflow" {
			sides = []func() error{flowSide, rawSide}
		}
		for _, s := range sides {
			if err := s(); err != nil {
				return err
			}
		}
		if err := b.checkPass(ref, rawDir, flowDir, w, &p); err != nil {
			return fmt.Errorf("pair %d: %w", i+1, err)
		}
		p.Ratio = p.Tabletflow.RecordsPerS / p.Raw.RecordsPerS
		p.SteadyRatio = p.Tabletflow.SteadyRecordsPerS / p.Raw.SteadyRecordsPerS
		publish.Logf("pair %d (%s first): tabletflow/raw %.3f (steady %.3f)", i+1, p.First, p.Ratio, p.SteadyRatio)
		res.Pairs = append(res.Pairs, p)
	}
	if *reader {
		readerDir := filepath.Join(dir, "reader")
		r, err := b.reader(ctx, readerDir, w, lastTerm)
		if err != nil {
			return fmt.Errorf("adapter loop: %w", err)
		}
		if err := b.checkOutput(ref, readerDir, w); err != nil {
			return err
		}
		res.Reader = &r
		raws := make([]float64, len(res.Pairs))
		for i, p := range res.Pairs {
			raws[i] = p.Raw.RecordsPerS
		}
		res.ReaderRatio = r.RecordsPerS / median(raws)
	}
	if _, res.WorkerPeakRSSMiB, err = testbed.Memory(b.worker.Pid()); err != nil {
		return fmt.Errorf("worker memory: %w", err)
	}
	if res.Verified, err = b.verifyReplay(ctx, filepath.Join(dir, "flow-1"), w); err != nil {
		return fmt.Errorf("verify: %w", err)
	}

	m := medianPair(res.Pairs)
	res.Ratio, res.SteadyRatio = m.Ratio, m.SteadyRatio
	res.RawRecordsPerS, res.TabletflowRecordsPerS = m.Raw.RecordsPerS, m.Tabletflow.RecordsPerS
	res.MeetsGoal = res.Ratio >= goalRatio
	verdict := "missed"
	if res.MeetsGoal {
		verdict = "met"
	}
	res.Verdict = fmt.Sprintf("goal tabletflow/raw >= %.2f %s (aim %.2f): %.2f, the median of %d pairs (%.0f against %.0f records/s end to end; steady %.2f)",
		goalRatio, verdict, aimRatio, res.Ratio, len(res.Pairs), res.TabletflowRecordsPerS, res.RawRecordsPerS, res.SteadyRatio)
	if res.Reader != nil {
		res.Verdict += fmt.Sprintf("; adapter loop without Temporal %.2f", res.ReaderRatio)
	}
	res.Setup = setupNotes(*writers, *batch, *pairs, *reader)
	res.Setup = append(res.Setup, "the dev server's extra arguments: "+strings.Join(b.devServer, " "))
	if *cpuProfile != "" || *trace != "" {
		res.Command += " (worker profiled over the first tabletflow pass: its figures carry the profiler's cost)"
	}
	publish.Logf("%s", res.Verdict)
	if err := publish.JSON(rn.Out(), res); err != nil {
		return err
	}
	failed = false
	return nil
}

// medianPair returns the pair of the median ratio (the lower middle one
// of an even count: never the flattering side).
func medianPair(pairs []pair) pair {
	sorted := slices.Clone(pairs)
	slices.SortFunc(sorted, func(a, b pair) int { return cmp.Compare(a.Ratio, b.Ratio) })
	return sorted[(len(sorted)-1)/2]
}

// median is the middle value (the lower middle one of an even count).
func median(v []float64) float64 {
	sorted := slices.Clone(v)
	slices.Sort(sorted)
	return sorted[(len(sorted)-1)/2]
}

// setupNotes say what was measured, for the result file.
func setupNotes(writers, batch, pairs int, reader bool) []string {
	notes := []string{
		"bed: testbed/vitessbed (etcd, vtctld, vtgate; keyspace commerce, shards -80 and 80-, each a primary in zone1 and a replica in each of zone2 and zone3, MariaDB with innodb_flush_log_at_trx_commit=0 and sync_binlog=0); every side reads shard -80 from its zone2 replica; the zone3 replica's replication is stopped before the backlog",
		fmt.Sprintf("backlog: written before any reading straight into the primary's MariaDB (vt_dba, vt_commerce) on %d connections, each transaction one multi-statement round trip: insert a customer and its order, update the previous customer's email, delete the order of two transactions back, every 8th also deletes the customer of five back; ids the hash vindex places in -80; then the zone2 replica replays it", writers),
		fmt.Sprintf("raw: one VStream on the replica's vttablet (queryservice, target commerce/-80/REPLICA, the adapter's table filter) from the backlog's start position, each row change encoded by the bench as the stream's JSONL line (position (GTID count, ordinal), key from the primary key columns, before/after as JSON), one write+fdatasync per batch of %d records or more (whole transactions); timed from opening the stream to the last fdatasync", batch),
		fmt.Sprintf("tabletflow: Temporal dev server (temporal server start-dev) and the worker binary, a StreamWorkflow of the keyspace (startFrom latest, selection REPLICA in zone2 only, batch %d records, the other settings default) into a JSONL directory whose -80 manifest was committed at the backlog's start beforehand (the checkpoint the tablet resumes from; 80- starts at its current position and reads nothing); timed from ExecuteWorkflow until -80's manifest holds the last transaction's checkpoint, polled every 20 ms; then stopped (the stop signal) and waited for", batch),
		fmt.Sprintf("order: %d pairs, the raw pass first in the odd ones, tabletflow first in the even ones; before each pass the program hands back its freed memory, syncs and drops the page cache of the earlier passes' outputs; the goal is on the median pair's ratio", pairs),
		"verified: every output holds the first raw pass's lines byte for byte (the stream name aside) and the backlog's count; the sinks' digests find no position twice; replaying the first tabletflow pass's records gives -80's tables as its primary holds them",
	}
	if reader {
		notes = append(notes, fmt.Sprintf("reader: once after the pairs, the adapter's vitess.Reader on the same replica and the JSONL sink in one loop, GetChanges(maxRecords %d) -> Write -> Commit -> Ack, as the GetChanges activity does, without Temporal; its ratio is over the median raw pass", batch))
	}
	return notes
}

// bench is the run's world: the bed, the dev server, the worker, clients.
type bench struct {
	procs      procs.Group
	batch      int
	devServer  []string // the dev server's extra arguments
	cpuProfile string
	trace      string
	workerArgs []string
	linger     time.Duration // the stream's batch.linger; negative: the default

	bed      *vitessbed.Cluster
	server   *testbed.DevServer
	temporal client.Client
	worker   *procs.Proc
	metrics  string // the worker's metrics address when profiled
}

// replica is the vttablet every side reads.
func (b *bench) replica() *vitessbed.Tablet {
	for _, t := range b.bed.Replicas(shardID) {
		if t.Cell == readCell {
			return t
		}
	}
	return nil
}

// start runs the bed and the dev server side by side, connects to the
// dev server, and stops the shard's other replica's replication.
func (b *bench) start(ctx context.Context, rn *procs.Run) error {
	began := time.Now()
	var err error
	b.server, b.temporal, err = b.procs.StartDevServer(b.devServer, func() (err error) {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		b.bed, err = vitessbed.Start(sctx, vitessbed.Options{})
		if b.bed != nil {
			rn.Bed(b.bed.Stop, b.bed.Tails)
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, t := range b.bed.Replicas(shardID) {
		if t.Cell == idleCell {
			if err := t.StopReplication(ctx); err != nil {
				return err
			}
		}
	}
	if b.replica() == nil {
		return fmt.Errorf("no replica of %s in %s", shardID, readCell)
	}
	publish.Logf("bed and dev server up in %v", time.Since(began).Round(time.Second))
	return nil
}

// startWorker runs the worker binary and waits until it polls the task
// queue.
func (b *bench) startWorker(ctx context.Context) error {
	var args []string
	if b.cpuProfile != "" || b.trace != "" {
		addr, err := testbed.FreeAddr()
		if err != nil {
			return err
		}
		args = append(args, "--metrics-addr", addr)
		b.metrics = addr
	}
	args = append(args, b.workerArgs...)
	var err error
	b.worker, err = b.procs.StartWorker(ctx, b.temporal, b.server.Addr, taskQueue, nil, args...)
	return err
}

// close closes the client (the run stops the children and the bed).
func (b *bench) close() {
	if b.temporal != nil {
		b.temporal.Close()
	}
}

// cpu is the CPU time used so far, in seconds: by each child process, by
// this program ("bench"), by the vttablet read ("vttablet") and by the
// host ("host_busy": all cores, steal included).
func (b *bench) cpu() procstat.Snapshot {
	return b.procs.Usage("vttablet", b.replica().Pid())
}

// flushDirty readies the machine for a pass: this program's freed memory
// handed back, everything written so far on its way to the disk, and the
// page cache of the earlier passes' outputs dropped, so that no pass pays
// for the one before.
func (b *bench) flushDirty() {
	debug.FreeOSMemory()
	unix.Sync()
	for _, pattern := range []string{"raw-*", "flow-*", "reader"} {
		dirs, _ := filepath.Glob(filepath.Join(b.procs.Dir, pattern))
		for _, d := range dirs {
			entries, _ := os.ReadDir(d)
			for _, e := range entries {
				if f, err := os.Open(filepath.Join(d, e.Name())); err == nil {
					_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
					f.Close()
				}
			}
		}
	}
}
