package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/bench/internal/history"
	"github.com/tabletflow/tabletflow/bench/internal/procs"
	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/testbed/promscrape"
	"github.com/tabletflow/tabletflow/workflows"
)

// historyCost runs the workload at rate for window while the flow stream
// keeps streaming, then counts the history events the parent and the
// first tablet's workflow recorded inside the window, per hour. From every
// tablet's history it also takes how the tablets started, the gaps between
// GetChanges runs and the batch size in the window. It leaves the workload
// paused and the stream caught up.
func (b *bench) historyCost(ctx context.Context, window time.Duration, rate float64, res *result) error {
	if _, err := b.workload(ctx, sourcepb.WorkloadRequest_RATE, rate); err != nil {
		return err
	}
	// The live window, like each side of a pair, starts with the page
	// cache of what was written before dropped (flushDirty): its writes
	// then cost what the bulk ones did.
	b.flushDirty()
	m0, err := promscrape.Get(b.metrics)
	if err != nil {
		return err
	}
	cpu0 := b.cpu()
	from := time.Now()
	if _, err := b.workload(ctx, sourcepb.WorkloadRequest_RESUME, 0); err != nil {
		return err
	}
	publish.Logf("history: streaming at %.0f records/s for %v", rate, window)
	if b.cpuProfile != "" {
		// The worker serves Go's profiles beside its metrics: its CPU
		// profile over the live window says where the live cost goes.
		if err := b.profile(ctx, window, b.cpuProfile); err != nil {
			return err
		}
	} else if err := procs.Sleep(ctx, window); err != nil {
		return err
	}
	to := time.Now()
	res.CPUMeasure = b.cpu().Minus(cpu0)
	m1, err := promscrape.Get(b.metrics)
	if err != nil {
		return err
	}
	res.Live = commitStats(m0, m1, res.CPUMeasure["worker"])
	if _, err := b.workload(ctx, sourcepb.WorkloadRequest_PAUSE, 0); err != nil {
		return err
	}
	if _, err := b.quiesce(ctx); err != nil {
		return err
	}
	res.MeasureWindowS = to.Sub(from).Seconds()
	hours := to.Sub(from).Hours()

	last, err := b.lastPositions(ctx)
	if err != nil {
		return err
	}
	runs, err := history.Chain(ctx, b.temporal, b.flowID)
	if err != nil {
		return err
	}
	parent := analyze(runs, from, to)
	res.HistoryEventsParentPerHour = float64(parent.events) / hours
	publish.Logf("history: %d events in %.0fs on %s: %s", parent.events, res.MeasureWindowS, b.flowID, parent)

	var started, scheduled, firstRuns, gaps, decide, dispatch, wtWait []time.Duration
	var records, batches int64
	for i, tablet := range slices.Sorted(maps.Keys(last)) {
		id := workflows.TabletWorkflowID(b.flowID, tablet)
		runs, err := history.Chain(ctx, b.temporal, id)
		if err != nil {
			return err
		}
		h := analyze(runs, from, to)
		if i == 0 {
			res.HistoryEventsPerTabletPerHour = float64(h.events) / hours
			publish.Logf("history: %d events in %.0fs on %s: %s", h.events, res.MeasureWindowS, id, h)
		}
		for _, at := range []struct {
			t   time.Time
			out *[]time.Duration
		}{{h.started, &started}, {h.firstScheduled, &scheduled}, {h.firstRun, &firstRuns}} {
			if !at.t.IsZero() {
				*at.out = append(*at.out, at.t.Sub(b.flowStart))
			}
		}
		gaps = append(gaps, h.gaps...)
		decide = append(decide, h.decide...)
		dispatch = append(dispatch, h.dispatch...)
		wtWait = append(wtWait, h.wtWait...)
		records += h.records
		batches += h.batches
	}
	res.TabletStartedS = spreadOf(started)
	res.TabletFirstScheduledS = spreadOf(scheduled)
	res.TabletFirstRunS = spreadOf(firstRuns)
	res.TabletGapBetweenRunsS = spreadOf(gaps)
	res.TabletGapDecideS = spreadOf(decide)
	res.TabletGapDispatchS = spreadOf(dispatch)
	res.TabletWorkflowTaskWaitS = spreadOf(wtWait)
	if batches > 0 {
		res.SteadyBatchRecords = float64(records) / float64(batches)
	}

	// The stream keeps up: wait for it to ack what the window wrote.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		p, err := b.progress(ctx, b.flowID, last)
		if err != nil {
			return err
		}
		if len(p.done) == len(last) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the stream did not catch up within 2m after the measurement")
		}
		if err := procs.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// historyStats is what a workflow's history says. It reads only events
// every shape of the tablet workflow has (GetChanges is an activity; the
// picker may be an activity or a local one), so it survives changes of
// shape.
type historyStats struct {
	events int            // events in [from, to]
	byType map[string]int // and by type
	// When the workflow started, and its first GetChanges was scheduled
	// and started.
	started, firstScheduled, firstRun time.Time
	// In the window: a GetChanges completed → the next one started (gaps),
	// split into completed → next scheduled (the workflow deciding) and
	// scheduled → started (dispatch to the worker); and workflow tasks'
	// schedule-to-start latency.
	gaps, decide, dispatch, wtWait []time.Duration
	// GetChanges runs that started and completed in the window.
	records, batches int64
}

func (h historyStats) String() string {
	keys := slices.Sorted(maps.Keys(h.byType))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", strings.TrimPrefix(k, "EVENT_TYPE_"), h.byType[k]))
	}
	return strings.Join(parts, " ")
}

// analyze reads a workflow's runs (oldest first).
func analyze(runs [][]*historypb.HistoryEvent, from, to time.Time) historyStats {
	h := historyStats{byType: map[string]int{}}
	in := func(t time.Time) bool { return !t.Before(from) && !t.After(to) }
	var lastDone, wtScheduled time.Time
	for _, events := range runs {
		getChanges := map[int64]bool{}     // scheduled event ID → is GetChanges
		scheduled := map[int64]time.Time{} // scheduled event ID → when
		started := map[int64]time.Time{}   // scheduled event ID → when
		for _, ev := range events {
			at := ev.GetEventTime().AsTime()
			if in(at) {
				h.events++
				h.byType[ev.GetEventType().String()]++
			}
			switch ev.GetEventType() {
			case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
				if h.started.IsZero() {
					h.started = at
				}
			case enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
				wtScheduled = at
			case enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED:
				if in(wtScheduled) && in(at) {
					h.wtWait = append(h.wtWait, at.Sub(wtScheduled))
				}
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
				if ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() != "GetChanges" {
					continue
				}
				getChanges[ev.GetEventId()] = true
				scheduled[ev.GetEventId()] = at
				if h.firstScheduled.IsZero() {
					h.firstScheduled = at
				}
				if !lastDone.IsZero() && in(at) {
					h.decide = append(h.decide, at.Sub(lastDone))
				}
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
				// Written when the attempt ends, with the time it started.
				id := ev.GetActivityTaskStartedEventAttributes().GetScheduledEventId()
				if !getChanges[id] {
					continue
				}
				started[id] = at
				if h.firstRun.IsZero() {
					h.firstRun = at
				}
				if !lastDone.IsZero() && in(at) {
					h.gaps = append(h.gaps, at.Sub(lastDone))
					h.dispatch = append(h.dispatch, at.Sub(scheduled[id]))
				}
				lastDone = time.Time{}
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
				a := ev.GetActivityTaskCompletedEventAttributes()
				id := a.GetScheduledEventId()
				if !getChanges[id] {
					continue
				}
				lastDone = at
				var r activities.GetChangesResult
				if in(started[id]) && in(at) && converter.GetDefaultDataConverter().FromPayloads(a.GetResult(), &r) == nil {
					h.records += r.Records
					h.batches += r.Batches
				}
			}
		}
	}
	return h
}

// spread summarises durations in seconds.
type spread struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

func spreadOf(ds []time.Duration) spread {
	if len(ds) == 0 {
		return spread{}
	}
	ds = slices.Sorted(slices.Values(ds))
	r := func(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }
	return spread{N: len(ds), Min: r(ds[0]), Median: r(ds[len(ds)/2]), Max: r(ds[len(ds)-1])}
}

// idleCost measures the worker over window with the stream caught up and
// the workload paused (as historyCost leaves them): every tablet
// long-polls its replica.
func (b *bench) idleCost(ctx context.Context, window time.Duration) (commits, error) {
	m0, err := promscrape.Get(b.metrics)
	if err != nil {
		return commits{}, err
	}
	cpu0 := b.cpu()
	publish.Logf("idle: every tablet caught up, no records, for %v", window)
	if b.idleProfile != "" {
		if err := b.profile(ctx, window, b.idleProfile); err != nil {
			return commits{}, err
		}
	} else if err := procs.Sleep(ctx, window); err != nil {
		return commits{}, err
	}
	cpu := b.cpu().Minus(cpu0)
	m1, err := promscrape.Get(b.metrics)
	if err != nil {
		return commits{}, err
	}
	return commitStats(m0, m1, cpu["worker"]), nil
}

// commits is what the worker's metrics say of a window: records, sink
// commits, acknowledgements, the JSONL sink's fdatasyncs and syncfses, the
// commit lag's p99, and the worker's CPU per 1000 records.
type commits struct {
	Seconds          float64 `json:"seconds"`
	Records          float64 `json:"records"`
	CommitsPerS      float64 `json:"commits_per_s"`
	AcksPerS         float64 `json:"acks_per_s"`
	FsyncsPerS       float64 `json:"fsyncs_per_s"` // fdatasync(2)s
	SyncfsPerS       float64 `json:"syncfs_per_s"` // syncfs(2)s of the group sync
	RecordsPerCommit float64 `json:"records_per_commit"`
	// CommitLagP99S: the upper bound of the histogram bucket holding the
	// 99th percentile of tabletflow_commit_lag_seconds (per commit: durable
	// in the sink less the source commit time of its oldest record).
	CommitLagP99S float64 `json:"commit_lag_p99_s"`
	// CommitLagCounts: the window's commits with records, cumulative by
	// the upper bound of each bucket of tabletflow_commit_lag_seconds
	// ("+Inf": all of them): how far the tail is from the goal.
	CommitLagCounts map[string]uint64 `json:"commit_lag_counts,omitempty"`
	WorkerCPUS      float64           `json:"worker_cpu_s"`
	WorkerCPUPer1k  float64           `json:"worker_cpu_s_per_1k_records"`
}

func commitStats(before, after promscrape.Scrape, workerCPU float64) commits {
	c := commits{Seconds: after.At.Sub(before.At).Seconds(), WorkerCPUS: workerCPU,
		Records: promscrape.Delta(before, after, "tabletflow_records_written_total")}
	n := promscrape.Delta(before, after, "tabletflow_batches_written_total")
	c.CommitsPerS = n / c.Seconds
	c.AcksPerS = promscrape.Delta(before, after, "tabletflow_acks_total") / c.Seconds
	c.FsyncsPerS = promscrape.Delta(before, after, "tabletflow_jsonl_fdatasync_total") / c.Seconds
	c.SyncfsPerS = promscrape.Delta(before, after, "tabletflow_jsonl_syncfs_total") / c.Seconds
	if n > 0 {
		c.RecordsPerCommit = c.Records / n
	}
	c.CommitLagP99S, _ = promscrape.Quantile(before, after, "tabletflow_commit_lag_seconds", 0.99)
	if window := promscrape.Buckets(before, after, "tabletflow_commit_lag_seconds"); window != nil {
		c.CommitLagCounts = map[string]uint64{} // JSON keys: the bounds as text
		for ub, n := range window {
			c.CommitLagCounts[strconv.FormatFloat(ub, 'g', -1, 64)] = n
		}
	}
	switch { // JSON has no NaN or Inf
	case math.IsNaN(c.CommitLagP99S): // no commit with records
		c.CommitLagP99S = -1
	case math.IsInf(c.CommitLagP99S, 1): // past the last bucket (60 s)
		c.CommitLagP99S = 999
	}
	if c.Records > 0 {
		c.WorkerCPUPer1k = workerCPU / c.Records * 1000
	}
	return c
}
