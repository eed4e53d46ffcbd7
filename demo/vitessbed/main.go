// Command vitessbed runs the Vitess test bed (testbed/vitessbed) for `make
// demo-vitess`: etcd, vtctld, the keyspace commerce in two shards (-80,
// 80-), each a primary in zone1 and a replica in each of zone2 and zone3,
// vtgate, and a workload writing through vtgate, until SIGINT or SIGTERM
// stops the workload and then every server, and removes the bed's
// directory.
//
// Once vtgate serves it writes the stream config (the bed's vtctld address,
// the keyspace and its tables, a JSONL sink), prints each server's address
// and log, opens its control socket and prints a line starting "ready". A
// directory left by an earlier run is removed first, with any server still
// running from it.
//
//	vitessbed [--dir .data/vt] [--rate 5] [--config F] [--out D] [--socket S]
//	vitessbed ctl [--socket S] tablets|stop-replication|start-replication|kill|restart [ALIAS]
//
// ctl asks the running bed, over its control socket, to list its tablets
// or to act on one: stop or start a replica's replication (STOP SLAVE,
// START SLAVE), kill a vttablet as a crash would (its MariaDB runs on), or
// start a killed one again.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/tabletflow/tabletflow/adapters" // the kinds config.Decode checks
	"github.com/tabletflow/tabletflow/demo/internal/bedfiles"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "ctl" {
		err = ctl(os.Args[2:])
	} else {
		err = run(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vitessbed:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("vitessbed", flag.ContinueOnError)
	dir := fs.String("dir", ".data/vt", "the bed's directory (what an earlier run left there is removed)")
	rate := fs.Float64("rate", 5, "workload transactions per second through vtgate")
	configFile := fs.String("config", ".data/vt-commerce.json", "the stream config to write")
	out := fs.String("out", ".data/vt-out", "the stream's JSONL sink directory, for the config")
	socket := fs.String("socket", defaultSocket, "the control socket, for vitessbed ctl")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (vitessbed ctl ... controls a running bed)", fs.Arg(0))
	}
	absDir, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	absOut, err := filepath.Abs(*out)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Never leave the config of an earlier bed, with its vtctld's address,
	// for a stream to start with.
	if err := os.Remove(*configFile); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := clean(absDir); err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	c, err := vitessbed.Start(startCtx, vitessbed.Options{Dir: absDir, Log: func(format string, args ...any) {
		fmt.Printf(format+"\n", args...)
	}})
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("stopping the servers")
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "vitessbed: stop:", err)
		}
		if err := os.RemoveAll(absDir); err != nil {
			fmt.Fprintln(os.Stderr, "vitessbed:", err)
		}
		fmt.Println("servers stopped")
	}()
	load := c.StartWorkload(vitessbed.WorkloadOptions{Rate: *rate, Seed: uint64(time.Now().UnixNano()), KeepGoing: true})
	defer func() {
		_ = load.Stop()
		st := load.Stats()
		fmt.Printf("workload: %d transactions (%d inserts, %d updates, %d deletes), %d errors\n",
			st.Txs, st.Inserts, st.Updates, st.Deletes, st.Errors)
	}()

	cfg, err := streamConfig(c, absOut)
	if err != nil {
		return err
	}
	if err := bedfiles.WriteFile(*configFile, cfg, 0o644); err != nil {
		return err
	}
	ctlDone, err := serveCtl(ctx, c, *socket)
	if err != nil {
		return err
	}
	describe(c)
	fmt.Printf("ready: keyspace %s, shards %s, a primary in %s and a replica in each of %s; workload %g transactions/s; config %s, control socket %s\n",
		vitessbed.Keyspace, strings.Join(vitessbed.Shards, " "), vitessbed.PrimaryCell, strings.Join(vitessbed.Cells[1:], " "),
		*rate, *configFile, *socket)

	<-ctx.Done()
	fmt.Println("stopping")
	<-ctlDone
	return nil
}

// describe prints where every server listens and logs.
func describe(c *vitessbed.Cluster) {
	a := c.Addresses()
	fmt.Printf("etcd         %s  %s\n", a.Etcd, filepath.Join(c.Dir, "etcd.log"))
	fmt.Printf("vtctld       %s (gRPC), http://%s  %s\n", a.Vtctld, a.VtctldHTTP, filepath.Join(c.Dir, "vtctld.log"))
	fmt.Printf("vtgate       %s (MySQL, keyspace %s), http://%s  %s\n", a.VtgateMySQL, vitessbed.Keyspace, a.VtgateHTTP,
		filepath.Join(c.Dir, "vtgate.log"))
	for _, t := range c.Tablets() {
		fmt.Printf("%s %-3s %-7s %s, http://%s  MariaDB %s  %s\n", t.Alias, t.Shard, t.Type, t.GRPC, t.HTTP, t.MySQLSocket, t.VttabletLog())
	}
}

// streamConfig is the stream's config: every table of the keyspace from
// the bed's vtctld, into JSONL files in out. Each shard reads its zone2
// replica while it can (cells), then the zone3 one (REPLICA before
// PRIMARY). maxLag is long: a replica whose replication the operator
// stopped must stay eligible for a while, to be picked and answer GTIDSet
// Mismatch. The rest as every demo stream has it (bedfiles).
func streamConfig(c *vitessbed.Cluster, out string) ([]byte, error) {
	return bedfiles.StreamConfig(map[string]any{
		"source": map[string]any{"kind": "vitess", "vtctld": c.Addresses().Vtctld, "keyspace": vitessbed.Keyspace,
			"tables": vitessbed.Tables},
		"startFrom": "latest",
		"sink":      map[string]any{"kind": "jsonl", "path": out},
		"selection": map[string]any{"cells": []string{"zone2"}, "maxLag": "10m"},
	})
}

// clean removes dir, a bed's directory from an earlier run, after ending
// every process still running from it (a run killed before its cleanup):
// each server names a path under dir on its command line (etcd's data,
// a pid file, a MariaDB's my.cnf). SIGTERM first, so MariaDB and
// mysqld_safe shut down rather than restart; SIGKILL after 30 s.
func clean(dir string) error {
	left := procsUnder(dir)
	for _, pid := range left {
		fmt.Printf("stopping process %d left running from %s\n", pid, dir)
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		left = procsUnder(dir)
	}
	for _, pid := range left {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return os.RemoveAll(dir)
}

// procsUnder are the live processes, other than this one, with an
// argument naming a path under dir.
func procsUnder(dir string) []int {
	prefix := []byte(dir + "/")
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), string(prefix)) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			s := string(stat)
			if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && f[0] == "Z" {
				continue // a zombie: gone, its parent has not reaped it
			}
		}
		out = append(out, pid)
	}
	return out
}
