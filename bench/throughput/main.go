// Command throughput measures tabletflow end to end against a raw loop, in
// one run, over the same tabletd data, and writes a JSON result.
//
// Each tablet count of --tablets (16 and 64 by default) is a case in a world
// of its own: it starts, in a temporary directory, a Temporal dev server
// and a tabletd (that many tablets × 3 replicas, no workload, no follower
// lag), preloads it with --records records (at least --records-per-tablet
// a tablet: 2.4M at 16 tablets, 4.8M at 64) through the admin Workload RPC,
// starts a worker, then reads the whole backlog in --pairs pairs (3 by
// default) of these two, each from a source-side stream of its own, odd
// pairs but the last with tabletflow first:
//
//   - raw: one goroutine per tablet reads the PRIMARY replica
//     (GetChanges, 1000 records, no wait) → JSONL sink write → commit →
//     ack, until the tablet is caught up. This is the floor: the same source
//     client and sink tabletflow uses, with no Temporal in the way.
//   - tabletflow: a StreamWorkflow with the same batch size, reading the
//     same replica type into its own JSONL directory, timed from
//     ExecuteWorkflow until tabletd says every tablet's acked checkpoint is
//     its last position.
//
// Every sink is checked against tabletd's digest of its stream (count,
// additive hash, no duplicates), a pair's two once both sides have read,
// so that the sides run back to back. The machine's speed drifts from one
// minute to the next (each pair's cpu_seconds_raw and
// cpu_seconds_tabletflow show by how much), so the goal is judged on the
// median pair; every pair is in the result. Each side starts with
// nothing unwritten on the machine (flushDirty). In the first case only,
// the last pair's stream goes on: the workload runs at a moderate rate
// for --measure-events while the stream keeps up, and the events the
// parent and one tablet workflow add to their histories in that window are
// extrapolated to an hour. Last, the worker's peak and current RSS.
//
// To say why the ratio is what it is, the result also carries the start-up
// timeline (first ack, every tablet acking, first tablet done; from the
// tablets' histories: the first SelectReplica and the first GetChanges
// start), the gaps between GetChanges runs and the records per batch
// while streaming, and the CPU seconds each process and the host used in
// each phase (the host may be shared: see host_busy against 2 × wall).
//
// It is a program, not a testing.B, so that `go test`'s timeout cannot cut
// it and so that it can run the real binaries.
//
//	go run ./bench/throughput --bin ./bin --out bench/results/throughput.json
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabletflow/tabletflow/bench/internal/procs"
	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/promscrape"
	"github.com/tabletflow/tabletflow/workflows"
)

const (
	keyspace   = "commerce"
	taskQueue  = "bench"
	holdStream = "hold" // never read: holds the history for every reader
	goalRatio  = 0.9
	// goalLiveCPU and goalLagP99S: issue 11's group-commit goals.
	goalLiveCPU = 3.0
	goalLagP99S = 1.0
	batchSize   = 1000
	// scrapeEvery: how often the tabletflow side's progress loop reads the
	// worker's /metrics (a page that grows with the tablets, which the
	// worker spends CPU to render and this program to parse) while it
	// looks for the steady state's start. The raw loop counts its records
	// in memory; this observer runs on the same two cores as the side it
	// watches, and at the progress loop's 10 a second it would cost
	// tabletflow's side what the raw side never pays (each pair's
	// cpu_seconds_tabletflow, "worker" and "bench", shows what it costs).
	scrapeEvery = 500 * time.Millisecond
)

type result struct {
	Date     string `json:"date"`
	Tablets  int    `json:"tablets"`
	Records  uint64 `json:"records"`
	Verified bool   `json:"verified"`

	// pair: the median pair by ratio (the lower middle one of an even
	// count); Pairs: every pair in the order run.
	pair
	Pairs []pair `json:"pairs"`
	// RatioMin and RatioMax: the pairs' smallest and largest ratio.
	RatioMin  float64 `json:"ratio_min"`
	RatioMax  float64 `json:"ratio_max"`
	GoalRatio float64 `json:"goal_ratio"`
	MeetsGoal bool    `json:"meets_goal"`

	MeasureWindowS                float64 `json:"history_measure_window_s"`
	MeasureRate                   float64 `json:"history_measure_records_per_s"`
	HistoryEventsPerTabletPerHour float64 `json:"history_events_per_tablet_per_hour"`
	HistoryEventsParentPerHour    float64 `json:"history_events_parent_per_hour"`
	// From every tablet's history, from ExecuteWorkflow: when its workflow
	// started and its first GetChanges was scheduled and started. In the
	// measurement window: the gap between one GetChanges run's end and the
	// next one's start, split into the workflow deciding (end → next
	// scheduled) and dispatch (scheduled → started); workflow tasks'
	// schedule-to-start; and the records per batch.
	TabletStartedS          spread  `json:"tablet_workflow_started_s"`
	TabletFirstScheduledS   spread  `json:"tablet_first_getchanges_scheduled_s"`
	TabletFirstRunS         spread  `json:"tablet_first_getchanges_started_s"`
	TabletGapBetweenRunsS   spread  `json:"tablet_gap_between_runs_s"`
	TabletGapDecideS        spread  `json:"tablet_gap_decide_s"`
	TabletGapDispatchS      spread  `json:"tablet_gap_dispatch_s"`
	TabletWorkflowTaskWaitS spread  `json:"tablet_workflow_task_schedule_to_start_s"`
	SteadyBatchRecords      float64 `json:"history_window_records_per_batch"`
	// CPU seconds each process (and the whole host: busy, iowait) used
	// during the raw loop, the tabletflow run and the history measurement:
	// is it CPU-bound, and where does the CPU go. "bench" is this program.
	CPUMeasure map[string]float64 `json:"cpu_seconds_history_window"`
	// The group commit (issue 11): the worker's CPU per 1000 records and
	// its commits, acknowledgements and fsyncs live at MeasureRate (the
	// history window); the goal is live ≤ 3 × bulk CPU per record, the
	// bulk figure being the median of the pairs' (BulkCPUPer1kMedian),
	// with the commit-to-sink lag p99 ≤ 1 s.
	Live                 commits `json:"live"`
	BulkCPUPer1kMedian   float64 `json:"bulk_worker_cpu_s_per_1k_records_median"`
	LiveCPUPer1kOverBulk float64 `json:"live_cpu_per_1k_over_bulk"`
	MeetsLiveGoal        bool    `json:"meets_live_goal"`
	// Idle: the same stream caught up with the workload paused, over
	// --idle (no goal: what idle tablets cost, one read each per
	// batch.maxWait). IdleCorePerTablet: the worker's CPU seconds per
	// second per tablet.
	Idle              commits `json:"idle"`
	IdleCorePerTablet float64 `json:"idle_worker_core_per_tablet"`

	WorkerPeakRSSMiB     float64 `json:"worker_peak_rss_mib"`
	WorkerRSSMiB         float64 `json:"worker_rss_mib"`
	HostLoadAvg1mAtStart float64 `json:"host_load_avg_1m_at_start"`
	Command              string  `json:"command"`
	// DevServerArgs: the dev server's extra arguments (its SQLite settings).
	DevServerArgs []string `json:"dev_server_args"`
	// Cases: the other tablet counts' measurements (bulk only), each in
	// this shape.
	Cases []result `json:"cases,omitempty"`
}

// pair is one raw loop and one tabletflow run over the same backlog, each
// from a source-side stream of its own, one right after the other.
type pair struct {
	// FlowFirst: tabletflow read first (odd pairs but the last).
	FlowFirst             bool    `json:"tabletflow_first"`
	RawRecordsPerS        float64 `json:"raw_records_per_s"`
	RawSeconds            float64 `json:"raw_seconds"`
	TabletflowRecordsPerS float64 `json:"tabletflow_records_per_s"`
	TabletflowSeconds     float64 `json:"tabletflow_seconds"`
	// TabletflowFirstAckS: from ExecuteWorkflow to the first checkpoint
	// acked to tabletd (workflow, children, picker, first batch).
	TabletflowFirstAckS float64 `json:"tabletflow_first_ack_s"`
	// TabletflowAllStartedS: until every tablet had acked a batch;
	// TabletflowFirstDoneS: until the first tablet was acked to its end.
	TabletflowAllStartedS float64 `json:"tabletflow_all_tablets_acking_s"`
	TabletflowFirstDoneS  float64 `json:"tabletflow_first_tablet_done_s"`
	// Ratio is tabletflow / raw, end to end.
	Ratio                       float64 `json:"ratio"`
	TabletflowSteadyRecordsPerS float64 `json:"tabletflow_steady_records_per_s"`
	SteadyRatio                 float64 `json:"steady_ratio"`
	// CPU seconds each process (and the whole host: busy, iowait) used
	// during the raw loop and the tabletflow run. "bench" is this program.
	CPURaw        map[string]float64 `json:"cpu_seconds_raw"`
	CPUTabletflow map[string]float64 `json:"cpu_seconds_tabletflow"`
	// Bulk: the worker's CPU per 1000 records, commits, acknowledgements
	// and syncs in the tabletflow run.
	Bulk commits `json:"bulk"`
	// The raw loop's syncs: its JSONL sink's rounds of syncfs and its
	// fdatasyncs (file by file, when the machine holds other unwritten
	// data), per second.
	RawSyncfsPerS float64 `json:"raw_syncfs_per_s"`
	RawFsyncsPerS float64 `json:"raw_fsyncs_per_s"`
}

// flushDirty writes back everything the machine holds unwritten (sync(2))
// before a side of a pair reads, and before the live window. The JSONL
// sink syncs with one syncfs a round only while the system holds little
// other unwritten data, and file by file otherwise
// (sink/jsonl/groupsync.go): what `go run` had just built, or an earlier
// case's leftovers, would put one side of a pair on per-file syncs (an
// fdatasync per file per commit) and not the other, and the pair would
// measure that rather than the sides (each pair's raw_fsyncs_per_s and
// raw_syncfs_per_s, and its bulk fsyncs_per_s and syncfs_per_s, say which
// syncs each side made). What a side writes itself (the dev server's
// database too) still counts.
//
// It then drops the page cache of the pairs' sinks (on disk now; the dev
// server's database keeps its cache): on a VM, page cache past a warm
// pool costs the writing process more system time, and the pool grows
// back only from pages freed moments before, so a pair's second side,
// writing on top of the first side's pages, would pay for the order the
// sides ran in (each pair's tabletflow_first and cpu_seconds_* show
// whether it still does). Dropped, the first side's pages are free and
// warm for the second.
//
// First of all it hands this program's freed memory back to the system:
// the raw loop's and the checks' gigabytes of garbage were otherwise
// handed back by the Go runtime's background scavenger while the next
// side read, and each of its madvise calls flushes the TLB of the other
// core too (an interrupt there, dear on a VM); each pair's
// cpu_seconds_tabletflow "bench" is what this program cost a side. The
// worker's garbage from a tabletflow side is still handed back by its own
// scavenger, while a raw loop right after it reads (the middle pair).
func (b *bench) flushDirty() {
	debug.FreeOSMemory()
	unix.Sync()
	for _, prefix := range []string{rawStreamPrefix, flowStreamPrefix} {
		sinks, _ := filepath.Glob(filepath.Join(b.procs.Dir, prefix+"*"))
		for _, sink := range sinks {
			dropPageCache(sink)
		}
	}
}

// dropPageCache drops the page cache of every file under dir (written
// back already: flushDirty syncs first).
func dropPageCache(dir string) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil // a file going away meanwhile is no matter
		}
		f, err := os.Open(path)
		if err != nil {
			return nil
		}
		defer f.Close()
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		return nil
	})
}

// medianPair returns the pair of the median ratio (the lower middle one
// of an even count: never the flattering side).
func medianPair(pairs []pair) pair {
	sorted := slices.Clone(pairs)
	slices.SortFunc(sorted, func(a, b pair) int { return cmp.Compare(a.Ratio, b.Ratio) })
	return sorted[(len(sorted)-1)/2]
}

// rawStreamOf and flowStreamOf name pair i's source-side streams (the
// tabletflow one is its StreamWorkflow's ID too).
func rawStreamOf(i int) string  { return fmt.Sprintf("%s%d", rawStreamPrefix, i+1) }
func flowStreamOf(i int) string { return fmt.Sprintf("%s%d", flowStreamPrefix, i+1) }

// The pairs' streams' names begin so; each side's sink is the directory
// of its stream's name (flushDirty finds them by it).
const rawStreamPrefix, flowStreamPrefix = "raw-", "flow-"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "throughput:", err)
		os.Exit(1)
	}
}

func run() error {
	binDir := flag.String("bin", "./bin", "directory holding temporal, tabletd and worker")
	tabletsFlag := flag.String("tablets", "16,64", "comma-separated tablet counts, one case each in a world of its own; the live measurement runs in the first")
	// 2.4M: a throughput figure needs a run several times longer than
	// tabletflow's start (each pair's raw_seconds and
	// tabletflow_all_tablets_acking_s measure the run and the start).
	records := flag.Uint64("records", 2_400_000, "records to preload (at least; the exact total comes from the digest)")
	// 75,000 a tablet: more tablets take longer to start, and with
	// --records alone the 64-tablet figure measured the start more than
	// the throughput (the 64-tablet case's raw_seconds and
	// tabletflow_all_tablets_acking_s measure the two).
	perTablet := flag.Uint64("records-per-tablet", 75_000, "at least this many records a tablet: a case preloads the larger of --records and tablets × this")
	// tabletd's highest rate: it writes as fast as it can, and the pause
	// at --records cuts the step it lands in, so the preload overshoots by
	// at most one status poll.
	preloadRate := flag.Float64("preload-rate", 10_000_000, "workload rate while preloading, records/s (the default: as fast as tabletd writes)")
	measure := flag.Duration("measure-events", 2*time.Minute, "how long to stream at --measure-rate while counting history events")
	measureRate := flag.Float64("measure-rate", 2000, "workload rate during the history measurement, records/s")
	out := flag.String("out", "", "write the result JSON here too")
	cpuProfile := flag.String("cpu-profile", "", "write the worker's Go CPU profile over the live window to this file (go tool pprof reads it)")
	idleProfile := flag.String("idle-cpu-profile", "", "write the worker's Go CPU profile over the idle window to this file")
	bulkProfile := flag.String("bulk-cpu-profile", "", "write the worker's Go CPU profile over the first 4 s of each case's bulk run to this file with the tablet count appended (.16, .64)")
	linger := flag.Duration("linger", 0, "the stream's batch.linger (the group commit's wait); 0: the config's default")
	maxWait := flag.Duration("max-wait", 0, "the stream's batch.maxWait (an idle tablet's long poll); 0: the config's default")
	heartbeat := flag.Duration("heartbeat-timeout", 0, "the stream's run.heartbeatTimeout (the SDK sends a heartbeat every 0.8 × this); 0: the config's default")
	devServer := procs.DevServerFlags()
	idle := flag.Duration("idle", 30*time.Second, "after the live window, how long to measure the worker with every tablet caught up and no records (0: not measured)")
	pairs := flag.Int("pairs", 3, "raw loop and tabletflow runs per case (odd pairs but the last run tabletflow first); the goal is judged on the median pair")
	keep := flag.Bool("keep", false, "keep the temporary directory (it is kept anyway when the run fails)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	bin, err := filepath.Abs(*binDir)
	if err != nil {
		return err
	}
	counts, err := procs.TabletCounts("tablets", *tabletsFlag)
	if err != nil {
		return err
	}
	if *pairs < 1 {
		return fmt.Errorf("--pairs: %d; at least 1", *pairs)
	}
	c := caseConfig{bin: bin, records: *records, perTablet: *perTablet, preloadRate: *preloadRate, measure: *measure, measureRate: *measureRate,
		cpuProfile: *cpuProfile, idleProfile: *idleProfile, bulkProfile: *bulkProfile, devServer: devServer(), linger: *linger, maxWait: *maxWait, heartbeat: *heartbeat, pairs: *pairs, idle: *idle, keep: *keep}
	// The first count's case is the top level of the result (with the live
	// measurement); the others follow in "cases".
	var res result
	for i, n := range counts {
		one, err := runCase(ctx, c, n, i == 0)
		if err != nil {
			return fmt.Errorf("%d tablets: %w", n, err)
		}
		one.Command = "go run ./bench/throughput " + strings.Join(os.Args[1:], " ")
		one.DevServerArgs = c.devServer
		if i == 0 {
			res = one
		} else {
			res.Cases = append(res.Cases, one)
		}
	}
	return publish.JSON(*out, res)
}

// caseConfig is what every case of a run shares.
type caseConfig struct {
	bin         string
	records     uint64
	perTablet   uint64 // a case preloads max(records, tablets × perTablet)
	preloadRate float64
	measure     time.Duration
	measureRate float64
	cpuProfile  string
	idleProfile string
	bulkProfile string
	devServer   []string
	linger      time.Duration
	maxWait     time.Duration
	heartbeat   time.Duration
	pairs       int
	idle        time.Duration // the idle window after the live one; 0: none
	keep        bool
}

// runCase measures one tablet count in a world of its own (dev server,
// tabletd, worker): the raw loop, tabletflow end to end, and with live
// the history cost and the live CPU window.
func runCase(ctx context.Context, c caseConfig, tablets int, live bool) (res result, err error) {
	dir, err := os.MkdirTemp("", "tabletflow-throughput-")
	if err != nil {
		return res, err
	}
	b := &bench{procs: procs.Group{Bin: c.bin, Dir: dir}, cpuProfile: c.cpuProfile, idleProfile: c.idleProfile, devServer: c.devServer, linger: c.linger, maxWait: c.maxWait, heartbeat: c.heartbeat}
	failed := true
	defer func() {
		b.procs.StopAll()
		if failed || c.keep {
			fmt.Fprintln(os.Stderr, "throughput: kept", dir)
			if failed {
				b.dumpLogs()
			}
			return
		}
		_ = os.RemoveAll(dir)
	}()

	res = result{Date: time.Now().UTC().Format(time.RFC3339), Tablets: tablets, GoalRatio: goalRatio,
		HostLoadAvg1mAtStart: procstat.LoadAvg()}
	if err := b.startTemporal(ctx); err != nil {
		return res, err
	}
	if err := b.startTabletd(ctx, tablets); err != nil {
		return res, err
	}
	defer b.close()

	// The source-side streams exist before anything is read: tabletd frees
	// history below every stream's barrier, so each reader's stream must
	// hold it while the others ack (the workflow's own EnsureStream finds
	// its stream: idempotent). "hold" never acks, so no history is freed
	// while any reader reads: freeing costs tabletd CPU, and only the
	// last reader would pay it.
	streams := []string{holdStream}
	for i := range c.pairs {
		streams = append(streams, rawStreamOf(i), flowStreamOf(i))
	}
	for _, s := range streams {
		if _, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: s, StartFrom: source.StartEarliest}); err != nil {
			return res, err
		}
	}
	total, err := b.preload(ctx, max(c.records, uint64(tablets)*c.perTablet), c.preloadRate)
	if err != nil {
		return res, err
	}
	res.Records = total
	// The worker runs through every pair (idle while the raw loop reads),
	// so that every raw loop shares the machine with the same processes.
	if err := b.startWorker(ctx); err != nil {
		return res, err
	}
	for i := range c.pairs {
		// Odd pairs read with tabletflow first: the machine's drift
		// favours neither side. Not the last pair: its stream stays on
		// (idle, polling) for the live window, and would slow a raw loop
		// after it.
		var p pair
		p.FlowFirst = i%2 == 1 && i < c.pairs-1
		for _, flowSide := range []bool{p.FlowFirst, !p.FlowFirst} {
			var err error
			if flowSide {
				err = b.flowPair(ctx, c, tablets, i, total, &p)
			} else {
				err = b.rawPair(ctx, i, total, &p)
			}
			if err != nil {
				return res, err
			}
		}
		if err := b.checkPair(ctx, i, c.pairs, total); err != nil {
			return res, err
		}
		p.Ratio = p.TabletflowRecordsPerS / p.RawRecordsPerS
		p.SteadyRatio = p.TabletflowSteadyRecordsPerS / p.RawRecordsPerS
		publish.Logf("pair %d of %d: tabletflow / raw = %.3f (steady state %.3f)", i+1, c.pairs, p.Ratio, p.SteadyRatio)
		res.Pairs = append(res.Pairs, p)
	}
	res.pair = medianPair(res.Pairs)
	ratios, bulkCPU := make([]float64, len(res.Pairs)), make([]float64, len(res.Pairs))
	for i, p := range res.Pairs {
		ratios[i], bulkCPU[i] = p.Ratio, p.Bulk.WorkerCPUPer1k
	}
	res.RatioMin, res.RatioMax = slices.Min(ratios), slices.Max(ratios)
	slices.Sort(bulkCPU)
	res.BulkCPUPer1kMedian = bulkCPU[(len(bulkCPU)-1)/2]
	res.MeetsGoal = res.Ratio >= goalRatio
	publish.Logf("tabletflow / raw: median %.3f of %d pairs (%.3f to %.3f)", res.Ratio, len(res.Pairs), res.RatioMin, res.RatioMax)
	res.Verified = true

	if !live {
		if res.WorkerRSSMiB, res.WorkerPeakRSSMiB, err = testbed.Memory(b.worker.Pid()); err != nil {
			return res, fmt.Errorf("worker memory: %w", err)
		}
		failed = false
		return res, nil
	}
	res.MeasureRate = c.measureRate
	if err := b.historyCost(ctx, c.measure, c.measureRate, &res); err != nil {
		return res, fmt.Errorf("history cost: %w", err)
	}
	res.LiveCPUPer1kOverBulk = res.Live.WorkerCPUPer1k / res.BulkCPUPer1kMedian
	res.MeetsLiveGoal = res.LiveCPUPer1kOverBulk <= goalLiveCPU && res.Live.CommitLagP99S >= 0 && res.Live.CommitLagP99S <= goalLagP99S
	publish.Logf("worker CPU per 1000 records: bulk %.4fs, live %.4fs (%.2f×, goal ≤ %v×); live commit lag p99 ≤ %.3fs (goal ≤ %vs); live commits %.1f/s, acks %.1f/s, fdatasyncs %.1f/s, syncfses %.1f/s",
		res.BulkCPUPer1kMedian, res.Live.WorkerCPUPer1k, res.LiveCPUPer1kOverBulk, goalLiveCPU,
		res.Live.CommitLagP99S, goalLagP99S, res.Live.CommitsPerS, res.Live.AcksPerS, res.Live.FsyncsPerS, res.Live.SyncfsPerS)
	if err := b.verify(ctx, b.flowID, filepath.Join(dir, b.flowID), 0); err != nil {
		return res, fmt.Errorf("after the history measurement: %w", err)
	}
	if c.idle > 0 {
		if res.Idle, err = b.idleCost(ctx, c.idle); err != nil {
			return res, fmt.Errorf("idle: %w", err)
		}
		res.IdleCorePerTablet = res.Idle.WorkerCPUS / res.Idle.Seconds / float64(tablets)
		publish.Logf("idle: %d tablets caught up for %.0fs: worker %.2f%% of a core (%.3f%% per tablet), %.1f reads committed/s",
			tablets, res.Idle.Seconds, 100*res.Idle.WorkerCPUS/res.Idle.Seconds, 100*res.IdleCorePerTablet, res.Idle.CommitsPerS)
	}

	if res.WorkerRSSMiB, res.WorkerPeakRSSMiB, err = testbed.Memory(b.worker.Pid()); err != nil {
		return res, fmt.Errorf("worker memory: %w", err)
	}

	failed = false
	return res, nil
}

// rawPair runs pair i's raw loop into a directory of its own (checkPair
// checks and removes it).
func (b *bench) rawPair(ctx context.Context, i int, total uint64, p *pair) error {
	stream := rawStreamOf(i)
	b.flushDirty()
	syncfs0, datasync0 := jsonl.Syncs()
	cpu0 := b.cpu()
	n, took, err := b.raw(ctx, stream, filepath.Join(b.procs.Dir, stream))
	p.CPURaw = b.cpu().Minus(cpu0)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	syncfs1, datasync1 := jsonl.Syncs()
	p.RawSyncfsPerS = float64(syncfs1-syncfs0) / took.Seconds()
	p.RawFsyncsPerS = float64(datasync1-datasync0) / took.Seconds()
	if n != total {
		return fmt.Errorf("raw: read %d records, tabletd wrote %d", n, total)
	}
	p.RawSeconds = took.Seconds()
	p.RawRecordsPerS = float64(total) / took.Seconds()
	publish.Logf("raw: %d records in %v: %.0f records/s (syncfses %.0f/s, fdatasyncs %.0f/s)", total, took.Round(time.Millisecond),
		p.RawRecordsPerS, p.RawSyncfsPerS, p.RawFsyncsPerS)
	return nil
}

// flowPair runs pair i's StreamWorkflow into a directory of its own. The
// last pair's stream goes on into the live window; the others are
// stopped at once, so that a raw loop after it does not share the
// machine with its idle reads (checkPair checks and removes the files).
func (b *bench) flowPair(ctx context.Context, c caseConfig, tablets, i int, total uint64, p *pair) error {
	stream := flowStreamOf(i)
	dir := filepath.Join(b.procs.Dir, stream)
	b.flushDirty()
	m0, err := promscrape.Get(b.metrics)
	if err != nil {
		return err
	}
	cpu0 := b.cpu()
	if c.bulkProfile != "" && i == 0 {
		// Over the bulk run's first seconds, while every tablet reads.
		path := fmt.Sprintf("%s.%d", c.bulkProfile, tablets)
		go func() {
			if err := b.profile(ctx, 4*time.Second, path); err != nil {
				publish.Logf("bulk profile: %v", err)
			}
		}()
	}
	fl, err := b.flow(ctx, stream, dir, total)
	p.CPUTabletflow = b.cpu().Minus(cpu0)
	if err != nil {
		return fmt.Errorf("tabletflow: %w", err)
	}
	m1, err := promscrape.Get(b.metrics)
	if err != nil {
		return err
	}
	p.Bulk = commitStats(m0, m1, p.CPUTabletflow["worker"])
	p.TabletflowSeconds = fl.wall.Seconds()
	p.TabletflowRecordsPerS = float64(total) / fl.wall.Seconds()
	p.TabletflowFirstAckS = fl.firstAck.Seconds()
	p.TabletflowAllStartedS = fl.allStarted.Seconds()
	p.TabletflowFirstDoneS = fl.firstDone.Seconds()
	p.TabletflowSteadyRecordsPerS = fl.steady
	publish.Logf("tabletflow: %d records in %v: %.0f records/s end to end (first ack after %v, all tablets after %v), %.0f records/s steady",
		total, fl.wall.Round(time.Millisecond), p.TabletflowRecordsPerS, fl.firstAck.Round(time.Millisecond),
		fl.allStarted.Round(time.Millisecond), fl.steady)
	publish.Logf("cpu seconds: tabletflow %v", p.CPUTabletflow)
	b.flowID = stream
	if i == c.pairs-1 {
		return nil
	}
	return b.stopStream(ctx, stream)
}

// checkPair checks pair i's two sinks against tabletd's digest once both
// sides have read, so that the check (it reads every record back) does
// not stand between them: the machine's speed drifts, and the closer in time
// the two sides run, the less of the drift their ratio carries. It then
// removes the files, but for the last pair's tabletflow ones, which the
// live window goes on writing.
func (b *bench) checkPair(ctx context.Context, i, pairs int, total uint64) error {
	streams := []string{rawStreamOf(i), flowStreamOf(i)}
	for _, stream := range streams {
		if err := b.verify(ctx, stream, filepath.Join(b.procs.Dir, stream), total); err != nil {
			return err
		}
	}
	if i == pairs-1 {
		streams = streams[:1]
	}
	for _, stream := range streams {
		if err := os.RemoveAll(filepath.Join(b.procs.Dir, stream)); err != nil {
			return err
		}
	}
	return nil
}

// stopStream stops a StreamWorkflow and waits until it has ended.
func (b *bench) stopStream(ctx context.Context, id string) error {
	if err := b.temporal.SignalWorkflow(ctx, id, "", workflows.CmdStop, json.RawMessage(`{}`)); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := b.temporal.GetWorkflow(wctx, id, "").Get(wctx, nil); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	return nil
}

// bench is the run's world: child processes and clients.
type bench struct {
	procs procs.Group

	temporalAddr string
	temporal     client.Client
	tdAddr       string
	conn         *grpc.ClientConn
	admin        sourcepb.AdminClient
	topo         sourcepb.TopologyClient
	src          *tabletd.Client
	worker       *procs.Proc
	metrics      string        // the worker's /metrics URL
	cpuProfile   string        // where to write the worker's live-window CPU profile; empty: none
	idleProfile  string        // where to write the worker's idle-window CPU profile; empty: none
	devServer    []string      // extra dev server arguments
	linger       time.Duration // the stream's batch.linger; 0: the default
	maxWait      time.Duration // the stream's batch.maxWait; 0: the default
	heartbeat    time.Duration // the stream's run.heartbeatTimeout; 0: the default
	flowStart    time.Time     // when the StreamWorkflow was started
	flowID       string        // the last StreamWorkflow started: the live window's stream
}

// startTemporal runs a Temporal dev server on free ports with the search
// attributes registered and waits until it answers. A port picked free can
// be taken before the server binds it (the server opens more ports of its
// own), so a server that exits at start is tried again on other ports.
func (b *bench) startTemporal(ctx context.Context) error {
	db := filepath.Join(b.procs.Dir, "t.db")
	for attempt := 1; ; attempt++ {
		port := freePort()
		b.temporalAddr = fmt.Sprintf("127.0.0.1:%d", port)
		args := []string{"server", "start-dev", "--ip", "127.0.0.1", "--port", strconv.Itoa(port),
			"--ui-port", strconv.Itoa(freePort()), "--http-port", strconv.Itoa(freePort()),
			"--metrics-port", strconv.Itoa(freePort()), "--db-filename", db, "--log-level", "warn"}
		for _, sa := range workflows.SearchAttributes {
			args = append(args, "--search-attribute", sa+"=Keyword")
		}
		p, err := b.procs.Start("temporal", append(args, b.devServer...)...)
		if err != nil {
			return err
		}
		err = procs.WaitFor(ctx, p, "Temporal dev server", 90*time.Second, func() error {
			c, err := client.Dial(client.Options{HostPort: b.temporalAddr, Logger: temporalclient.Quiet{}})
			if err != nil {
				return err
			}
			if _, err := c.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
				c.Close()
				return err
			}
			b.temporal = c
			return nil
		})
		if err == nil || !p.Exited() || attempt == 3 {
			return err
		}
		publish.Logf("%v; trying other ports", err)
		_ = os.Rename(p.Log(), fmt.Sprintf("%s.%d", p.Log(), attempt))
		_ = os.Remove(db)
	}
}

// startTabletd runs tabletd with no workload and no follower lag.
func (b *bench) startTabletd(ctx context.Context, tablets int) error {
	b.tdAddr = fmt.Sprintf("127.0.0.1:%d", freePort())
	p, err := b.procs.Start("tabletd", "serve", "--listen", b.tdAddr, "--tablets", strconv.Itoa(tablets), "--replicas", "3",
		"--rate", "0", "--lag", "0s", "--retention", "1h", "--log-level", "warn")
	if err != nil {
		return err
	}
	if b.conn, err = grpc.NewClient(b.tdAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return err
	}
	b.admin, b.topo = sourcepb.NewAdminClient(b.conn), sourcepb.NewTopologyClient(b.conn)
	if b.src, err = tabletd.Dial(b.tdAddr, keyspace, tabletd.Options{}); err != nil {
		return err
	}
	return procs.WaitFor(ctx, p, "tabletd", 30*time.Second, func() error {
		_, err := b.admin.Workload(ctx, &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STATUS})
		return err
	})
}

// startWorker runs a worker process on the bench task queue and waits until
// it polls both the workflow and the activity task queue, so its start-up
// is not timed.
func (b *bench) startWorker(ctx context.Context) error {
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	b.metrics = "http://" + metricsAddr + "/metrics"
	p, err := b.procs.Start("worker", "--address", b.temporalAddr, "--task-queue", taskQueue, "--log-level", "warn",
		"--metrics-addr", metricsAddr)
	if err != nil {
		return err
	}
	b.worker = p
	return procs.WaitFor(ctx, p, "worker", 60*time.Second, procs.Polling(ctx, b.temporal, taskQueue))
}

func (b *bench) close() {
	if b.temporal != nil {
		b.temporal.Close()
	}
	if b.src != nil {
		_ = b.src.Close()
	}
	if b.conn != nil {
		_ = b.conn.Close()
	}
}

func (b *bench) workload(ctx context.Context, action sourcepb.WorkloadRequest_Action, rate float64) (*sourcepb.WorkloadResponse, error) {
	w, err := b.admin.Workload(ctx, &sourcepb.WorkloadRequest{Action: action, Rate: rate})
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", action, err)
	}
	return w, nil
}

// preload writes at least n records at rate, pauses the workload, and
// returns the exact total from tabletd's digest.
func (b *bench) preload(ctx context.Context, n uint64, rate float64) (uint64, error) {
	began := time.Now()
	if _, err := b.workload(ctx, sourcepb.WorkloadRequest_RATE, rate); err != nil {
		return 0, err
	}
	if _, err := b.workload(ctx, sourcepb.WorkloadRequest_RESUME, 0); err != nil {
		return 0, err
	}
	for {
		w, err := b.workload(ctx, sourcepb.WorkloadRequest_STATUS, 0)
		if err != nil {
			return 0, err
		}
		if w.Records >= n {
			break
		}
		if err := procs.Sleep(ctx, 100*time.Millisecond); err != nil {
			return 0, err
		}
	}
	if _, err := b.workload(ctx, sourcepb.WorkloadRequest_PAUSE, 0); err != nil {
		return 0, err
	}
	// A step of the workload may still be writing: wait for the count to
	// stop moving.
	if _, err := b.quiesce(ctx); err != nil {
		return 0, err
	}
	d, err := b.admin.Digest(ctx, &sourcepb.DigestRequest{})
	if err != nil {
		return 0, fmt.Errorf("digest: %w", err)
	}
	publish.Logf("preload: %d records in %v (%.0f records/s)", d.Records, time.Since(began).Round(time.Millisecond),
		float64(d.Records)/time.Since(began).Seconds())
	return d.Records, nil
}

// quiesce waits until the workload's record count stops moving.
func (b *bench) quiesce(ctx context.Context) (uint64, error) {
	var prev uint64
	for i := 0; ; i++ {
		w, err := b.workload(ctx, sourcepb.WorkloadRequest_STATUS, 0)
		if err != nil {
			return 0, err
		}
		if i > 0 && w.Records == prev {
			return prev, nil
		}
		prev = w.Records
		if err := procs.Sleep(ctx, 200*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// raw reads every tablet's PRIMARY into a JSONL sink at dir, one goroutine
// per tablet, until each is caught up, and returns the records and the
// wall time.
func (b *bench) raw(ctx context.Context, stream, dir string) (uint64, time.Duration, error) {
	tablets, err := b.src.ListTablets(ctx)
	if err != nil {
		return 0, 0, err
	}
	snk, err := jsonl.New(dir, stream)
	if err != nil {
		return 0, 0, err
	}
	defer snk.Close()
	var (
		count atomic.Uint64
		wg    sync.WaitGroup
		errs  = make([]error, len(tablets))
	)
	primaries := make([]source.Replica, len(tablets))
	for i, t := range tablets {
		p := slices.IndexFunc(t.Replicas, func(r source.Replica) bool { return r.Type == source.TypePrimary })
		if p < 0 {
			return 0, 0, fmt.Errorf("tablet %s has no PRIMARY", t.ID)
		}
		primaries[i] = t.Replicas[p]
	}
	began := time.Now()
	for i, r := range primaries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = rawTablet(ctx, b.src, snk, stream, r, &count)
		}()
	}
	wg.Wait()
	took := time.Since(began)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	return count.Load(), took, nil
}

// rawTablet is the raw loop for one tablet: GetChanges → Write → Commit →
// Ack until an empty, caught-up batch.
func rawTablet(ctx context.Context, src *tabletd.Client, snk *jsonl.Sink, stream string, r source.Replica, count *atomic.Uint64) error {
	w, err := snk.Open(ctx, r.Tablet)
	if err != nil {
		return err
	}
	defer w.Close()
	rd, err := src.OpenReplica(ctx, r)
	if err != nil {
		return err
	}
	cp := w.Checkpoint()
	for {
		batch, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: r.Tablet, From: cp,
			MaxRecords: batchSize, MaxWait: 0})
		if err != nil {
			return err
		}
		if len(batch.Records) == 0 {
			if batch.CaughtUp {
				return nil
			}
			continue
		}
		if err := w.Write(ctx, batch.Records); err != nil {
			return err
		}
		if err := w.Commit(ctx, batch.Checkpoint); err != nil {
			return err
		}
		if err := rd.Ack(ctx, stream, r.Tablet, batch.Checkpoint); err != nil {
			return err
		}
		cp = batch.Checkpoint
		count.Add(uint64(len(batch.Records)))
	}
}

type flowResult struct {
	wall       time.Duration
	firstAck   time.Duration // the first tablet acked a batch
	allStarted time.Duration // every tablet has acked a batch
	firstDone  time.Duration // the first tablet is acked to its end
	steady     float64       // records/s from 5% committed to the sink to done
}

// flow starts the StreamWorkflow and times it until tabletd says every
// tablet's acked checkpoint is the tablet's last position.
func (b *bench) flow(ctx context.Context, id, dir string, total uint64) (flowResult, error) {
	var res flowResult
	last, err := b.lastPositions(ctx)
	if err != nil {
		return res, err
	}
	// batch.maxWait, run.duration, heartbeatTimeout and linger: the
	// defaults, what a user gets, unless --linger, --max-wait or
	// --heartbeat-timeout say otherwise.
	batch := map[string]any{"maxRecords": batchSize}
	if b.linger > 0 {
		batch["linger"] = b.linger.String()
	}
	if b.maxWait > 0 {
		batch["maxWait"] = b.maxWait.String()
	}
	stream := map[string]any{
		"source": map[string]any{"kind": "tabletd", "address": b.tdAddr, "keyspace": keyspace},
		"sink":   map[string]any{"kind": "jsonl", "path": dir},
		// The raw loop reads PRIMARY replicas; so does this (first choice).
		"selection": map[string]any{"tabletTypes": []string{"PRIMARY", "REPLICA", "RDONLY"}},
		"batch":     batch,
	}
	if b.heartbeat > 0 {
		stream["run"] = map[string]any{"heartbeatTimeout": b.heartbeat.String()}
	}
	cfg, err := json.Marshal(stream)
	if err != nil {
		return res, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	began := time.Now()
	b.flowStart = began
	run, err := b.temporal.ExecuteWorkflow(wctx, client.StartWorkflowOptions{ID: id, TaskQueue: taskQueue},
		"StreamWorkflow", json.RawMessage(cfg))
	if err != nil {
		return res, fmt.Errorf("start the stream: %w", err)
	}
	ended := make(chan error, 1)
	go func() { ended <- run.Get(wctx, nil) }()

	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var (
		at5      time.Duration
		written5 uint64
		logged   time.Time
		scraped  time.Time
		timeout  = time.After(15 * time.Minute)
	)
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-ended:
			return res, fmt.Errorf("the stream workflow ended before it caught up: %v", err)
		case <-timeout:
			return res, errors.New("not caught up within 15m")
		case <-tick.C:
		}
		p, err := b.progress(ctx, id, last)
		if err != nil {
			return res, err
		}
		now := time.Since(began)
		if p.acked > 0 && res.firstAck == 0 {
			res.firstAck = now
		}
		if len(p.started) == len(last) && res.allStarted == 0 {
			res.allStarted = now
		}
		if len(p.done) > 0 && res.firstDone == 0 {
			res.firstDone = now
		}
		if at5 == 0 && time.Since(scraped) >= scrapeEvery {
			// From the sink's side: acks trail the commits by up to the
			// worker's acknowledgement interval, seconds of a run of a few.
			scraped = time.Now()
			s, err := promscrape.Get(b.metrics)
			if err != nil {
				return res, err
			}
			if w := uint64(s.Sum("tabletflow_records_written_total", func(l map[string]string) bool { return l["stream"] == id })); w*20 >= total {
				at5, written5 = now, w
			}
		}
		if time.Since(logged) >= time.Second {
			logged = time.Now()
			publish.Logf("tabletflow: %v: %d of %d records acked, %d tablets acking, %d done",
				now.Round(100*time.Millisecond), p.acked, total, len(p.started), len(p.done))
		}
		if len(p.done) == len(last) {
			res.wall = now
			if res.wall > at5 {
				res.steady = float64(total-written5) / (res.wall - at5).Seconds()
			}
			return res, nil
		}
	}
}

// lastPositions returns each tablet's last position, from the topology.
func (b *bench) lastPositions(ctx context.Context) (map[string]source.Checkpoint, error) {
	resp, err := b.topo.ListTablets(ctx, &sourcepb.ListTabletsRequest{Keyspace: keyspace})
	if err != nil {
		return nil, fmt.Errorf("list tablets: %w", err)
	}
	out := map[string]source.Checkpoint{}
	for _, t := range resp.Tablets {
		cp, err := source.ParseCheckpoint(t.LastPosition)
		if err != nil {
			return nil, fmt.Errorf("tablet %s: %w", t.Id, err)
		}
		out[t.Id] = cp
	}
	return out, nil
}

// streamProgress is where the flow stream is, as tabletd sees it.
type streamProgress struct {
	acked   uint64          // records acked: acked index − start index, summed
	started map[string]bool // tablets with an ack
	done    map[string]bool // tablets acked up to their last position
}

// progress reads the flow stream's per-tablet acks from tabletd.
func (b *bench) progress(ctx context.Context, id string, last map[string]source.Checkpoint) (streamProgress, error) {
	p := streamProgress{started: map[string]bool{}, done: map[string]bool{}}
	s, err := b.topo.DescribeStream(ctx, &sourcepb.DescribeStreamRequest{Stream: id})
	if err != nil {
		return p, fmt.Errorf("describe stream %s: %w", id, err)
	}
	for _, t := range s.Tablets {
		start, err1 := source.ParseCheckpoint(t.Start)
		ack, err2 := source.ParseCheckpoint(t.Acked)
		if err := errors.Join(err1, err2); err != nil {
			return p, fmt.Errorf("tablet %s: %w", t.Tablet, err)
		}
		if ack.Compare(start) > 0 {
			p.acked += ack.Index - start.Index
			p.started[t.Tablet] = true
		}
		if l, ok := last[t.Tablet]; ok && (ack.Compare(l) >= 0 || l.Compare(start) <= 0) {
			p.done[t.Tablet] = true
		}
	}
	return p, nil
}

// verify checks that the JSONL directory holds exactly what tabletd says
// the stream is due: count and hash, no (tablet, position) twice. want, if
// not zero, is the record count the stream must be due.
func (b *bench) verify(ctx context.Context, stream, dir string, want uint64) error {
	due, err := b.admin.Digest(ctx, &sourcepb.DigestRequest{Stream: stream})
	if err != nil {
		return fmt.Errorf("digest of %s: %w", stream, err)
	}
	got, err := jsonl.DigestDir(dir)
	if err != nil {
		return fmt.Errorf("read sink of %s: %w", stream, err)
	}
	if want != 0 && due.Records != want {
		return fmt.Errorf("stream %s is due %d records, tabletd wrote %d", stream, due.Records, want)
	}
	if due.Records != got.Total.Records || due.Hash != got.Total.Hash || len(got.Duplicates) > 0 {
		return fmt.Errorf("stream %s: due %d records hash %s, sink has %d records hash %s, %d duplicated positions",
			stream, due.Records, digest.HashHex(due.Hash), got.Total.Records, digest.HashHex(got.Total.Hash), len(got.Duplicates))
	}
	publish.Logf("verify %s: %d records, hash %s, no duplicates", stream, got.Total.Records, digest.HashHex(got.Total.Hash))
	return nil
}
