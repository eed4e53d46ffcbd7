// Package procs runs a benchmark's child processes (the dev server,
// tabletd, workers) as one group: started by name from a directory of
// binaries with their logs in the run's directory, waited on until they
// answer, stopped together, and measured together.
package procs

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/testbed"
)

// ErrExited is what WaitFor's error wraps when the process ended before
// it was ready.
var ErrExited = errors.New("exited")

// Proc is a named child process (testbed.Proc: own process group, log
// file under the run's directory).
type Proc struct {
	*testbed.Proc
	Name string
}

// Group is a run's child processes. Bin is the directory of the binaries,
// Dir the run's directory, where each child logs to <name>.log. Its
// methods may be called from several goroutines.
type Group struct {
	Bin, Dir string

	mu    sync.Mutex
	procs []*Proc
}

// Start runs Bin/<name> with args, its output to Dir/<name>.log, and adds
// it to the group.
func (g *Group) Start(name string, args ...string) (*Proc, error) {
	tp, err := testbed.Start(filepath.Join(g.Dir, name+".log"), filepath.Join(g.Bin, name), args...)
	if err != nil {
		return nil, err
	}
	return g.Add(name, tp), nil
}

// Add adds a process started elsewhere (testbed.StartDevServer) under
// name.
func (g *Group) Add(name string, tp *testbed.Proc) *Proc {
	p := &Proc{Proc: tp, Name: name}
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
	return p
}

// List returns the children, in the order they were added.
func (g *Group) List() []*Proc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.procs)
}

// StopAll stops every child, the last started first.
func (g *Group) StopAll() {
	for _, p := range slices.Backward(g.List()) {
		p.Stop()
	}
}

// CPU returns the CPU seconds each child has used so far, by its name,
// and this program's as "bench". A child whose /proc entry cannot be read
// (it has ended) is left out.
func (g *Group) CPU() procstat.Snapshot {
	out := procstat.Snapshot{}
	for _, p := range g.List() {
		if s, err := procstat.ProcessCPU(p.Pid()); err == nil {
			out[p.Name] = s
		}
	}
	if s, err := procstat.SelfCPU(); err == nil {
		out["bench"] = s
	}
	return out
}

// Usage is CPU plus, under name, the CPU seconds of the process pid (left
// out when pid is 0 or its /proc entry cannot be read: a server the
// benchmark reads, not its own child), and the host's as "host_busy"
// (all cores, steal included).
func (g *Group) Usage(name string, pid int) procstat.Snapshot {
	out := g.CPU()
	if pid != 0 {
		if s, err := procstat.ProcessCPU(pid); err == nil {
			out[name] = s
		}
	}
	if h, err := procstat.ReadHostCPU(); err == nil {
		out["host_busy"] = procstat.Seconds(h.Busy() + h.Steal)
	}
	return out
}

// DumpLogs writes the end of each child's log to w, for a run that failed.
func (g *Group) DumpLogs(w io.Writer) {
	for _, p := range g.List() {
		fmt.Fprintf(w, "--- %s (%s) ---\n%s\n", p.Name, p.Log(), p.Tail())
	}
}

// WaitFor polls ready every 200 ms until it succeeds, p exits (an error
// wrapping ErrExited), within passes, or ctx is done.
func WaitFor(ctx context.Context, p *Proc, what string, within time.Duration, ready func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s %w: %v", what, ErrExited, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v: %v", what, within, err)
		}
		if err := Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// Sleep waits for d, or returns ctx's error when ctx is done first: the
// pause of WaitFor's polls and of the benchmarks' own.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// StringList is a repeatable string flag (flag.Var).
type StringList []string

func (s *StringList) String() string     { return strings.Join(*s, ",") }
func (s *StringList) Set(v string) error { *s = append(*s, v); return nil }

// DevServerFlags registers the dev server flags every benchmark shares —
// --dynamic-config-value (repeatable), --sqlite-defaults and
// --no-eager-activities — and returns the server's extra arguments (to
// call after flag.Parse).
//
// The benchmarks turn on the server's eager activity execution
// (eagerActivities) unless --no-eager-activities: the Go SDK asks for it
// by default for an activity on the worker's own task queue, and the
// server then hands a tablet workflow's GetChanges back in the response
// to the workflow task that scheduled it, instead of through matching
// and the worker's activity poll. bench/scale (make bench's scale case)
// measures what that saves while tablets start, the dev server's CPU and
// the time until every tablet was read from; --no-eager-activities runs it
// without, to compare (see docs/benchmarks.md). It is the server's dynamic
// config system.enableActivityEagerExecution, off by default; the
// production notes (docs/production.md) recommend it.
//
// The benchmarks run the dev server's SQLite in WAL mode with
// synchronous=NORMAL (testbed.SQLiteWAL) unless --sqlite-defaults: a commit then
// waits for no fsync of its own, and a crash of the server process loses
// nothing (only a crash of the machine can lose the last commits). With
// the dev server's own settings every persistence write waits for an
// fsync and the single database serialises them all, so starting tablet
// workflows would measure the dev server's disk rather than tabletflow
// (--sqlite-defaults runs it so, to measure the difference). A production
// Temporal server (PostgreSQL, MySQL, Cassandra) commits in groups.
func DevServerFlags() func() []string {
	var dynamic StringList
	flag.Var(&dynamic, "dynamic-config-value", "pass to the dev server (KEY=JSON), repeatable; none by default")
	defaults := flag.Bool("sqlite-defaults", false, "run the dev server's SQLite with its own settings (rollback journal, a sync per commit) instead of WAL mode with synchronous=NORMAL")
	noEager := flag.Bool("no-eager-activities", false, "leave the server's eager activity execution off (its default) instead of on")
	return func() []string {
		var out []string
		if !*defaults {
			out = append(out, testbed.SQLiteWAL...)
		}
		if !*noEager {
			out = append(out, eagerActivities...)
		}
		for _, v := range dynamic {
			out = append(out, "--dynamic-config-value", v)
		}
		return out
	}
}

// eagerActivities is the dev server argument that turns on eager activity
// execution (see DevServerFlags).
var eagerActivities = []string{"--dynamic-config-value", "system.enableActivityEagerExecution=true"}

// TabletCounts parses a comma-separated list of tablet counts given as
// the flag named flag.
func TabletCounts(flag, value string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(value, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--%s: %q is not a tablet count", flag, f)
		}
		out = append(out, n)
	}
	return out, nil
}
