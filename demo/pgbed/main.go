// Command pgbed runs the PostgreSQL test bed (testbed/pgbed) for `make
// demo-postgres`: shards of a primary and standbys with a workload writing
// to every primary, until SIGINT or SIGTERM stops the workload and then the
// servers, and removes their directories.
//
// Once the servers stream it writes the worker's environment file (one
// KEY=DSN line per server, mode 0600: the DSNs hold the password) and the
// stream config, which names those variables and holds no DSN, then prints
// a line starting "ready". A directory left by an earlier run is removed
// first, with any server still running from it.
//
// `pgbed drop-slots --stream S --shard s1` drops the stream's slots of one
// shard on the bed's servers (see dropSlots).
package main

import (
	"bytes"
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
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

func main() {
	run := run
	if len(os.Args) > 1 && os.Args[1] == "drop-slots" {
		run = func() error { return dropSlots(os.Args[2:]) }
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgbed:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", ".data/pg", "the servers' directories (what an earlier run left there is removed)")
	shards := flag.Int("shards", 3, "shards, each a primary with standbys")
	standbys := flag.Int("standbys", 2, "standbys per shard (at most 25)")
	rate := flag.Float64("rate", 5, "workload transactions per second on each shard")
	envFile := flag.String("env", ".data/pg.env", "the worker's environment: KEY=DSN lines (mode 0600)")
	configFile := flag.String("config", ".data/pg-orders.json", "the stream config to write")
	out := flag.String("out", ".data/pg-out", "the stream's JSONL sink directory, for the config")
	flag.Parse()
	if *standbys > 25 {
		return fmt.Errorf("standbys: %d, want at most 25 (aliases end in a letter)", *standbys)
	}
	absOut, err := filepath.Abs(*out)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Never leave the DSNs of an earlier bed for a worker to pick up.
	if err := os.Remove(*envFile); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := clean(*dir); err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	c, err := pgbed.Start(startCtx, pgbed.Options{Dir: *dir, Shards: *shards, Standbys: *standbys})
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "pgbed: close:", err)
		}
		fmt.Println("servers stopped")
	}()
	defer os.Remove(*envFile)
	load := c.StartWorkload(pgbed.WorkloadOptions{Rate: *rate, KeepGoing: true})

	env, cfg, err := describe(c, absOut)
	if err != nil {
		_ = load.Stop()
		return err
	}
	if err := bedfiles.WriteFile(*envFile, []byte(env), 0o600); err != nil {
		_ = load.Stop()
		return err
	}
	if err := bedfiles.WriteFile(*configFile, cfg, 0o644); err != nil {
		_ = load.Stop()
		return err
	}
	fmt.Printf("ready: %d shards × (primary + %d standbys) under %s, workload %g transactions/s per shard; env %s, config %s\n",
		*shards, *standbys, c.Dir, *rate, *envFile, *configFile)

	<-ctx.Done()
	fmt.Println("stopping")
	_ = load.Stop()
	st := load.Stats()
	fmt.Printf("workload: %d transactions (%d inserts, %d updates, %d deletes), %d errors\n",
		st.Txs, st.Inserts, st.Updates, st.Deletes, st.Errors)
	return nil
}

// describe returns the environment file's lines and the stream config for
// the bed: shard sN's primary is zone1-sNp (PRIMARY), its standbys
// zone2-sNa, zone3-sNb, … (REPLICA). It prints each server's alias and
// address, without the password.
func describe(c *pgbed.Cluster, out string) (env string, cfg []byte, err error) {
	var lines strings.Builder
	var shards []postgres.Shard
	for i, s := range c.Shards {
		sh := postgres.Shard{ID: fmt.Sprintf("s%d", i+1)}
		for j, n := range s.Nodes() {
			role, typ, key := "p", "PRIMARY", "PRIMARY"
			if j > 0 {
				role, typ = string(rune('a'+j-1)), "REPLICA"
				key = "STANDBY_" + strings.ToUpper(role)
			}
			r := postgres.ShardReplica{
				Alias:  fmt.Sprintf("zone%d-%s%s", j+1, sh.ID, role),
				Cell:   fmt.Sprintf("zone%d", j+1),
				Type:   typ,
				DSNEnv: strings.ToUpper(sh.ID) + "_" + key + "_DSN",
			}
			sh.Replicas = append(sh.Replicas, r)
			fmt.Fprintf(&lines, "%s=%s\n", r.DSNEnv, n.DSN())
			fmt.Printf("%-12s %-10s 127.0.0.1:%d  %s\n", n.Name, r.Alias, n.Port, n.LogPath())
		}
		shards = append(shards, sh)
	}
	// Standbys first (the default type order), from any cell; the rest as
	// every demo stream has it.
	cfg, err = bedfiles.StreamConfig(map[string]any{
		"source": map[string]any{"kind": "postgres", "tables": pgbed.Tables, "shards": shards},
		"sink":   map[string]any{"kind": "jsonl", "path": out},
	})
	return lines.String(), cfg, err
}

// clean removes dir, a bed's directory from an earlier run, after stopping
// any server still running from it (its postmaster.pid names a live postgres
// on that data directory): a run killed before its cleanup.
func clean(dir string) error {
	pidFiles, err := filepath.Glob(filepath.Join(dir, "*", "data", "postmaster.pid"))
	if err != nil {
		return err
	}
	for _, f := range pidFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		first, _, _ := bytes.Cut(b, []byte("\n"))
		pid, err := strconv.Atoi(string(first))
		if err != nil || pid <= 0 {
			continue
		}
		data, err := filepath.Abs(filepath.Dir(f))
		if err != nil {
			return err
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte("\x00"+data+"\x00")) {
			continue // gone, or the pid is another process's now
		}
		fmt.Printf("stopping postgres (pid %d) left running on %s\n", pid, data)
		_ = syscall.Kill(pid, syscall.SIGINT) // fast shutdown
		deadline := time.Now().Add(30 * time.Second)
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return os.RemoveAll(dir)
}
