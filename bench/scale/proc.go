package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"

	"github.com/tabletflow/tabletflow/bench/internal/procs"
	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

// bench is the run's world: child processes and clients.
type bench struct {
	procs procs.Group

	temporal client.Client
	tdAddr   string
	conn     *grpc.ClientConn
	admin    sourcepb.AdminClient
	topo     sourcepb.TopologyClient
	tabletd  *procs.Proc
	worker   *procs.Proc
	began    time.Time // when the StreamWorkflow was started
}

// waitFor is procs.WaitFor with the end of the process's log in the error
// when it exited: a run that fails removes its directory, logs and all.
func waitFor(ctx context.Context, p *procs.Proc, what string, within time.Duration, ready func() error) error {
	err := procs.WaitFor(ctx, p, what, within, ready)
	if errors.Is(err, procs.ErrExited) {
		return fmt.Errorf("%w\n%s", err, p.Tail())
	}
	return err
}

// cpu is the CPU time used so far, in seconds: by each child process
// ("temporal" is the dev server), by this program ("bench"), and by the
// host ("host_busy": all cores, all processes, steal apart in
// "host_steal"; how long some task waited for a CPU or for I/O, in
// "host_cpu_pressure_stall" and "host_io_pressure_stall": the host is
// shared, and this says how much).
func (b *bench) cpu() procstat.Snapshot {
	out := b.procs.CPU()
	if h, err := procstat.ReadHostCPU(); err == nil {
		out["host_busy"] = procstat.Seconds(h.Busy())
		out["host_steal"] = procstat.Seconds(h.Steal)
	}
	for _, r := range []string{"cpu", "io"} {
		if s, err := procstat.PressureStall(r); err == nil {
			out["host_"+r+"_pressure_stall"] = s
		}
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
