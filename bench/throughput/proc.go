package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tabletflow/tabletflow/testbed"
)

// proc is a named child process (testbed.Proc: own process group, log
// file under the run's directory).
type proc struct {
	*testbed.Proc
	name string
}

func (b *bench) start(name string, args ...string) (*proc, error) {
	tp, err := testbed.Start(filepath.Join(b.dir, name+".log"), filepath.Join(b.bin, name), args...)
	if err != nil {
		return nil, err
	}
	p := &proc{Proc: tp, name: name}
	b.mu.Lock()
	b.procs = append(b.procs, p)
	b.mu.Unlock()
	return p, nil
}

// stopAll stops every child, the last started first.
func (b *bench) stopAll() {
	b.mu.Lock()
	procs := slices.Clone(b.procs)
	b.mu.Unlock()
	for _, p := range slices.Backward(procs) {
		p.Stop()
	}
}

// dumpLogs prints the end of each child's log.
func (b *bench) dumpLogs() {
	for _, p := range b.procs {
		fmt.Fprintf(os.Stderr, "--- %s (%s) ---\n%s\n", p.name, p.Log(), p.Tail())
	}
}

// waitFor polls ready until it succeeds, the process exits, or within
// passes.
func waitFor(ctx context.Context, p *proc, what string, within time.Duration, ready func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s exited: %v", what, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v: %v", what, within, err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// cpuSnapshot is the CPU time used so far, in seconds: by each child
// process, by this program ("bench"), and by the host ("host_busy", all
// cores, and "host_iowait").
type cpuSnapshot map[string]float64

// clockTick is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const clockTick = 100

func (b *bench) cpu() cpuSnapshot {
	out := cpuSnapshot{}
	b.mu.Lock()
	for _, p := range b.procs {
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid())); err == nil {
			// Fields after the command name, which ends with the last ')':
			// state is the first, utime the 12th, stime the 13th.
			f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseFloat(f[11], 64)
				s, _ := strconv.ParseFloat(f[12], 64)
				out[p.name] = (u + s) / clockTick
			}
		}
	}
	b.mu.Unlock()
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out["bench"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		// cpu  user nice system idle iowait irq softirq steal ...
		line, _, _ := strings.Cut(string(data), "\n")
		var total float64
		f := strings.Fields(line)
		for i, v := range f[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			if i < 8 { // guest time is counted in user already
				total += x
			}
			switch i {
			case 3:
				total -= x // idle
			case 4:
				total -= x
				out["host_iowait"] = x / clockTick
			}
		}
		out["host_busy"] = total / clockTick
	}
	return out
}

// minus returns the CPU seconds used since prev, rounded to 10 ms.
func (s cpuSnapshot) minus(prev cpuSnapshot) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		out[k] = math.Round((v-prev[k])*100) / 100
	}
	return out
}

// loadAvg is the host's 1-minute load average (0 if unknown): the machine
// may be shared, and the numbers mean less when it is busy.
func loadAvg() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(data))[0], 64)
	return f
}

// freePort is testbed.FreePort for this program: no port, no benchmark.
func freePort() int {
	p, err := testbed.FreePort()
	if err != nil {
		panic(err) // no loopback port: nothing here can run
	}
	return p
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
