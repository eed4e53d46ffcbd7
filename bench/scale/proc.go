package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/testbed"
)

// bench is the run's world: child processes and clients.
type bench struct {
	bin, dir string

	mu    sync.Mutex
	procs []*proc

	temporal client.Client
	tdAddr   string
	conn     *grpc.ClientConn
	admin    sourcepb.AdminClient
	topo     sourcepb.TopologyClient
	tabletd  *proc
	worker   *proc
	began    time.Time // when the StreamWorkflow was started
}

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
	return b.add(name, tp), nil
}

func (b *bench) add(name string, tp *testbed.Proc) *proc {
	p := &proc{Proc: tp, name: name}
	b.mu.Lock()
	b.procs = append(b.procs, p)
	b.mu.Unlock()
	return p
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
			return fmt.Errorf("%s exited: %v\n%s", what, err, p.Tail())
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
// process ("temporal" is the dev server), by this program ("bench"), and
// by the host ("host_busy": all cores, all processes, steal apart).
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
		for i, v := range strings.Fields(line)[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			switch {
			case i == 7:
				out["host_steal"] = x / clockTick
			case i < 7 && i != 3 && i != 4: // not idle, not iowait
				total += x
			}
		}
		out["host_busy"] = total / clockTick
	}
	// Pressure stall: how long some task waited for a CPU (or for I/O),
	// in seconds: the host is shared, and this says how much.
	for _, r := range []string{"cpu", "io"} {
		data, err := os.ReadFile("/proc/pressure/" + r)
		if err != nil {
			continue
		}
		line, _, _ := strings.Cut(string(data), "\n")
		if _, tot, ok := strings.Cut(line, "total="); ok && strings.HasPrefix(line, "some") {
			us, _ := strconv.ParseFloat(strings.TrimSpace(tot), 64)
			out["host_"+r+"_pressure_stall"] = us / 1e6
		}
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

// scanLog groups a process's log lines at warn level and above (zap's
// JSON "level", the dev server's "level", or a plain line mentioning an
// error or a limit) by message, most frequent first, at most 15.
func scanLog(path string) []logLine {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	byMsg := map[string]*logLine{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		var rec map[string]any
		msg := ""
		if json.Unmarshal([]byte(line), &rec) == nil {
			lvl, _ := rec["level"].(string)
			if lvl == "info" || lvl == "debug" {
				continue
			}
			msg, _ = rec["msg"].(string)
			if e, ok := rec["error"].(string); ok {
				msg += ": " + clip(e, 160)
			}
		} else if m := logfmtMsg.FindStringSubmatch(line); m != nil {
			// The dev server: time=… level=WARN msg="…" key=value …
			if strings.Contains(line, "level=INFO") || strings.Contains(line, "level=DEBUG") {
				continue
			}
			msg = m[1]
			for _, k := range logfmtKeys {
				if v := k.FindStringSubmatch(line); v != nil {
					msg += " " + v[0]
				}
			}
		} else {
			l := strings.ToLower(line)
			if !strings.Contains(l, "error") && !strings.Contains(l, "limit") && !strings.Contains(l, "warn") && !strings.Contains(l, "panic") {
				continue
			}
			msg = line
		}
		msg = clip(msg, 300)
		if e := byMsg[msg]; e != nil {
			e.Count++
			continue
		}
		byMsg[msg] = &logLine{Count: 1, Msg: msg, First: clip(line, 800)}
	}
	out := make([]logLine, 0, len(byMsg))
	for _, e := range byMsg {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b logLine) int { return cmp.Or(b.Count-a.Count, strings.Compare(a.Msg, b.Msg)) })
	if len(out) > 15 {
		out = out[:15]
	}
	return out
}

var (
	logfmtMsg  = regexp.MustCompile(`\blevel=\w+\b.*?\bmsg="((?:[^"\\]|\\.)*)"`)
	logfmtKeys = []*regexp.Regexp{
		regexp.MustCompile(`\bqueue-task-type=\S+`), regexp.MustCompile(`\bmethod=\S+`),
		regexp.MustCompile(`\bblob-size-violation-operation=\S+`), regexp.MustCompile(`\berror="(?:[^"\\]|\\.){0,120}`),
	}
)

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

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
