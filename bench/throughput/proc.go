package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/testbed"
)

// dumpLogs prints the end of each child's log.
func (b *bench) dumpLogs() {
	for _, p := range b.procs.List() {
		fmt.Fprintf(os.Stderr, "--- %s (%s) ---\n%s\n", p.Name, p.Log(), p.Tail())
	}
}

// cpu is the CPU time used so far, in seconds: by each child process, by
// this program ("bench"), and by the host ("host_busy": all cores, steal
// included; and "host_iowait").
func (b *bench) cpu() procstat.Snapshot {
	out := b.procs.CPU()
	if h, err := procstat.ReadHostCPU(); err == nil {
		out["host_busy"] = procstat.Seconds(h.Busy() + h.Steal)
		out["host_iowait"] = procstat.Seconds(h.IOWait)
	}
	return out
}

// freePort is testbed.FreePort for this program: no port, no benchmark.
func freePort() int {
	p, err := testbed.FreePort()
	if err != nil {
		panic(err) // no loopback port: nothing here can run
	}
	return p
}

// profile asks the worker for its CPU profile over the next d (it serves
// Go's profiles beside its metrics) and writes it to path.
func (b *bench) profile(ctx context.Context, d time.Duration, path string) error {
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(b.metrics, "/metrics"), int(d.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("worker CPU profile: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("worker CPU profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("worker CPU profile: %w", err)
	}
	return f.Close()
}
