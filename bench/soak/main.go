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

// run starts tabletd under load with a consumer per tablet, samples
// tabletd's RSS while the workload writes, stops the workload, waits for
// the consumers to drain and checks what they hold and tabletd's memory.
// It writes the result, and fails when the check does.
func run() error {
	o := parseFlags()
	addr, err := testbed.FreeAddr()
	if err != nil {
		return err
	}
	cmd, err := startTabletd(o, addr)
	if err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	client, err := tabletd.Dial(addr, "commerce", tabletd.Options{})
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	list, err := waitForTablets(ctx, client)
	if err != nil {
		return err
	}
	if _, err := client.EnsureStream(ctx, source.StreamSpec{ID: "soak"}); err != nil {
		return err
	}

	// One consumer per tablet: read a batch, ack it, repeat.
	c := newConsumers(len(list))
	if err := c.start(ctx, client, list); err != nil {
		return err
	}

	res := o.newResult()
	began := time.Now()
	if err := c.sampleWhileWriting(o.duration, cmd.Process.Pid, began, &res); err != nil {
		return err
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	admin := sourcepb.NewAdminClient(conn)
	if err := stopWorkload(ctx, admin, began, &res); err != nil {
		return err
	}
	if err := c.drain(); err != nil {
		return err
	}
	if err := c.check(ctx, admin, cmd.Process.Pid, o.limit, &res); err != nil {
		return err
	}
	return report(res, o.out)
}

// options are the command's flags.
type options struct {
	bin       string
	tablets   int
	replicas  int
	rate      float64
	retention time.Duration
	duration  time.Duration
	limit     float64
	out       string
}

// parseFlags defines the command's flags and parses the command line.
func parseFlags() options {
	var o options
	flag.StringVar(&o.bin, "tabletd", "./bin/tabletd", "tabletd binary")
	flag.IntVar(&o.tablets, "tablets", 64, "tablets")
	flag.IntVar(&o.replicas, "replicas", 3, "replicas per tablet")
	flag.Float64Var(&o.rate, "rate", 20000, "workload records per second")
	flag.DurationVar(&o.retention, "retention", time.Minute, "tabletd --retention")
	flag.DurationVar(&o.duration, "duration", 10*time.Minute, "how long to write")
	flag.Float64Var(&o.limit, "limit-mib", 1024, "RSS limit in MiB")
	flag.StringVar(&o.out, "out", "", "write the result JSON here too")
	flag.Parse()
	return o
}

// newResult is the result with the run's setup, before anything is
// measured.
func (o options) newResult() result {
	return result{Date: time.Now().UTC().Format(time.RFC3339), Duration: o.duration.String(), Tablets: o.tablets,
		Replicas: o.replicas, Rate: o.rate, Retention: o.retention.String(), LimitMiB: o.limit}
}

// startTabletd starts tabletd listening on addr with the soak's tablets,
// replicas, write rate and retention, its log on our stderr; the caller
// kills it.
func startTabletd(o options, addr string) (*exec.Cmd, error) {
	cmd := exec.Command(o.bin, "serve", "--listen", addr, "--tablets", strconv.Itoa(o.tablets),
		"--replicas", strconv.Itoa(o.replicas), "--rate", fmt.Sprint(o.rate),
		"--retention", o.retention.String(), "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start tabletd: %w", err)
	}
	return cmd, nil
}

// waitForTablets lists tabletd's tablets, trying again for up to 10 s
// while it comes up.
func waitForTablets(ctx context.Context, client *tabletd.Client) ([]source.Tablet, error) {
	var list []source.Tablet
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if list, err = client.ListTablets(ctx); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("tabletd did not come up: %w", err)
	}
	return list, nil
}

// consumers read every tablet of the stream, one goroutine each (read a
// batch, ack it, repeat), into one digest of what they got, counting the
// records read twice. A consumer stops when its context ends, on an
// error (sent on errs: at most one per consumer, which errs has room
// for) or, once writing is false, when its tablet is drained.
type consumers struct {
	mu      sync.Mutex
	got     digest.Digest
	seen    map[string]uint64 // tablet → last index, to spot repeats
	dups    atomic.Uint64
	writing atomic.Bool // the workload still writes
	wg      sync.WaitGroup
	errs    chan error
}

// newConsumers returns the consumers of a stream of this many tablets.
func newConsumers(tablets int) *consumers {
	return &consumers{seen: map[string]uint64{}, errs: make(chan error, tablets)}
}

// start marks the workload as writing, then opens each tablet's first
// replica and starts its consumer. It returns the error of an open that
// fails (the consumers started by then stop when ctx ends).
func (c *consumers) start(ctx context.Context, client *tabletd.Client, list []source.Tablet) error {
	c.writing.Store(true)
	for _, t := range list {
		rd, err := client.OpenReplica(ctx, t.Replicas[0])
		if err != nil {
			return err
		}
		c.wg.Add(1)
		go c.consume(ctx, rd, t.ID)
	}
	return nil
}

// consume reads tablet from rd and acks what it read, until it stops
// (see consumers).
func (c *consumers) consume(ctx context.Context, rd source.ReplicaReader, tablet string) {
	defer c.wg.Done()
	var cp source.Checkpoint
	for {
		b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: "soak", Tablet: tablet, From: cp,
			MaxRecords: 1000, MaxWait: 500 * time.Millisecond})
		if err != nil {
			if ctx.Err() == nil {
				c.errs <- fmt.Errorf("tablet %s: %w", tablet, err)
			}
			return
		}
		c.add(tablet, b.Records)
		cp = b.Checkpoint
		if len(b.Records) > 0 {
			if err := rd.Ack(ctx, "soak", tablet, cp); err != nil && ctx.Err() == nil {
				c.errs <- fmt.Errorf("ack %s: %w", tablet, err)
				return
			}
		}
		if !c.writing.Load() && b.CaughtUp && len(b.Records) == 0 {
			return // drained
		}
	}
}

// add takes records read from tablet into the digest, counting those at
// or before the last index seen on the tablet as read twice.
func (c *consumers) add(tablet string, records []source.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range records {
		if r.Position.Index <= c.seen[tablet] {
			c.dups.Add(1)
		}
		c.seen[tablet] = r.Position.Index
		c.got.Add(digest.Hash(digest.Fields{Tablet: r.Tablet, Position: r.Position.String(), Table: r.Table,
			Op: string(r.Op), Key: r.Key, Before: r.Before, After: r.After, CommitTime: r.CommitTime}))
	}
}

// sampleWhileWriting lets the workload write for duration, sampling
// tabletd's RSS (process pid) every 2 s into res.MaxRSSMiB, then marks
// it as no longer writing: the consumers drain from there. A consumer's
// error or a failed sample ends it at once.
func (c *consumers) sampleWhileWriting(duration time.Duration, pid int, began time.Time, res *result) error {
	tick := time.NewTicker(2 * time.Second)
	for done := time.After(duration); c.writing.Load(); {
		select {
		case <-done:
			c.writing.Store(false)
		case err := <-c.errs:
			return err
		case <-tick.C:
			rss, _, err := testbed.Memory(pid)
			if err != nil {
				return err
			}
			res.MaxRSSMiB = max(res.MaxRSSMiB, rss)
			fmt.Fprintf(os.Stderr, "soak: %v rss %.0f MiB\n", time.Since(began).Round(time.Second), rss)
		}
	}
	tick.Stop()
	return nil
}

// stopWorkload stops tabletd's workload and records how many records it
// wrote, and at what rate since began.
func stopWorkload(ctx context.Context, admin sourcepb.AdminClient, began time.Time, res *result) error {
	w, err := admin.Workload(ctx, &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STOP})
	if err != nil {
		return err
	}
	res.Records = w.Records
	res.AchievedRate = float64(w.Records) / time.Since(began).Seconds()
	return nil
}

// drain waits up to 2 minutes for every consumer to drain its tablet; a
// consumer's error ends it at once.
func (c *consumers) drain() error {
	drained := make(chan struct{})
	go func() { c.wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case err := <-c.errs:
		return err
	case <-time.After(2 * time.Minute):
		return errors.New("consumers did not drain within 2m")
	}
	return nil
}

// check records tabletd's peak RSS (process pid) and what the drained
// consumers hold against what the stream is due (the digest), and
// whether the soak passed: the digests match, nothing was read twice and
// tabletd's memory stayed under limit MiB.
func (c *consumers) check(ctx context.Context, admin sourcepb.AdminClient, pid int, limit float64, res *result) error {
	_, hwm, err := testbed.Memory(pid)
	if err != nil {
		return err
	}
	res.PeakHWMMiB = hwm
	due, err := admin.Digest(ctx, &sourcepb.DigestRequest{Stream: "soak"})
	if err != nil {
		return err
	}
	res.DueRecords, res.ConsumerRecords, res.Duplicates = due.Records, c.got.Records, c.dups.Load()
	res.DigestMatches = due.Records == c.got.Records && due.Hash == c.got.Hash
	res.Pass = res.DigestMatches && res.Duplicates == 0 && res.PeakHWMMiB < limit && res.MaxRSSMiB < limit
	return nil
}

// report prints the result as JSON, writes it to out too if set, and
// fails when the soak did not pass.
func report(res result, out string) error {
	data, _ := json.MarshalIndent(res, "", "  ")
	fmt.Println(string(data))
	if out != "" {
		if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	if !res.Pass {
		return errors.New("soak failed (see the result)")
	}
	return nil
}
