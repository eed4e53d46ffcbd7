// Command pgsink measures the PostgreSQL sink against a raw COPY loop over
// the same records in one run, and against the JSONL sink, and writes a
// JSON result.
//
// It starts, in a temporary directory, a test bed of one PostgreSQL 18
// primary (pgbed, `make pg`), durable by default (fsync on, unlike the
// bed's tests, so that its commits cost what the JSONL sink's fsyncs do).
// It makes the records once (--records changes to orders over --tablets
// tablets: inserts, updates with whole before and after rows, deletes;
// about 200 bytes of JSON per row image) and stores all of them, one
// goroutine per tablet, in batches of --batch records, along three paths:
//
//   - raw: the floor, what a hand-written loader costs: a pgx connection
//     per tablet and per batch one transaction holding one COPY into a
//     table like the sink's change table (same columns, types, primary
//     key, values), no checks, no checkpoint.
//   - postgres: the sink in changelog mode (sink/postgres, schema
//     tabletflow) through the sink.Sink interface: per batch Write and
//     Commit, as the GetChanges activity calls them (a transaction: the
//     checkpoint's compare-and-set and the COPY).
//   - jsonl: the JSONL sink (sink/jsonl) through the same interface, into
//     a directory beside the database's, on the same disk.
//
// Each path runs once per round (--rounds, the order rotating so that
// none always goes first), on fresh tables, after a CHECKPOINT; the
// figures are the rounds' medians, and the goal (issue 10: the sink ≥ 0.8
// × raw) is on the median of the rounds' sink/raw ratios, each from two
// runs close in time. Then, with --apply, the sink in apply
// mode stores the records once (mirror tables: per record an upsert or a
// delete). Every run is checked: the tables' and the directory's digests
// (postgres.Digest, jsonl.DigestDir) equal the records' digest
// (package digest), the checkpoints are the tablets' last positions, the
// mirror table holds exactly the orders left, at their last revision.
//
// It is a program, not a testing.B, like the other benchmarks here.
//
//	go run ./bench/pgsink --out bench/results/pgsink.json
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

const (
	stream      = "bench"
	rawSchema   = "tfbench_raw"
	applySchema = "tfbench_apply"
	dsnEnv      = "TF_BENCH_SINK_DSN"
	goalRatio   = 0.8
	// pathTimeout bounds one path's run.
	pathTimeout = 3 * time.Minute
)

// The paths, by the name the result gives them.
const (
	pathRaw      = "raw"
	pathPostgres = "postgres"
	pathJSONL    = "jsonl"
	pathApply    = "postgres_apply"
)

type result struct {
	Date    string   `json:"date"`
	Command string   `json:"command"`
	Commit  string   `json:"commit"`
	Setup   []string `json:"setup"`

	Records      int            `json:"records"`
	Tablets      int            `json:"tablets"`
	BatchRecords int            `json:"batch_records"`
	Ops          map[string]int `json:"ops"`
	// JSONBytesPerRecord: key, before and after together, on average.
	JSONBytesPerRecord float64 `json:"json_bytes_per_record"`
	Durable            bool    `json:"durable"`
	// FsyncMs: a 4 KiB write and fsync of a file in the run's directory,
	// the median of 200, in milliseconds: what a commit's fsync costs on
	// this disk.
	FsyncMs  float64 `json:"disk_fsync_ms"`
	Rounds   int     `json:"rounds"`
	Verified string  `json:"verified"`

	// Runs: each path's rounds, in the order they ran.
	Runs map[string][]pathResult `json:"runs"`
	// Median records/s of each path over the rounds (apply mode: its one
	// run).
	Median map[string]float64 `json:"median_records_per_s"`

	// RoundRatios are the PostgreSQL sink's records/s over the raw loop's
	// in each round, the two run close together; Ratio, their median, is
	// what the goal is on: a paired comparison, so the host's speed
	// drifting during the run (other guests' steal) weighs less.
	// RatioOfMedians is the same from the paths' medians.
	Ratio          float64   `json:"ratio"`
	RoundRatios    []float64 `json:"round_ratios"`
	RatioOfMedians float64   `json:"ratio_of_medians"`
	JSONLRatio     float64   `json:"postgres_vs_jsonl"`
	ApplyRatio     float64   `json:"apply_vs_raw,omitempty"`
	GoalRatio      float64   `json:"goal_ratio"`
	MeetsGoal      bool      `json:"meets_goal"`
	Verdict        string    `json:"verdict"`
	DurationS      float64   `json:"duration_s"`
	HostLoadAvg1m  float64   `json:"host_load_avg_1m_at_start"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgsink:", err)
		os.Exit(1)
	}
}

func run() error {
	records := flag.Int("records", 300_000, "records to store, over all tablets")
	tablets := flag.Int("tablets", 4, "tablets, each written by its own goroutine (the sink's pool has max(4, cores) connections)")
	batch := flag.Int("batch", 1000, "records per batch and commit, for every path (tabletflow's default)")
	rounds := flag.Int("rounds", 5, "runs of each path; the figures are the medians")
	apply := flag.Bool("apply", true, "also store the records once with the sink in apply mode")
	durable := flag.Bool("durable", true, "run PostgreSQL with fsync and full_page_writes on (the bed's tests turn them off)")
	out := flag.String("out", "", "write the result JSON here too")
	keep := flag.Bool("keep", false, "keep the temporary directory (it is kept anyway when the run fails)")
	flag.Parse()
	if *records < *tablets || *tablets < 1 || *batch < 1 || *rounds < 1 {
		return fmt.Errorf("want records ≥ tablets ≥ 1, batch ≥ 1, rounds ≥ 1")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	began := time.Now()
	dir, err := os.MkdirTemp("", "tabletflow-pgsink-")
	if err != nil {
		return err
	}
	b := &bench{dir: dir, batch: *batch}
	failed := true
	defer func() {
		b.close()
		if failed || *keep {
			fmt.Fprintln(os.Stderr, "pgsink: kept", dir)
			if failed && b.bed != nil {
				n := b.bed.Shards[0].Primary
				fmt.Fprintf(os.Stderr, "--- %s (%s) ---\n%s\n", n.Name, n.LogPath(), n.Tail())
			}
			return
		}
		_ = os.RemoveAll(dir)
	}()

	res := result{Date: time.Now().UTC().Format(time.RFC3339), BatchRecords: *batch, GoalRatio: goalRatio,
		Durable: *durable, Rounds: *rounds, Tablets: *tablets, HostLoadAvg1m: procstat.LoadAvg(), Commit: publish.GitCommit(),
		Command: "go run ./bench/pgsink " + strings.Join(os.Args[1:], " "), Runs: map[string][]pathResult{}}
	if res.FsyncMs, err = probeFsync(dir); err != nil {
		return err
	}
	if err := b.start(ctx, *durable); err != nil {
		return err
	}
	t0 := time.Now()
	b.w = newWorkload(*records, *tablets)
	res.Records, res.JSONBytesPerRecord = b.w.records, float64(b.w.jsonBytes)/float64(b.w.records)
	res.Ops = map[string]int{}
	for op, n := range b.w.ops {
		res.Ops[string(op)] = n
	}
	publish.Logf("disk: a 4 KiB write + fsync takes %.3f ms", res.FsyncMs)
	publish.Logf("records: %d over %d tablets (%v), %.0f bytes of JSON each on average, %d orders left; made in %v",
		b.w.records, *tablets, res.Ops, res.JSONBytesPerRecord, len(b.w.live), time.Since(t0).Round(time.Millisecond))

	paths := []string{pathRaw, pathPostgres, pathJSONL}
	for round := range *rounds {
		order := append(slices.Clone(paths[round%len(paths):]), paths[:round%len(paths)]...)
		for _, p := range order {
			r, err := b.runPath(ctx, p, round)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, p, err)
			}
			res.Runs[p] = append(res.Runs[p], r)
			publish.Logf("round %d, %s: %s", round+1, p, r)
		}
		res.RoundRatios = append(res.RoundRatios, res.Runs[pathPostgres][round].RecordsPerS/res.Runs[pathRaw][round].RecordsPerS)
	}
	if *apply {
		r, err := b.runPath(ctx, pathApply, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", pathApply, err)
		}
		res.Runs[pathApply] = []pathResult{r}
		publish.Logf("%s: %s", pathApply, r)
	}

	res.Median = map[string]float64{}
	for p, runs := range res.Runs {
		res.Median[p] = median(runs)
	}
	res.Ratio = medianOf(res.RoundRatios)
	res.RatioOfMedians = res.Median[pathPostgres] / res.Median[pathRaw]
	res.JSONLRatio = res.Median[pathPostgres] / res.Median[pathJSONL]
	if *apply {
		res.ApplyRatio = res.Median[pathApply] / res.Median[pathRaw]
	}
	res.MeetsGoal = res.Ratio >= goalRatio
	verdict := "missed"
	if res.MeetsGoal {
		verdict = "met"
	}
	perRound := make([]string, len(res.RoundRatios))
	for i, r := range res.RoundRatios {
		perRound[i] = fmt.Sprintf("%.2f", r)
	}
	res.Verdict = fmt.Sprintf("goal postgres sink/raw COPY >= %.2f %s: %s (median of %d rounds' ratios: %s; medians %.0f against %.0f records/s, %s); "+
		"postgres sink/jsonl sink %.2f (%.0f records/s)",
		goalRatio, verdict, ratioString(res.Ratio), *rounds, strings.Join(perRound, " "),
		res.Median[pathPostgres], res.Median[pathRaw], ratioString(res.RatioOfMedians), res.JSONLRatio, res.Median[pathJSONL])
	if *apply {
		res.Verdict += fmt.Sprintf("; apply mode %.0f records/s, %.2f of raw", res.Median[pathApply], res.ApplyRatio)
	}
	res.Verified = fmt.Sprintf("every run: %d records stored, their digest equal to the records' (postgres.Digest of the tables, "+
		"jsonl.DigestDir of the directory: no position twice); the sink's checkpoints at each tablet's last position%s",
		b.w.records, applyVerified(*apply, len(b.w.live)))
	res.Setup = setupNotes(*durable, *tablets, *batch)
	res.DurationS = time.Since(began).Round(time.Millisecond).Seconds()
	publish.Logf("%s", res.Verdict)

	if err := publish.JSON(*out, res); err != nil {
		return err
	}
	failed = false
	return nil
}

func applyVerified(apply bool, live int) string {
	if !apply {
		return ""
	}
	return fmt.Sprintf("; apply mode's mirror table holds exactly the %d orders left, each at its last revision", live)
}

// setupNotes say what was measured, for the result file.
func setupNotes(durable bool, tablets, batch int) []string {
	bed := "bed: pgbed, 1 PostgreSQL 18 primary on loopback, shared_buffers 128MB, synchronous_commit on"
	if durable {
		bed += ", fsync and full_page_writes on (each commit waits for its WAL fsync)"
	} else {
		bed += ", fsync and full_page_writes off (the bed's test settings: commits wait for no fsync)"
	}
	return []string{
		bed + "; the JSONL sink's directory on the same disk",
		fmt.Sprintf("records: made once, stored by every path; %d tablets, one goroutine each, batches of %d records, one commit per batch", tablets, batch),
		"raw: a pgx connection per tablet (made before timing), per batch BEGIN, one COPY into tfbench_raw.changes (the sink's change table's columns, types and primary key; the values as the sink passes them), COMMIT",
		"postgres: postgres.New (changelog mode, schema tabletflow; made before timing), a writer per tablet (opened before timing), per batch Write then Commit at the batch's last position: one transaction with the checkpoint's compare-and-set UPDATE and the COPY",
		"jsonl: jsonl.New in a fresh directory, a writer per tablet (opened before timing), per batch Write then Commit (data fsync, manifest temp file fsync, rename, directory fsync)",
		"postgres_apply: as postgres, in apply mode (schema tfbench_apply, mirror table orders: per record an INSERT ... ON CONFLICT DO UPDATE or a DELETE, pipelined in the batch's transaction); one run; the first tablet commits its first batch (making the mirror table, in a transaction of its own before the batch's) before the others start, inside the timed span, as in the runs before 194c092, when tablets racing to make the table failed their commits (the sink now takes a race's duplicate-object errors as the table being there, and reads the primary key of a table it did not make itself: sink/postgres TestApplyModeInstancesRacingToMakeTablesAllCommit, TestApplyModeSharesMirrorTablesAcrossInstancesAndTablets), so the figure stays comparable with theirs",
		"disk_fsync_ms: the median of 200 writes of 4 KiB each followed by an fsync, in the run's directory before the bed starts: what a commit's fsync costs on this disk, for PostgreSQL's WAL and the JSONL sink alike",
		"timed: from the first batch to the last commit of every tablet; each path on fresh tables (schemas dropped and made again) after a CHECKPOINT; the order of the paths rotates each round",
	}
}

// bench is the run's world: the bed and a superuser connection to it.
type bench struct {
	dir   string
	batch int
	w     *workload

	bed   *pgbed.Cluster
	admin *pgx.Conn
}

func (b *bench) primary() *pgbed.Node { return b.bed.Shards[0].Primary }

// start runs the bed and connects to it as the superuser.
func (b *bench) start(ctx context.Context, durable bool) error {
	settings := map[string]string{"shared_buffers": "128MB"}
	if durable {
		settings["fsync"], settings["full_page_writes"] = "on", "on"
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var err error
	b.bed, err = pgbed.Start(sctx, pgbed.Options{Dir: filepath.Join(b.dir, "pg"), Shards: 1, Settings: settings})
	if err != nil {
		return err
	}
	if b.admin, err = b.primary().Connect(ctx); err != nil {
		return err
	}
	publish.Logf("bed up: %s", b.primary().LogPath())
	return nil
}

func (b *bench) close() {
	if b.admin != nil {
		_ = b.admin.Close(context.Background())
	}
	if b.bed != nil {
		if err := b.bed.Close(); err != nil {
			publish.Logf("close the bed: %v", err)
		}
	}
}

// runPath runs one path over the workload on fresh storage, and checks
// what it stored.
func (b *bench) runPath(ctx context.Context, path string, round int) (pathResult, error) {
	cfg := postgres.Config{Kind: "postgres", DSNEnv: dsnEnv, Mode: "changelog", Schema: postgres.DefaultSchema}
	if path == pathApply {
		cfg.Mode, cfg.Schema = "apply", applySchema
	}
	if err := b.reset(ctx, path, cfg.Schema); err != nil {
		return pathResult{}, err
	}
	switch path {
	case pathRaw:
		return b.runRaw(ctx)
	case pathJSONL:
		return b.runJSONL(ctx, filepath.Join(b.dir, fmt.Sprintf("jsonl-%d", round+1)))
	default:
		return b.runSink(ctx, cfg)
	}
}

// runRaw runs the raw COPY loop.
func (b *bench) runRaw(ctx context.Context) (pathResult, error) {
	table := pgx.Identifier{rawSchema, "changes"}
	r, err := b.drive(ctx, false, func(ctx context.Context, _ string) (store, error) {
		conn, err := pgx.Connect(ctx, b.primary().DSN())
		if err != nil {
			return nil, err
		}
		return &rawStore{conn: conn, table: table, stream: stream}, nil
	})
	if err != nil {
		return r, err
	}
	return r, b.verifyChanges(ctx, rawSchema)
}

// runSink runs the PostgreSQL sink, in cfg's mode.
func (b *bench) runSink(ctx context.Context, cfg postgres.Config) (pathResult, error) {
	dsn := b.primary().DSN()
	s, err := postgres.New(ctx, cfg, stream, func(k string) string {
		if k == dsnEnv {
			return dsn
		}
		return ""
	})
	if err != nil {
		return pathResult{}, err
	}
	// Apply mode: the first batch makes the mirror table, one tablet
	// alone, as before 194c092, when tablets racing to make it failed
	// their commits (see the setup notes): racing works now, and one
	// tablet first keeps the figure comparable with the earlier runs'.
	r, err := b.drive(ctx, cfg.Mode == "apply", openWith(s))
	_ = s.Close()
	if err != nil {
		return r, err
	}
	if cfg.Mode == "apply" {
		err = b.verifyMirror(ctx, cfg.Schema)
	} else {
		err = b.verifyChanges(ctx, cfg.Schema)
	}
	if err != nil {
		return r, err
	}
	return r, b.verifyCheckpoints(ctx, cfg.Schema)
}

// runJSONL runs the JSONL sink into dir, removed once checked.
func (b *bench) runJSONL(ctx context.Context, dir string) (pathResult, error) {
	s, err := jsonl.New(dir, stream)
	if err != nil {
		return pathResult{}, err
	}
	r, err := b.drive(ctx, false, openWith(s))
	_ = s.Close()
	if err != nil {
		return r, err
	}
	if err := b.verifyJSONL(dir); err != nil {
		return r, err
	}
	return r, os.RemoveAll(dir)
}

// openWith opens a tablet's store on a sink.
func openWith(s sink.Sink) func(ctx context.Context, tablet string) (store, error) {
	return func(ctx context.Context, tablet string) (store, error) {
		w, err := s.Open(ctx, tablet)
		if err != nil {
			return nil, err
		}
		return &sinkStore{w: w}, nil
	}
}

// reset drops what an earlier run of path stored (the raw loop's table is
// made again here, the sink makes its own), then checkpoints, so that
// each run starts from clean buffers and a fresh WAL segment.
func (b *bench) reset(ctx context.Context, path, schema string) error {
	var stmts []string
	switch path {
	case pathRaw:
		stmts = rawDDL(rawSchema)
	case pathPostgres, pathApply:
		stmts = []string{`DROP SCHEMA IF EXISTS ` + pgx.Identifier{schema}.Sanitize() + ` CASCADE`}
	}
	for _, q := range append(stmts, "CHECKPOINT") {
		if _, err := b.admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("reset: %s: %w", strings.Fields(q)[0], err)
		}
	}
	if path == pathRaw {
		// The raw loop connects as the sink does: the table is the role's.
		_, err := b.admin.Exec(ctx, `ALTER SCHEMA `+rawSchema+` OWNER TO `+pgbed.User+`;
			ALTER TABLE `+rawSchema+`.changes OWNER TO `+pgbed.User)
		return err
	}
	return nil
}

// probeFsync times 200 writes of 4 KiB, each followed by an fsync, to a
// file in dir, and returns the median in milliseconds.
func probeFsync(dir string) (float64, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	took := make([]float64, 200)
	for i := range took {
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			return 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, err
		}
		took[i] = time.Since(t0).Seconds() * 1000
	}
	slices.Sort(took)
	return math.Round(took[len(took)/2]*1000) / 1000, nil
}

// median is the middle run's records/s.
func median(runs []pathResult) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = r.RecordsPerS
	}
	return medianOf(v)
}

// medianOf is the middle value (the mean of the middle two for an even
// count).
func medianOf(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// ratioString prints a ratio to two decimals, or three when two would
// round it up to the goal it misses.
func ratioString(r float64) string {
	if r < goalRatio && fmt.Sprintf("%.2f", r) == fmt.Sprintf("%.2f", goalRatio) {
		return fmt.Sprintf("%.3f", r)
	}
	return fmt.Sprintf("%.2f", r)
}
