package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/tabletd"
)

// benchBatch is the batch size the goal is stated for.
const benchBatch = 1000

// BenchmarkGetChanges measures GetChanges from one replica: over loopback
// gRPC through the source adapter, against the same handler called in
// process (the baseline: no wire, no encoding). The goal is >= 200k
// records/s over loopback. With BENCH_RESULTS=dir it writes
// dir/getchanges.json with both figures and their ratio.
func BenchmarkGetChanges(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Listen, cfg.Rate, cfg.Tablets, cfg.Lag, cfg.Seed = "127.0.0.1:0", 0, 4, 0, 1
	c, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const preload = 200_000
	if err := c.WriteTo("t-0001", preload); err != nil {
		b.Fatal(err)
	}
	if _, err := c.createStream(&sourcepb.CreateStreamRequest{Stream: "bench"}); err != nil {
		b.Fatal(err)
	}
	primary := c.tablets["t-0001"].replicas[0].server

	results := map[string]float64{}
	// run reads batches in a loop, wrapping to the start at the end of the
	// preloaded log, and reports records/s.
	run := func(name string, get func(ctx context.Context, from source.Checkpoint) (int, source.Checkpoint, error)) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			var from source.Checkpoint
			records := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				n, cp, err := get(ctx, from)
				if err != nil {
					b.Fatal(err)
				}
				records += n
				from = cp
				if cp.Index >= preload {
					from = source.Checkpoint{}
				}
			}
			rate := float64(records) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "records/s")
			results[name] = rate
		})
	}

	direct := &tabletService{ts: primary}
	run("in-process", func(ctx context.Context, from source.Checkpoint) (int, source.Checkpoint, error) {
		resp, err := direct.GetChanges(ctx, &sourcepb.GetChangesRequest{
			Stream: "bench", Tablet: "t-0001", FromCheckpoint: from.String(), MaxRecords: benchBatch})
		if err != nil {
			return 0, from, err
		}
		cp, err := source.ParseCheckpoint(resp.Checkpoint)
		return len(resp.Records), cp, err
	})

	client, err := tabletd.Dial(c.Addr(), cfg.Keyspace, tabletd.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	tablets, err := client.ListTablets(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	rd, err := client.OpenReplica(context.Background(), tablets[0].Replicas[0])
	if err != nil {
		b.Fatal(err)
	}
	run("grpc-loopback", func(ctx context.Context, from source.Checkpoint) (int, source.Checkpoint, error) {
		batch, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: "bench", Tablet: "t-0001", From: from, MaxRecords: benchBatch})
		return len(batch.Records), batch.Checkpoint, err
	})

	if dir := os.Getenv("BENCH_RESULTS"); dir != "" && results["in-process"] > 0 {
		out := map[string]any{
			"benchmark":                "GetChanges from one replica, 1000-record batches",
			"date":                     time.Now().UTC().Format(time.RFC3339),
			"grpc_records_per_s":       int(results["grpc-loopback"]),
			"in_process_records_per_s": int(results["in-process"]),
			"ratio_grpc_to_in_process": fmt.Sprintf("%.2f", results["grpc-loopback"]/results["in-process"]),
			"goal_records_per_s":       200000,
			"meets_goal":               results["grpc-loopback"] >= 200000,
		}
		data, _ := json.MarshalIndent(out, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, "getchanges.json"), append(data, '\n'), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
