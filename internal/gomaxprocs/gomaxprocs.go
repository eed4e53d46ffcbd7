// Package gomaxprocs runs a lightly loaded worker on one P (the Go
// scheduler's processor) and a busy one on all of them.
//
// A live worker is idle most of the time and busy in short bursts: its
// tablets' reads come back together once a linger, each commit waits for a
// sync, each acknowledgement for an answer. With more than one P, every
// goroutine made runnable while a P is idle wakes a thread for it (and the
// scheduler a spinning one to look for more), and these threads go back to
// sleep a moment later. On a virtual machine a thread's sleep and wake
// costs far more CPU than a plain system call, many times the work it wakes
// for. On one P those hand-offs mostly stay on one thread. A busy worker (a
// bulk drain, thousands of tablets starting) needs every core, and is put
// back on all of them at once. make bench's live case (bench/throughput)
// measures the worker's CPU per record live and idle with this governor
// on; see docs/benchmarks.md.
package gomaxprocs

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The policy's bounds, in cores of CPU the process used over an interval.
const (
	// BusyLoad: at or above this, every P (a bulk drain is far above it:
	// make bench's bulk case measures the worker's CPU there).
	BusyLoad = 0.5
	// QuietLoad: below this for QuietIntervals intervals in a row, one P (a
	// live worker is far below it: make bench's live case, 16 tablets at
	// 2,000 records/s, measures its CPU; see docs/benchmarks.md).
	QuietLoad      = 0.15
	QuietIntervals = 2
	// Interval between looks at the process's CPU time. The looks end on
	// multiples of it on the clock, as the tablets' lingers and idle reads
	// do (activities' grids), so that a quiet worker wakes for them at
	// instants it wakes for anyway.
	Interval = 1500 * time.Millisecond
)

// next is the policy: the Ps to run on after an interval in which the
// process used load cores, from cur of max, and how many quiet intervals
// in a row there have been (quiet before it, counting this one after).
func next(cur, max int, load float64, quiet int) (procs, quietAfter int) {
	switch {
	case load >= BusyLoad:
		return max, 0
	case load < QuietLoad:
		quiet++
		if quiet >= QuietIntervals {
			return 1, quiet
		}
		return cur, quiet
	}
	return cur, 0
}

// Governor sets the process's GOMAXPROCS between 1 and what it was when
// the governor was made. Its zero value is not usable; use New.
type Governor struct {
	max int
	cur atomic.Int32

	// set, cpu and interval are the runtime's and Interval (tests
	// replace them).
	set      func(int) int
	cpu      func() time.Duration
	interval time.Duration

	mu    sync.Mutex
	quiet int
}

// New returns a governor over runtime.GOMAXPROCS(0) Ps, not yet running.
func New() *Governor {
	g := &Governor{max: runtime.GOMAXPROCS(0), set: runtime.GOMAXPROCS, cpu: processCPU, interval: Interval}
	g.cur.Store(int32(g.max))
	return g
}

// Procs is the number of Ps the governor runs the process on now.
func (g *Governor) Procs() int { return int(g.cur.Load()) }

// Busy puts the process back on every P at once: the caller found work
// that will keep it busy (a read that brought a full batch). It is cheap
// when already there; a nil governor does nothing.
func (g *Governor) Busy() {
	if g == nil || int(g.cur.Load()) == g.max {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.quiet = 0
	g.apply(g.max)
}

// Run looks at the process's CPU use every Interval and sets the Ps by
// the policy until ctx ends, then puts the process back on every P.
func (g *Governor) Run(ctx context.Context) {
	defer func() {
		g.mu.Lock()
		g.apply(g.max)
		g.mu.Unlock()
	}()
	lastCPU, lastAt := g.cpu(), time.Now()
	for {
		t := time.NewTimer(untilMultiple(time.Now(), g.interval))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		cpu, at := g.cpu(), time.Now()
		load := (cpu - lastCPU).Seconds() / at.Sub(lastAt).Seconds()
		lastCPU, lastAt = cpu, at
		g.mu.Lock()
		var procs int
		procs, g.quiet = next(g.Procs(), g.max, load, g.quiet)
		g.apply(procs)
		g.mu.Unlock()
	}
}

// apply sets n Ps if that is a change; g.mu is held.
func (g *Governor) apply(n int) {
	if int(g.cur.Load()) == n {
		return
	}
	g.set(n)
	g.cur.Store(int32(n))
}

// untilMultiple is how long it is from now to the next multiple of step
// on the clock, at least a tenth of step away.
func untilMultiple(now time.Time, step time.Duration) time.Duration {
	d := step - time.Duration(now.UnixNano()%int64(step))
	if d < step/10 {
		d += step
	}
	return d
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
