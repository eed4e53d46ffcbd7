package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// row is one goal in the summary table.
type row struct {
	ID       string  // a short stable name, e.g. "exclude-64", for tests and tools
	Area     string  // the group of goals, e.g. "Re-routing"
	Measure  string  // what is measured
	Goal     string  // the bound, in words
	Measured string  // the measured figure, or why there is none
	Verdict  verdict // met, not met or not measured
	Source   string  // the result file the figure came from
}

// The bounds of issue 11's goals (and of the other benchmarks' goals),
// written here rather than read from the result files: a benchmark that
// changed its own bound must not move the goal post.
const (
	goalBulkRatio        = 0.9
	goalLiveCPUOverBulk  = 3.0
	goalLiveLagP99S      = 1.0
	goalExcludeP99S      = 2.0
	goalMismatchP99S     = 1.0
	goalDownP99S         = 2.0
	goalIsolationRatio   = 0.95
	goalScaleMiBPerTable = 1.0
	// goalStarterStatusS: one `starter status` of a stream of 1,000
	// tablets, live figures included (issue 46).
	goalStarterStatusS = 2.0
	goalGetChangesRate = 200_000
	goalPgSourceRatio  = 0.8
	goalPgSinkRatio    = 0.8
	goalVitessRatio    = 0.8
	// aimVitessRatio is what the Vitess source aims for beyond its goal:
	// the summary names it, the verdict is on goalVitessRatio.
	aimVitessRatio = 0.9
)

// The reaction cases judged against a goal, by their key in the reaction
// files.
const (
	keyExclude64  = "exclude_to_elsewhere_64_tablets_s"
	keyExclude256 = "exclude_to_elsewhere_256_tablets_s"
	keyMismatch   = "mismatch_to_other_replica_s"
	keyDown       = "down_to_elsewhere_s"
	keyIsolation  = "isolation"
)

// reactionFiles lists the files that may hold reaction cases, in the order
// preferred when their dates tie or are unknown: reaction.json (a run of
// every case), reaction-exclude.json, then any other reaction-*.json (a run
// of some cases alone, e.g. reaction-isolation.json), by name.
func (r *results) reactionFiles() []string {
	names := []string{reactionFile, reactionExcludeFile}
	for _, name := range r.sortedNames() {
		if strings.HasPrefix(name, "reaction-") && name != reactionExcludeFile {
			names = append(names, name)
		}
	}
	return names
}

// commitLagPastLastBucket is what bench/throughput writes when the p99 lies
// beyond the commit-lag histogram's last bucket; noCommitLag is what it
// writes when no commit carried records.
const (
	commitLagPastLastBucket = 999
	noCommitLag             = -1
)

// goals judges every goal against the result files.
func goals(r *results) []row {
	var rows []row
	rows = append(rows, bulkRow(r, 16), bulkRow(r, 64))
	rows = append(rows, liveCPURow(r), liveLagRow(r))
	rows = append(rows,
		latencyRow(r, "exclude-64", keyExclude64, "`exclude` → records from elsewhere, 64 tablets", goalExcludeP99S),
		latencyRow(r, "exclude-256", keyExclude256, "`exclude` → records from elsewhere, 256 tablets", goalExcludeP99S),
		latencyRow(r, "mismatch", keyMismatch, "POSITION_MISMATCH → records from another replica", goalMismatchP99S),
		latencyRow(r, "down", keyDown, "server down → records from elsewhere (initial retry interval 1 s + 1 s)", goalDownP99S),
	)
	rows = append(rows, isolationRatioRow(r), isolationStallRow(r))
	rows = append(rows, scaleRow(r, "scale", scaleFile, "1,000 tablets, `make bench`"),
		scaleRow(r, "scale-5000", scaleFullFile, "5,000 tablets, `make bench-full`"),
		starterStatusRow(r))
	rows = append(rows, runRow(r))
	rows = append(rows, getChangesRow(r), pgSourceRow(r), pgSinkRow(r), vitessRow(r), soakRow(r))
	return rows
}

// none returns the goal without a figure; why says what was missing.
func (g row) none(why, source string) row {
	g.Measured, g.Verdict, g.Source = why, notMeasured, source
	return g
}

// judged returns the goal with its figure and verdict.
func (g row) judged(measured string, v verdict, source string) row {
	g.Measured, g.Verdict, g.Source = measured, v, source
	return g
}

// sourceName names the file a row relies on, marking it when it is absent
// or unreadable so the reader knows where to look.
func sourceName(f *resultFile) string {
	switch {
	case f.missing():
		return f.Name + " (missing)"
	case f.Data == nil:
		return f.Name + " (unreadable)"
	}
	return f.Name
}

// fileProblem explains why a file gave no figures.
func fileProblem(f *resultFile) string {
	if f.missing() {
		return f.Name + " not found"
	}
	return fmt.Sprintf("%s unreadable: %v", f.Name, f.Err)
}

// throughputCases returns the measurements in throughput.json: the
// top-level fields (today's shape, one tablet count) and, when present,
// each entry of "cases" (a later shape with several tablet counts).
func throughputCases(o object) []object {
	if o == nil {
		return nil
	}
	var cases []object
	if _, ok := o.num("tablets"); ok {
		cases = append(cases, o)
	}
	return append(cases, o.objects("cases")...)
}

// caseWithTablets returns the first throughput case run on n tablets.
func caseWithTablets(cases []object, n int) (object, bool) {
	for _, c := range cases {
		if t, ok := c.num("tablets"); ok && int(t) == n {
			return c, true
		}
	}
	return nil, false
}

// bulkRatio is tabletflow's end-to-end rate over the raw loop's in one
// case: the "ratio" field, or computed from the two rates when only they
// are there.
func bulkRatio(c object) (float64, bool) {
	if ratio, ok := c.num("ratio"); ok {
		return ratio, true
	}
	raw, okRaw := c.num("raw_records_per_s")
	flow, okFlow := c.num("tabletflow_records_per_s")
	if okRaw && okFlow && raw > 0 {
		return flow / raw, true
	}
	return 0, false
}

func bulkRow(r *results, tablets int) row {
	goal := row{ID: fmt.Sprintf("bulk-%d", tablets), Area: "Bulk throughput",
		Measure: fmt.Sprintf("tabletflow end to end / raw loop, records/s, %d tablets", tablets),
		Goal:    fmt.Sprintf("≥ %v", goalBulkRatio)}
	f := r.file(throughputFile)
	if f.Data == nil {
		return goal.none(fileProblem(f), sourceName(f))
	}
	c, ok := caseWithTablets(throughputCases(f.Data), tablets)
	if !ok {
		return goal.none(fmt.Sprintf("no %d-tablet case", tablets), f.Name)
	}
	ratio, ok := bulkRatio(c)
	if !ok {
		return goal.none("no ratio or rates", f.Name)
	}
	measured := near(ratio, goalBulkRatio, 2)
	var details []string
	if pairs := c.objects("pairs"); len(pairs) > 1 {
		// bench/throughput's ratio is then the median pair's.
		var ratios []float64
		for _, p := range pairs {
			if r, ok := bulkRatio(p); ok {
				ratios = append(ratios, r)
			}
		}
		if len(ratios) > 0 {
			details = append(details, fmt.Sprintf("median of %d pairs, which ranged from %s to %s",
				len(pairs), fixed(slices.Min(ratios), 2), fixed(slices.Max(ratios), 2)))
		}
	}
	raw, okRaw := c.num("raw_records_per_s")
	flow, okFlow := c.num("tabletflow_records_per_s")
	if okRaw && okFlow {
		details = append(details, fmt.Sprintf("%s against %s records/s", fixed(flow, 0), fixed(raw, 0)))
	}
	if n, ok := c.num("records"); ok && n > 0 {
		details = append(details, fmt.Sprintf("backlog %s records", fixed(n, 0)))
	}
	if steady, ok := c.num("steady_ratio"); ok {
		details = append(details, "steady state "+fixed(steady, 2))
	}
	return goal.judged(withDetails(measured, details), atLeast(ratio, goalBulkRatio), f.Name)
}

// withDetails appends context in parentheses after the judged figure.
func withDetails(figure string, details []string) string {
	if len(details) == 0 {
		return figure
	}
	return figure + " (" + strings.Join(details, "; ") + ")"
}

// phaseRate is a phase's (bulk or live) achieved record rate: its records
// over its seconds.
func phaseRate(phase object) (float64, bool) {
	records, okR := phase.num("records")
	seconds, okS := phase.num("seconds")
	if !okR || !okS || seconds <= 0 {
		return 0, false
	}
	return records / seconds, true
}

// cpuPer1k is a phase's worker CPU seconds per 1,000 records; for the
// bulk phase measured in several pairs, the median of the pairs'.
func cpuPer1k(c object, phase string) (float64, bool) {
	if phase == "bulk" {
		if median, ok := c.num("bulk_worker_cpu_s_per_1k_records_median"); ok {
			return median, true
		}
	}
	return c.num(phase, "worker_cpu_s_per_1k_records")
}

// firstCaseWith returns the first throughput case for which has is true:
// the live goals name no tablet count, so the first measurement that has
// the figures is the one judged.
func firstCaseWith(r *results, has func(object) bool) (object, *resultFile, bool) {
	f := r.file(throughputFile)
	for _, c := range throughputCases(f.Data) {
		if has(c) {
			return c, f, true
		}
	}
	return nil, f, false
}

func liveCPURow(r *results) row {
	goal := row{ID: "live-cpu", Area: "Live",
		Measure: "worker CPU per 1,000 records live at 2,000 records/s, over the bulk figure",
		Goal:    fmt.Sprintf("≤ %v × bulk", goalLiveCPUOverBulk)}
	c, f, ok := firstCaseWith(r, func(c object) bool {
		_, okLive := cpuPer1k(c, "live")
		_, okBulk := cpuPer1k(c, "bulk")
		_, okRatio := c.num("live_cpu_per_1k_over_bulk")
		return (okLive && okBulk) || okRatio
	})
	if !ok {
		if f.Data == nil {
			return goal.none(fileProblem(f), sourceName(f))
		}
		return goal.none("no bulk and live CPU per 1,000 records", f.Name)
	}
	live, okLive := cpuPer1k(c, "live")
	bulk, okBulk := cpuPer1k(c, "bulk")
	var times float64
	var details []string
	if okLive && okBulk && bulk > 0 {
		// Computed from the two figures rather than taken from the file's
		// rounded or precomputed ratio.
		times = live / bulk
		details = append(details, fmt.Sprintf("live %s s, bulk %s s per 1,000 records", fixed(live, 4), fixed(bulk, 4)))
	} else {
		times, _ = c.num("live_cpu_per_1k_over_bulk")
	}
	if rate, ok := phaseRate(objectAt(c, "live")); ok {
		details = append(details, fmt.Sprintf("live at %s records/s", fixed(rate, 0)))
	} else if rate, ok := c.num("history_measure_records_per_s"); ok {
		details = append(details, fmt.Sprintf("live at %s records/s", fixed(rate, 0)))
	}
	if idle := idleDetail(c); idle != "" {
		details = append(details, idle)
	}
	return goal.judged(withDetails(near(times, goalLiveCPUOverBulk, 2)+" × bulk", details),
		atMost(times, goalLiveCPUOverBulk), f.Name)
}

// idleDetail says what the case's tablets cost the worker caught up with
// no records (its idle window), or "" when it has none.
func idleDetail(c object) string {
	cpu, okCPU := c.num("idle", "worker_cpu_s")
	secs, okSecs := c.num("idle", "seconds")
	tablets, okTablets := c.num("tablets")
	if !okCPU || !okSecs || !okTablets || secs <= 0 {
		return ""
	}
	text := fmt.Sprintf("idle: %s tablets caught up cost the worker %s %% of a core", fixed(tablets, 0), fixed(100*cpu/secs, 1))
	if reads, ok := c.num("idle", "commits_per_s"); ok {
		text += fmt.Sprintf(" (%s reads/s)", fixed(reads, 1))
	}
	return text
}

// objectAt returns the object at key, or an empty one.
func objectAt(o object, key string) object {
	if inner, ok := o.obj(key); ok {
		return inner
	}
	return object{}
}

func liveLagRow(r *results) row {
	goal := row{ID: "live-lag", Area: "Live", Measure: "commit-to-sink lag p99, live",
		Goal: fmt.Sprintf("≤ %v s", goalLiveLagP99S)}
	c, f, ok := firstCaseWith(r, func(c object) bool {
		_, ok := c.num("live", "commit_lag_p99_s")
		return ok
	})
	if !ok {
		if f.Data == nil {
			return goal.none(fileProblem(f), sourceName(f))
		}
		return goal.none("no live commit_lag_p99_s", f.Name)
	}
	lag, _ := c.num("live", "commit_lag_p99_s")
	switch {
	case lag == noCommitLag:
		return goal.none("no live commit carried records", f.Name)
	case lag == commitLagPastLastBucket:
		return goal.judged("beyond the lag histogram's last bucket (60 s)", notMet, f.Name)
	}
	// The figure is the upper bound of the histogram bucket holding the
	// p99, so the p99 itself is at most this.
	return goal.judged("≤ "+near(lag, goalLiveLagP99S, 3)+" s (upper bound of its histogram bucket)",
		atMost(lag, goalLiveLagP99S), f.Name)
}

// latencyCase is one reaction case's timings.
type latencyCase struct {
	Key     string
	Samples []float64 // seconds, as measured, one per trial
	P99     float64
	Median  float64 // NaN when there are neither samples nor a median field
	Source  string  // the file it came from
}

// timingOf returns the object holding a reaction case's figures: the case
// itself in older files, its "timing" in newer ones (beside stages).
func timingOf(c object) object {
	if inner, found := c.obj("timing"); found {
		return inner
	}
	return c
}

// caseTimings returns the samples and p99 of a reaction case object. The
// p99, the figure judged, is computed from the samples when there are any
// (nearest rank, as bench/reaction does), so it does not depend on how the
// file rounded it; otherwise the file's own p99 is used.
func caseTimings(c object) (samples []float64, p99 float64, ok bool) {
	timing := timingOf(c)
	samples = timing.numbers("samples")
	if len(samples) > 0 {
		return samples, nearestRank(samples, 0.99), true
	}
	p99, ok = timing.num("p99")
	return nil, p99, ok
}

// caseMedian is context beside the p99, so it is the file's own median
// when it has one (the figure the benchmark's summary quotes), else the
// samples' median taken as bench/reaction takes it: the middle sample, the
// upper one of two for an even count.
func caseMedian(c object, samples []float64) float64 {
	if median, ok := timingOf(c).num("median"); ok {
		return median
	}
	if len(samples) == 0 {
		return math.NaN()
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// nearestRank is the q quantile of values by the nearest-rank method:
// with fewer than 100 values, the 0.99 quantile is the largest.
func nearestRank(values []float64, q float64) float64 {
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// newestWith returns key's object from the newest of the reaction files
// that have a usable one. Dates that tie or are missing keep the earlier
// file in reactionFiles, so reaction-exclude.json only wins over
// reaction.json when it is newer.
func newestWith(r *results, key string, usable func(object) bool) (object, *resultFile, bool) {
	var best object
	var bestFile *resultFile
	for _, name := range r.reactionFiles() {
		f := r.file(name)
		if f.Data == nil {
			continue
		}
		c, ok := f.Data.obj(key)
		if !ok || !usable(c) {
			continue
		}
		if bestFile == nil || isNewer(f, bestFile) {
			best, bestFile = c, f
		}
	}
	return best, bestFile, bestFile != nil
}

// isNewer reports whether a's date is known and after b's (or b has none).
func isNewer(a, b *resultFile) bool {
	da, okA := a.date()
	db, okB := b.date()
	return okA && (!okB || da.After(db))
}

// reactionCase finds a reaction case's timings in the newest file with it.
func reactionCase(r *results, key string) (latencyCase, bool) {
	c, f, ok := newestWith(r, key, func(c object) bool {
		_, _, ok := caseTimings(c)
		return ok
	})
	if !ok {
		return latencyCase{}, false
	}
	samples, p99, _ := caseTimings(c)
	return latencyCase{Key: key, Samples: samples, P99: p99, Median: caseMedian(c, samples), Source: f.Name}, true
}

// reactionSources names the reaction files for a row with no figure.
func reactionSources(r *results) string {
	var names []string
	for _, name := range r.reactionFiles() {
		names = append(names, sourceName(r.file(name)))
	}
	return strings.Join(names, ", ")
}

func latencyRow(r *results, id, key, measure string, bound float64) row {
	goal := row{ID: id, Area: "Re-routing", Measure: measure + ", p99", Goal: fmt.Sprintf("≤ %v s", bound)}
	lc, ok := reactionCase(r, key)
	if !ok {
		return goal.none("no `"+key+"` timings", reactionSources(r))
	}
	var details []string
	if !math.IsNaN(lc.Median) {
		details = append(details, fmt.Sprintf("median %s s", fixed(lc.Median, 3)))
	}
	if n := len(lc.Samples); n > 0 {
		details = append(details, fmt.Sprintf("%d trials", n))
	}
	return goal.judged(withDetails(near(lc.P99, bound, 3)+" s", details), atMost(lc.P99, bound), lc.Source)
}

// isolationUsable says whether an isolation object has a ratio in either
// shape: "ratio" (one pair of runs) or "ratio_min" and friends (several).
func isolationUsable(c object) bool {
	_, okOld := c.num("ratio")
	_, okNew := c.num("ratio_min")
	return okOld || okNew
}

func isolationRatioRow(r *results) row {
	goal := row{ID: "isolation", Area: "Isolation",
		Measure: "healthy tablets' throughput with 1 of 16 failing / fault-free",
		Goal:    fmt.Sprintf("≥ %v", goalIsolationRatio)}
	c, f, ok := newestWith(r, keyIsolation, isolationUsable)
	if !ok {
		return goal.none("no `isolation` result", reactionSources(r))
	}
	// With several pairs of runs the worst pair is judged: the goal must
	// hold in every run, not on average.
	if worst, ok := c.num("ratio_min"); ok {
		details := []string{fmt.Sprintf("worst of %s", pairCount(c))}
		if median, ok := c.num("ratio_median"); ok {
			details = append(details, "median "+fixed(median, 3))
		}
		if highest, ok := c.num("ratio_max"); ok {
			details = append(details, "max "+fixed(highest, 3))
		}
		if spread, ok := c.num("ratio_spread"); ok {
			details = append(details, "spread "+fixed(spread, 3))
		}
		return goal.judged(withDetails(near(worst, goalIsolationRatio, 3), details), atLeast(worst, goalIsolationRatio), f.Name)
	}
	ratio, _ := c.num("ratio")
	return goal.judged(near(ratio, goalIsolationRatio, 3)+" (one pair of runs; no spread measured)",
		atLeast(ratio, goalIsolationRatio), f.Name)
}

// pairCount describes how many pairs of runs an isolation result has.
func pairCount(c object) string {
	n := len(c.objects("pairs"))
	if n == 1 {
		return "1 pair"
	}
	if n == 0 {
		return "the pairs"
	}
	return fmt.Sprintf("%d pairs", n)
}

func isolationStallRow(r *results) row {
	goal := row{ID: "isolation-stall", Area: "Isolation",
		Measure: "longest a healthy tablet with records left went without an ack, 1 of 16 failing",
		Goal:    "< half the source's retention"}
	c, f, ok := newestWith(r, keyIsolation, func(c object) bool {
		_, okStall := c.num("max_healthy_stall_s")
		_, okHalf := c.num("half_retention_s")
		return okStall && okHalf
	})
	if !ok {
		return goal.none("no `isolation` max_healthy_stall_s and half_retention_s", reactionSources(r))
	}
	stall, _ := c.num("max_healthy_stall_s")
	half, _ := c.num("half_retention_s")
	goal.Goal = fmt.Sprintf("< %s s (half the source's retention)", fixed(half, 0))
	return goal.judged(near(stall, half, 3)+" s", lessThan(stall, half), f.Name)
}

// scaleTablets is the tablet count of the scale run.
func scaleTablets(o object) (float64, bool) {
	for _, path := range [][]string{{"setup", "tablets"}, {"tablets"}, {"final_streaming"}} {
		if n, ok := o.num(path...); ok && n > 0 {
			return n, true
		}
	}
	return 0, false
}

// scaleMiBPerTablet is the worker's RSS beyond its idle base divided by the
// tablets. The peak RSS is used when present: memory per tablet is judged
// at its worst. Without a base, the file's own per-tablet figure is used.
func scaleMiBPerTablet(o object, tablets float64) (float64, bool) {
	rss, okRSS := o.num("worker_peak_rss_mib")
	if !okRSS {
		rss, okRSS = o.num("worker_rss_mib")
	}
	base, okBase := o.num("worker_rss_base_mib")
	if okRSS && okBase && tablets > 0 {
		return (rss - base) / tablets, true
	}
	for _, key := range []string{"worker_peak_rss_per_tablet_kib", "worker_rss_per_tablet_kib"} {
		if kib, ok := o.num(key); ok {
			return kib / 1024, true
		}
	}
	return 0, false
}

func scaleRow(r *results, id, file, setup string) row {
	goal := row{ID: id, Area: "Scale",
		Measure: "worker RSS per tablet beyond a fixed base, one worker (" + setup + ")",
		Goal:    fmt.Sprintf("≤ %v MiB per tablet", goalScaleMiBPerTable)}
	f := r.file(file)
	if f.Data == nil {
		return goal.none(fileProblem(f), sourceName(f))
	}
	tablets, okTablets := scaleTablets(f.Data)
	perTablet, ok := scaleMiBPerTablet(f.Data, tablets)
	if !ok {
		return goal.none("no worker RSS figures", f.Name)
	}
	figure := near(perTablet*1024, goalScaleMiBPerTable*1024, 1) + " KiB"
	var details []string
	if okTablets {
		details = append(details, fmt.Sprintf("run with %s tablets", fixed(tablets, 0)))
	} else {
		details = append(details, "tablet count not stated")
	}
	if base, ok := f.Data.num("worker_rss_base_mib"); ok {
		details = append(details, fmt.Sprintf("base %s MiB", fixed(base, 1)))
	}
	if peak, ok := f.Data.num("worker_peak_rss_mib"); ok {
		details = append(details, fmt.Sprintf("peak %s MiB", fixed(peak, 1)))
	}
	details = append(details, streamingTimes(f.Data)...)
	return goal.judged(withDetails(figure, details), atMost(perTablet, goalScaleMiBPerTable), f.Name)
}

// starterStatusRow judges the slowest of the scale run's `starter status`
// calls at the end, every tablet streaming.
func starterStatusRow(r *results) row {
	goal := row{ID: "starter-status", Area: "Scale",
		Measure: "`starter status` of 1,000 streaming tablets, live figures included (`make bench`)",
		Goal:    fmt.Sprintf("≤ %v s", goalStarterStatusS)}
	f := r.file(scaleFile)
	if f.Data == nil {
		return goal.none(fileProblem(f), sourceName(f))
	}
	calls := f.Data.numbers("starter_status_s")
	if len(calls) == 0 {
		why := "no starter status figures"
		if e, ok := f.Data.str("starter_status_error"); ok {
			why += ": " + e
		}
		return goal.none(why, f.Name)
	}
	slowest := slices.Max(calls)
	return goal.judged(fmt.Sprintf("%s s, slowest of %d calls", fixed(slowest, 2), len(calls)), atMost(slowest, goalStarterStatusS), f.Name)
}

// streamingTimes describes how long the scale run took to get its tablets
// streaming: 1,000 of them (the goal's size) when the timeline has it, all
// of them, and every tablet read from by tabletd.
func streamingTimes(o object) []string {
	var out []string
	for _, point := range o.objects("timeline") {
		n, okN := point.num("tablets")
		s, okS := point.num("streaming_s")
		if okN && okS && n == 1000 {
			out = append(out, fmt.Sprintf("1,000 streaming after %s s", fixed(s, 0)))
			break
		}
	}
	all, okAll := o.boolean("all_streaming")
	seconds, okSeconds := o.num("all_streaming_s")
	switch {
	case okAll && !all:
		out = append(out, "not all tablets reached Streaming")
	case okSeconds:
		out = append(out, fmt.Sprintf("all streaming after %s s", fixed(seconds, 0)))
	}
	// A row is Streaming once the stream picked its replica (a new
	// stream's tablets from their start): tabletd having served every
	// tablet says they all read.
	if served, ok := o.num("all_served_s"); ok && served > 0 {
		out = append(out, fmt.Sprintf("every tablet read from after %s s", fixed(served, 0)))
	}
	return out
}

// otherArea groups the benchmarks listed beside issue 11's goals.
const otherArea = "Other (not issue 11)"

func getChangesRow(r *results) row {
	goal := row{ID: "getchanges", Area: otherArea, Measure: "GetChanges over gRPC from one replica, records/s",
		Goal: "≥ " + fixed(goalGetChangesRate, 0) + " records/s"}
	f := r.file(getChangesFile)
	if f.Data == nil {
		return goal.none(fileProblem(f), sourceName(f))
	}
	rate, ok := f.Data.num("grpc_records_per_s")
	if !ok {
		return goal.none("no grpc_records_per_s", f.Name)
	}
	return goal.judged(near(rate, goalGetChangesRate, 0)+" records/s", atLeast(rate, goalGetChangesRate), f.Name)
}

// ratioRow judges a file's top-level "ratio" against a lower bound.
func ratioRow(r *results, id, name, measure string, bound float64, details func(object) []string) row {
	goal := row{ID: id, Area: otherArea, Measure: measure, Goal: fmt.Sprintf("≥ %v", bound)}
	f := r.file(name)
	if f.Data == nil {
		return goal.none(fileProblem(f), sourceName(f))
	}
	ratio, ok := f.Data.num("ratio")
	if !ok {
		return goal.none("no ratio", f.Name)
	}
	return goal.judged(withDetails(near(ratio, bound, 2), details(f.Data)), atLeast(ratio, bound), f.Name)
}

func pgSourceRow(r *results) row {
	return ratioRow(r, "pgsource", pgSourceFile, "PostgreSQL source: tabletflow / raw pglogrepl loop, records/s", goalPgSourceRatio,
		func(o object) []string {
			var details []string
			if steady, ok := o.num("steady_ratio"); ok {
				details = append(details, "steady state "+fixed(steady, 2))
			}
			return details
		})
}

func pgSinkRow(r *results) row {
	return ratioRow(r, "pgsink", pgSinkFile, "PostgreSQL sink: changelog sink / raw COPY loop, records/s", goalPgSinkRatio,
		func(o object) []string {
			var details []string
			if rounds := o.numbers("round_ratios"); len(rounds) > 0 {
				details = append(details, fmt.Sprintf("%d rounds' ratios from %s to %s", len(rounds), fixed(slices.Min(rounds), 2), fixed(slices.Max(rounds), 2)))
			}
			if ofMedians, ok := o.num("ratio_of_medians"); ok {
				details = append(details, "ratio of the median rates "+fixed(ofMedians, 2))
			}
			return details
		})
}

// vitessRow judges bench/vitess's median pair against the goal, naming
// the aim beside it, the pairs' range, both rates and the worker's peak
// memory.
func vitessRow(r *results) row {
	g := ratioRow(r, "vitess", vitessFile, "Vitess source: tabletflow / raw VStream loop, records/s, one shard", goalVitessRatio,
		func(o object) []string {
			var details []string
			if pairs := o.objects("pairs"); len(pairs) > 0 {
				var ratios []float64
				for _, p := range pairs {
					if ratio, ok := p.num("ratio"); ok {
						ratios = append(ratios, ratio)
					}
				}
				if len(ratios) > 0 {
					details = append(details, fmt.Sprintf("median of %d pairs, which ranged from %s to %s",
						len(pairs), fixed(slices.Min(ratios), 2), fixed(slices.Max(ratios), 2)))
				}
			}
			raw, okRaw := o.num("raw_records_per_s")
			flow, okFlow := o.num("tabletflow_records_per_s")
			if okRaw && okFlow {
				details = append(details, fmt.Sprintf("%s against %s records/s", fixed(flow, 0), fixed(raw, 0)))
			}
			if n, ok := o.num("records"); ok && n > 0 {
				details = append(details, fmt.Sprintf("backlog %s records", fixed(n, 0)))
			}
			if steady, ok := o.num("steady_ratio"); ok {
				details = append(details, "steady state "+fixed(steady, 2))
			}
			if rss, ok := o.num("worker_peak_rss_mib"); ok {
				details = append(details, fmt.Sprintf("worker peak RSS %s MiB", fixed(rss, 1)))
			}
			return details
		})
	g.Goal += fmt.Sprintf(" (aim %v)", aimVitessRatio)
	return g
}

func soakRow(r *results) row {
	goal := row{ID: "soak", Area: otherArea, Measure: "soak run: digest matches, no duplicates, memory under its limit",
		Goal: "pass"}
	f := r.file(soakFile)
	if f.Data == nil {
		return goal.none(fileProblem(f), sourceName(f))
	}
	pass, ok := f.Data.boolean("pass")
	if !ok {
		return goal.none("no pass field", f.Name)
	}
	figure, v := "fail", notMet
	if pass {
		figure, v = "pass", met
	}
	var details []string
	if d, ok := f.Data.str("duration"); ok {
		details = append(details, d)
	}
	if n, ok := f.Data.num("tablets"); ok {
		details = append(details, fixed(n, 0)+" tablets")
	}
	if achieved, ok := f.Data.num("achievedRecordsPerSecond"); ok {
		text := fixed(achieved, 0) + " records/s"
		if asked, ok := f.Data.num("rateRecordsPerSecond"); ok {
			text += " of " + fixed(asked, 0) + " asked"
		}
		details = append(details, text)
	}
	if rss, ok := f.Data.num("maxRssMiB"); ok {
		details = append(details, fmt.Sprintf("max RSS %s MiB", fixed(rss, 1)))
	}
	return goal.judged(withDetails(figure, details), v, f.Name)
}
