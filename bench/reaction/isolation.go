package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// isolationBacklog is the backlog each world of the isolation case holds,
// which each of its drains reads: long enough that a stream's start and
// tail weigh little in the shared window (10% to 90%), short enough that
// the case fits in make bench's 20 minutes. Each pair's window_s and the
// result's case_seconds["isolation"] measure the two; see
// docs/benchmarks.md.
const isolationBacklog = 2_500_000

// preloadRate is tabletd's highest workload rate: the backlog is written
// as fast as tabletd can, and the workload stops when it is written.
const preloadRate = 10_000_000

// faultyTablet is the tablet that fails in the isolation case; every other
// tablet is healthy.
const faultyTablet = "t-0001"

func healthy(id string) bool { return id != faultyTablet }

// world is one side of the isolation case: a dev server, a tabletd of 16
// tablets and a worker of its own, preloaded with isolationBacklog records
// that each of its source-side streams is due.
type world struct {
	name    string
	srv     *testbed.DevServer
	c       client.Client
	bed     *bed
	last    map[string]uint64 // each tablet's last position (index)
	backlog uint64            // the healthy tablets' records
	faulty  *sourcepb.Tablet  // t-0001, with its replicas
}

func (w *world) close() {
	if w.bed != nil {
		w.bed.close()
	}
	if w.c != nil {
		w.c.Close()
	}
	if w.srv != nil {
		w.srv.Stop()
	}
}

// newWorld starts a world and writes its backlog. Every source-side
// stream its drains read (streams) exists before the backlog is written:
// tabletd frees what every stream has acknowledged, so a stream created
// after an earlier drain would find the backlog gone (and "drain" it at
// once: how this case once measured nonsense).
func newWorld(dir, name string, serverArgs, streams []string) (*world, error) {
	w := &world{name: name}
	if err := w.start(dir, serverArgs, streams); err != nil {
		w.close() // what start started
		return nil, err
	}
	return w, nil
}

// start is newWorld's work: on an error, w holds what it started.
func (w *world) start(dir string, serverArgs, streams []string) (err error) {
	name := w.name
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Join(d, "temporal"), 0o755); err != nil {
		return err
	}
	if w.srv, err = testbed.StartDevServer(filepath.Join(binDir, "temporal"), filepath.Join(d, "temporal"), serverArgs...); err != nil {
		return err
	}
	if w.c, err = client.Dial(client.Options{HostPort: w.srv.Addr, Logger: temporalclient.Quiet{}}); err != nil {
		return err
	}
	if w.bed, err = newBedOn(w.srv.Addr, w.c, dir, name, "--tablets", "16", "--rate", "0", "--lag", "0s"); err != nil {
		return err
	}
	b := w.bed
	for _, id := range streams {
		if _, err := b.topo.CreateStream(context.Background(), &sourcepb.CreateStreamRequest{
			Stream: id, Keyspace: "commerce", StartFrom: sourcepb.StartFrom_EARLIEST}); err != nil {
			return err
		}
	}
	if _, err := b.admin.Workload(context.Background(), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_RATE, Rate: preloadRate}); err != nil {
		return err
	}
	if _, err := b.admin.Workload(context.Background(), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_RESUME}); err != nil {
		return err
	}
	if err := b.until(2*time.Minute, name+": backlog written", func() bool {
		st, err := b.admin.Workload(context.Background(), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STATUS})
		return err == nil && st.Records >= isolationBacklog
	}); err != nil {
		return err
	}
	if _, err := b.admin.Workload(context.Background(), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STOP}); err != nil {
		return err
	}
	resp, err := b.topo.ListTablets(context.Background(), &sourcepb.ListTabletsRequest{})
	if err != nil {
		return err
	}
	w.last = map[string]uint64{}
	for _, t := range resp.Tablets {
		cp, _ := source.ParseCheckpoint(t.LastPosition)
		w.last[t.Id] = cp.Index
		if t.Id == faultyTablet {
			w.faulty = t
		} else {
			w.backlog += cp.Index
		}
	}
	if w.faulty == nil {
		return fmt.Errorf("%s: no tablet %s", name, faultyTablet)
	}
	return nil
}

// fault sets (or heals) the failure of every replica of the faulty tablet.
func (w *world) fault(on bool) error {
	for _, r := range w.faulty.Replicas {
		var err error
		if on {
			_, err = w.bed.admin.Fault(context.Background(), &sourcepb.FaultRequest{Server: r.Alias, Tablet: faultyTablet, Code: "UNAVAILABLE"})
		} else {
			_, err = w.bed.admin.Heal(context.Background(), &sourcepb.HealRequest{Server: r.Alias})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// cpu is the CPU seconds the world's processes (dev server, tabletd,
// worker) have used.
func (w *world) cpu() float64 {
	s, _ := cpuSeconds(w.srv.Proc, w.bed.worker, w.bed.tabletd) // what could be read
	return s
}

// cpuSeconds is the CPU seconds ps have used together: the sum over those
// whose /proc could be read, and the errors of the others.
func cpuSeconds(ps ...*testbed.Proc) (float64, error) {
	var s float64
	var errs []error
	for _, p := range ps {
		v, err := procstat.ProcessCPU(p.Pid())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s += v
	}
	return s, errors.Join(errs...)
}

// drain is what one world's drain measured: the healthy tablets' rate in
// the shared window, their records and the world's CPU seconds in it, and
// the longest a healthy tablet with records left went without an
// acknowledgement over the whole drain.
type drain struct {
	rate    float64
	records float64
	allRate float64 // every tablet's records, the failing one's too
	cpu     float64
	stall   time.Duration
}

// drainSideBySide starts stream[i] in worlds[i] at once and polls both
// until every healthy tablet of both is acknowledged to its end. The rates
// are taken over one window for both: from when both worlds have
// committed 10% of their healthy backlog to the sink (the worker's
// counter: tabletd's acks move in steps of the acknowledgement interval)
// to when the first has committed 90%. The machine's drift, which moves
// drains run one after another apart, then moves both sides alike.
// The streams are stopped afterwards, so that idle streams do not pile up
// on the workers.
func drainSideBySide(worlds [2]*world, streams [2]string) (out [2]drain, window time.Duration, steal float64, err error) {
	for i, w := range worlds {
		if err := w.bed.start(streams[i], map[string]any{"selection": map[string]any{"tabletTypes": []string{"PRIMARY", "REPLICA", "RDONLY"}}}); err != nil {
			return out, 0, 0, err
		}
		defer func() {
			_ = w.c.SignalWorkflow(context.Background(), streams[i], "", workflows.CmdStop, json.RawMessage(`{}`))
		}()
	}
	type side struct {
		seen  map[string]uint64
		since map[string]time.Time
		done  bool
	}
	var (
		sides [2]side
		win   = sharedWindow{backlog: [2]uint64{worlds[0].backlog, worlds[1].backlog}}
	)
	for i := range sides {
		sides[i] = side{seen: map[string]uint64{}, since: map[string]time.Time{}}
	}
	deadline := time.Now().Add(10 * time.Minute)
	for !sides[0].done || !sides[1].done {
		if time.Now().After(deadline) {
			return out, 0, 0, errors.New("healthy tablets not drained within 10m")
		}
		var written, all [2]float64
		now := time.Now()
		for i, w := range worlds {
			a, err := w.bed.acked(streams[i])
			if err != nil {
				return out, 0, 0, err
			}
			if written[i], all[i], err = w.bed.committed(streams[i], healthy); err != nil {
				return out, 0, 0, err
			}
			s := &sides[i]
			var done uint64
			for id, last := range w.last {
				if !healthy(id) {
					continue
				}
				done += min(a[id], last)
				if a[id] >= last {
					continue
				}
				if _, ok := s.since[id]; !ok || a[id] > s.seen[id] {
					s.since[id], s.seen[id] = now, a[id]
				}
				if a[id] > 0 { // before its first ack, the tablet is starting
					out[i].stall = max(out[i].stall, now.Sub(s.since[id]))
				}
			}
			s.done = done >= w.backlog
		}
		if m := win.add(now, written, all); m != nil {
			// The window's edges also read each world's CPU and the host's
			// steal (not every poll: /proc reads cost CPU too).
			for i, w := range worlds {
				m.cpu[i] = w.cpu()
			}
			if h, err := procstat.ReadHostCPU(); err == nil {
				m.steal = procstat.Seconds(h.Steal)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	rates, window, steal, err := win.drains()
	if err != nil {
		return out, window, 0, err
	}
	for i := range out {
		rates[i].stall = out[i].stall
	}
	return rates, window, steal, nil
}

// sharedWindow is the window two side-by-side drains are measured over
// (drainSideBySide): it opens at the first poll at which both sides have
// committed a tenth of their backlog and shuts at the first after that at
// which either has committed nine tenths.
type sharedWindow struct {
	backlog    [2]uint64
	open, shut mark
}

// mark is the poll at an edge of a sharedWindow: when, the healthy and
// every tablet's records each side had committed, and (filled in by the
// caller) each side's CPU seconds and the host's steal seconds.
type mark struct {
	at           time.Time
	written, all [2]float64
	cpu          [2]float64
	steal        float64
}

// add takes one poll of both sides. It returns the edge the poll is, to
// fill in its CPU and steal, or nil if it is neither.
func (w *sharedWindow) add(at time.Time, written, all [2]float64) *mark {
	reached := func(i int, tenths uint64) bool { return written[i]*10 >= float64(w.backlog[i]*tenths) }
	switch {
	case w.open.at.IsZero() && reached(0, 1) && reached(1, 1):
		w.open = mark{at: at, written: written, all: all}
		return &w.open
	case !w.open.at.IsZero() && w.shut.at.IsZero() && (reached(0, 9) || reached(1, 9)):
		w.shut = mark{at: at, written: written, all: all}
		return &w.shut
	}
	return nil
}

// drains returns each side's healthy and all-tablet rates, records and
// CPU seconds in the window, its length and the host's steal in it. A
// window under a second (or one that never shut) is an error: the
// drains were too far apart to compare.
func (w *sharedWindow) drains() (out [2]drain, window time.Duration, steal float64, err error) {
	if w.shut.at.IsZero() {
		return out, 0, 0, errors.New("the side-by-side window never shut: no side reached nine tenths of its backlog after both had a tenth")
	}
	window = w.shut.at.Sub(w.open.at)
	if window < time.Second {
		return out, window, 0, fmt.Errorf("the side-by-side window is %v: the drains were too far apart to compare", window)
	}
	for i := range out {
		out[i].records = w.shut.written[i] - w.open.written[i]
		out[i].rate = out[i].records / window.Seconds()
		out[i].allRate = (w.shut.all[i] - w.open.all[i]) / window.Seconds()
		out[i].cpu = w.shut.cpu[i] - w.open.cpu[i]
	}
	return out, window, w.shut.steal - w.open.steal, nil
}

// isolation runs two worlds side by side (each with its own dev server,
// tabletd and worker, so that neither's failures cost the other anything
// but the machine's CPU) and drains them at the same time in pairs: in
// each pair one world has every replica of t-0001 failing (UNAVAILABLE)
// and the other none, the failing world alternating from pair to pair so
// that a difference between the worlds themselves does not favour either
// side. Each pair's ratio is the failing world's healthy rate over the
// fault-free world's in the same window. The two share two cores, so
// what the failing tablet costs the machine comes out of both worlds'
// share: the ratio sees about half of it, as a run alone would see all
// of it on half the throughput. It also records the longest a healthy
// tablet of the failing world went without an acknowledgement while it
// had records left, against half the source's retention.
func isolation(dir string, pairs int, serverArgs []string) (map[string]any, error) {
	if pairs < 1 {
		return nil, fmt.Errorf("--isolation-pairs: %d; at least 1", pairs)
	}
	streams := []string{"warmup"}
	for i := range pairs {
		streams = append(streams, fmt.Sprintf("pair-%d", i+1))
	}
	var worlds [2]*world
	for i, name := range []string{"isolation-a", "isolation-b"} {
		w, err := newWorld(dir, name, serverArgs, streams)
		if err != nil {
			return nil, err
		}
		defer w.close()
		worlds[i] = w
	}
	// A first drain warms the workers and the dev servers up; it is not
	// counted.
	if _, _, _, err := drainSideBySide(worlds, [2]string{"warmup", "warmup"}); err != nil {
		return nil, err
	}
	type pair struct {
		// FailingWorld: which world had t-0001 failing.
		FailingWorld string  `json:"failing_world"`
		Clean        int     `json:"healthy_records_per_s_fault_free"`
		Faulty       int     `json:"healthy_records_per_s_one_failing"`
		Ratio        float64 `json:"ratio"`
		// RatioOfAll: the failing world's healthy rate over every
		// tablet's rate in the fault-free world. Where the machine is
		// full, the fault-free world's t-0001 takes about a sixteenth of
		// the rate that the failing world's healthy tablets get instead,
		// so Ratio (the goal's measure) would be about 16/15 for a
		// failing tablet that cost nothing; this one about 1.
		RatioOfAll float64 `json:"ratio_of_all_records"`
		WindowS    float64 `json:"window_s"`
		// StallS: the longest a healthy tablet of the failing world with
		// records left went without an ack.
		StallS float64 `json:"max_healthy_stall_s"`
		// Each world's CPU seconds (its dev server, tabletd and worker)
		// per 1,000 healthy records in the window, and the host's steal
		// seconds in it: the failing world's figure includes its failing
		// tablet's retries.
		CleanCPUPer1k  float64 `json:"cpu_s_per_1k_healthy_records_fault_free"`
		FaultyCPUPer1k float64 `json:"cpu_s_per_1k_healthy_records_one_failing"`
		StealS         float64 `json:"steal_s"`
	}
	var runs []pair
	var ratios []time.Duration // summarize takes durations: ratios as seconds
	var worst time.Duration
	ofAll := []float64{}
	for i := range pairs {
		failing := i % 2 // world a fails in odd pairs (1, 3, …), b in even
		clean := 1 - failing
		if err := worlds[failing].fault(true); err != nil {
			return nil, err
		}
		d, window, steal, err := drainSideBySide(worlds, [2]string{streams[1+i], streams[1+i]})
		if err != nil {
			return nil, err
		}
		if err := worlds[failing].fault(false); err != nil {
			return nil, err
		}
		f, c := d[failing], d[clean]
		p := pair{FailingWorld: worlds[failing].name, Clean: int(c.rate), Faulty: int(f.rate), Ratio: round(f.rate / c.rate),
			RatioOfAll: round(f.rate / c.allRate),
			WindowS:    round(window.Seconds()), StallS: round(f.stall.Seconds()),
			CleanCPUPer1k: c.cpu / c.records * 1000, FaultyCPUPer1k: f.cpu / f.records * 1000, StealS: round(steal)}
		runs = append(runs, p)
		ofAll = append(ofAll, p.RatioOfAll)
		ratios = append(ratios, time.Duration(f.rate/c.rate*float64(time.Second)))
		worst = max(worst, f.stall)
	}
	sum := summarize(ratios)
	return map[string]any{"pairs": runs, "ratio_median": sum.Median, "ratio_min": slices.Min(sum.Samples),
		"ratio_max": sum.Max, "ratio_spread": round(sum.Max - slices.Min(sum.Samples)),
		"max_healthy_stall_s": round(worst.Seconds()), "half_retention_s": (time.Hour / 2).Seconds(),
		"backlog_records": isolationBacklog, "ratio_of_all_records_min": slices.Min(ofAll), "method": "side by side: two worlds (dev server, tabletd, worker each), drained at once, one failing"}, nil
}
