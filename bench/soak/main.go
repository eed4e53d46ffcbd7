// Command soak runs tabletd under sustained load for a long time and checks
// that its memory stays bounded: 64 tablets × 3 replicas at 20k records/s
// with a 1-minute retention, a consumer reading and acking every tablet.
// At the end it stops the workload, drains every tablet, and checks that
// the consumer holds exactly what the stream is due (digest). It is a
// program, not a testing.B, so that `go test`'s timeout cannot cut it.
//
//	go run ./bench/soak --tabletd ./bin/tabletd --duration 10m --out bench/results/soak.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/testbed"
)

type result struct {
	Date            string  `json:"date"`
	Duration        string  `json:"duration"`
	Tablets         int     `json:"tablets"`
	Replicas        int     `json:"replicas"`
	Rate            float64 `json:"rateRecordsPerSecond"`
	Retention       string  `json:"retention"`
	Records         uint64  `json:"records"`
	AchievedRate    float64 `json:"achievedRecordsPerSecond"`
	MaxRSSMiB       float64 `json:"maxRssMiB"`
	PeakHWMMiB      float64 `json:"peakHwmMiB"`
	LimitMiB        float64 `json:"limitMiB"`
	DigestMatches   bool    `json:"digestMatches"`
	Duplicates      uint64  `json:"duplicates"`
	ConsumerRecords uint64  `json:"consumerRecords"`
	DueRecords      uint64  `json:"dueRecords"`
	Pass            bool    `json:"pass"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("tabletd", "./bin/tabletd", "tabletd binary")
	tablets := flag.Int("tablets", 64, "tablets")
	replicas := flag.Int("replicas", 3, "replicas per tablet")
	rate := flag.Float64("rate", 20000, "workload records per second")
	retention := flag.Duration("retention", time.Minute, "tabletd --retention")
	duration := flag.Duration("duration", 10*time.Minute, "how long to write")
	limit := flag.Float64("limit-mib", 1024, "RSS limit in MiB")
	out := flag.String("out", "", "write the result JSON here too")
	flag.Parse()

	addr, err := testbed.FreeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(*bin, "serve", "--listen", addr, "--tablets", strconv.Itoa(*tablets),
		"--replicas", strconv.Itoa(*replicas), "--rate", fmt.Sprint(*rate),
		"--retention", retention.String(), "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start tabletd: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	client, err := tabletd.Dial(addr, "commerce", tabletd.Options{})
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var list []source.Tablet
	for deadline := time.Now().Add(10 * time.Second); ; {
		if list, err = client.ListTablets(ctx); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("tabletd did not come up: %w", err)
	}
	if _, err := client.EnsureStream(ctx, source.StreamSpec{ID: "soak"}); err != nil {
		return err
	}

	// One consumer per tablet: read a batch, ack it, repeat.
	var (
		mu      sync.Mutex
		got     digest.Digest
		seen    = map[string]uint64{} // tablet → last index, to spot repeats
		dups    atomic.Uint64
		writing atomic.Bool
		wg      sync.WaitGroup
		errs    = make(chan error, len(list))
	)
	writing.Store(true)
	for _, t := range list {
		rd, err := client.OpenReplica(ctx, t.Replicas[0])
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cp source.Checkpoint
			for {
				b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: "soak", Tablet: t.ID, From: cp,
					MaxRecords: 1000, MaxWait: 500 * time.Millisecond})
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("tablet %s: %w", t.ID, err)
					}
					return
				}
				mu.Lock()
				for _, r := range b.Records {
					if r.Position.Index <= seen[t.ID] {
						dups.Add(1)
					}
					seen[t.ID] = r.Position.Index
					got.Add(digest.Hash(digest.Fields{Tablet: r.Tablet, Position: r.Position.String(), Table: r.Table,
						Op: string(r.Op), Key: r.Key, Before: r.Before, After: r.After, CommitTime: r.CommitTime}))
				}
				mu.Unlock()
				cp = b.Checkpoint
				if len(b.Records) > 0 {
					if err := rd.Ack(ctx, "soak", t.ID, cp); err != nil && ctx.Err() == nil {
						errs <- fmt.Errorf("ack %s: %w", t.ID, err)
						return
					}
				}
				if !writing.Load() && b.CaughtUp && len(b.Records) == 0 {
					return // drained
				}
			}
		}()
	}

	res := result{Date: time.Now().UTC().Format(time.RFC3339), Duration: duration.String(), Tablets: *tablets,
		Replicas: *replicas, Rate: *rate, Retention: retention.String(), LimitMiB: *limit}
	began := time.Now()
	tick := time.NewTicker(2 * time.Second)
	for done := time.After(*duration); writing.Load(); {
		select {
		case <-done:
			writing.Store(false)
		case err := <-errs:
			return err
		case <-tick.C:
			rss, _, err := testbed.Memory(cmd.Process.Pid)
			if err != nil {
				return err
			}
			res.MaxRSSMiB = max(res.MaxRSSMiB, rss)
			fmt.Fprintf(os.Stderr, "soak: %v rss %.0f MiB\n", time.Since(began).Round(time.Second), rss)
		}
	}
	tick.Stop()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	admin := sourcepb.NewAdminClient(conn)
	w, err := admin.Workload(ctx, &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STOP})
	if err != nil {
		return err
	}
	res.Records = w.Records
	res.AchievedRate = float64(w.Records) / time.Since(began).Seconds()
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case err := <-errs:
		return err
	case <-time.After(2 * time.Minute):
		return errors.New("consumers did not drain within 2m")
	}
	_, hwm, err := testbed.Memory(cmd.Process.Pid)
	if err != nil {
		return err
	}
	res.PeakHWMMiB = hwm
	due, err := admin.Digest(ctx, &sourcepb.DigestRequest{Stream: "soak"})
	if err != nil {
		return err
	}
	res.DueRecords, res.ConsumerRecords, res.Duplicates = due.Records, got.Records, dups.Load()
	res.DigestMatches = due.Records == got.Records && due.Hash == got.Hash
	res.Pass = res.DigestMatches && res.Duplicates == 0 && res.PeakHWMMiB < *limit && res.MaxRSSMiB < *limit

	data, _ := json.MarshalIndent(res, "", "  ")
	fmt.Println(string(data))
	if *out != "" {
		if err := os.WriteFile(*out, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	if !res.Pass {
		return errors.New("soak failed (see the result)")
	}
	return nil
}
