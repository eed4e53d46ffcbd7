package main

import (
	"fmt"
	"os"

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
