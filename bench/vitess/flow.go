package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/tabletflow/tabletflow/bench/internal/pass"
	"github.com/tabletflow/tabletflow/bench/internal/procs"
	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/vitess"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// sourceConfig is the stream's source section: the bed's keyspace, its
// tables.
func (b *bench) sourceConfig() vitess.Config {
	return vitess.Config{Kind: "vitess", VTCtld: b.bed.Addresses().Vtctld, Keyspace: vitessbed.Keyspace, Tables: vitessbed.Tables}
}

// startCheckpoint is the checkpoint at the backlog's start, as the
// adapter writes one: the GTID position whole, its count as the term.
func startCheckpoint(w written) (source.Checkpoint, error) {
	term, err := gtidCount(w.from)
	return source.Checkpoint{Term: term, Opaque: w.from}, err
}

// seed commits the backlog's start into the shard's manifest of a new
// JSONL directory, as a stream that had read up to there would have: the
// tablet resumes from the sink's checkpoint.
func seed(ctx context.Context, dir, stream string, cp source.Checkpoint) error {
	snk, err := jsonl.New(dir, stream)
	if err != nil {
		return err
	}
	defer snk.Close()
	w, err := snk.Open(ctx, shardID)
	if err != nil {
		return err
	}
	if err := w.Commit(ctx, cp); err != nil {
		w.Close()
		return fmt.Errorf("seed %s at %s: %w", dir, cp, err)
	}
	return w.Close()
}

// flow reads the backlog with a StreamWorkflow stream into dir and times
// it until the shard's manifest there holds lastTerm; then it stops the
// stream and waits for it to end. profile: take the worker's CPU profile
// over the pass (with --cpu-profile).
func (b *bench) flow(ctx context.Context, stream, dir string, w written, lastTerm uint64, profile bool) (side, error) {
	start, err := startCheckpoint(w)
	if err != nil {
		return side{}, err
	}
	if err := seed(ctx, dir, stream, start); err != nil {
		return side{}, err
	}
	_, seeded := manifestCheckpoint(dir, shardID)
	cfg, err := b.streamConfig(dir)
	if err != nil {
		return side{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	b.flushDirty()
	var profiled []chan error
	if profile && b.cpuProfile != "" {
		done := make(chan error, 1)
		profiled = append(profiled, done)
		go func() { done <- b.profile(ctx, "profile?seconds=10", b.cpuProfile) }()
	}
	if profile && b.trace != "" {
		done := make(chan error, 1)
		profiled = append(profiled, done)
		go func() {
			if err := procs.Sleep(ctx, time.Second); err != nil {
				done <- err
				return
			}
			done <- b.profile(ctx, "trace?seconds=2", b.trace)
		}()
	}
	cpu0 := b.cpu()
	began := time.Now()
	run, err := b.temporal.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: stream, TaskQueue: taskQueue},
		workflows.StreamWorkflow, json.RawMessage(cfg), (*workflows.StreamState)(nil))
	if err != nil {
		return side{}, fmt.Errorf("start the stream: %w", err)
	}
	ended := make(chan error, 1)
	go func() { ended <- run.Get(ctx, nil) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var first time.Duration
	var firstTerm uint64
	var took time.Duration
	var seq uint64
	for logged := time.Now(); took == 0; {
		select {
		case <-ctx.Done():
			return side{}, fmt.Errorf("not caught up: %w", ctx.Err())
		case err := <-ended:
			return side{}, fmt.Errorf("the stream workflow ended before it caught up: %v", err)
		case <-tick.C:
		}
		cp, at := manifestCheckpoint(dir, shardID)
		seq = max(seq, at)
		now := time.Since(began)
		if cp.Term > start.Term && first == 0 {
			first, firstTerm = now, cp.Term
		}
		if cp.Term >= lastTerm {
			took = now
			break
		}
		if time.Since(logged) >= 2*time.Second {
			logged = time.Now()
			publish.Logf("tabletflow: %v: the sink at %d of %d", now.Round(100*time.Millisecond), cp.Term, lastTerm)
		}
	}
	cpu := b.cpu().Minus(cpu0)
	if err := b.stopStream(ctx, stream, ended); err != nil {
		return side{}, err
	}
	for _, done := range profiled {
		if err := <-done; err != nil {
			publish.Logf("worker profile: %v", err)
		}
	}
	firstCount, err := recordsUpTo(filepath.Join(dir, shardID+".jsonl"), firstTerm)
	if err != nil {
		return side{}, err
	}
	return newSide("tabletflow", w.records, took, first, firstCount, int(seq-seeded), cpu), nil // batches: the sink's commits
}

// streamConfig is the stream's config: the keyspace read from REPLICA
// vttablets of zone2 only (the replica the raw loop reads), into the
// JSONL directory dir, batches of b.batch records, the rest default.
func (b *bench) streamConfig(dir string) ([]byte, error) {
	src, err := config.SectionOf[config.Source](b.sourceConfig())
	if err != nil {
		return nil, err
	}
	snk, err := config.SectionOf[config.Sink](jsonl.Config{Kind: "jsonl", Path: dir})
	if err != nil {
		return nil, err
	}
	stream := config.Stream{
		Source:    src,
		Sink:      snk,
		StartFrom: string(source.StartLatest),
		Selection: config.Selection{Cells: []string{readCell}, CellPreference: "onlySpecified",
			TabletTypes: []string{string(source.TypeReplica)}},
		Batch: config.Batch{MaxRecords: b.batch},
	}
	if b.linger >= 0 {
		l := config.Duration(b.linger)
		stream.Batch.Linger = &l
	}
	cfg, err := json.Marshal(stream)
	if err != nil {
		return nil, err
	}
	if _, err := config.Decode(cfg); err != nil {
		return nil, fmt.Errorf("stream config: %w", err)
	}
	return cfg, nil
}

// stopStream stops a StreamWorkflow and waits until it has ended, so
// that its idle reads do not share the machine with the next pass.
func (b *bench) stopStream(ctx context.Context, id string, ended <-chan error) error {
	if err := b.temporal.SignalWorkflow(ctx, id, "", workflows.CmdStop, json.RawMessage(`{}`)); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	select {
	case err := <-ended:
		if err != nil {
			return fmt.Errorf("stop %s: %w", id, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop %s: %w", id, ctx.Err())
	}
}

// manifestCheckpoint is the latest checkpoint in a tablet's JSONL
// manifest (two slots of one JSON line each), and its commit's sequence
// number, read without the sink's lock: a slot being rewritten does not
// parse and is passed over. Zero if none.
func manifestCheckpoint(dir, tablet string) (source.Checkpoint, uint64) {
	var cp source.Checkpoint
	var seq uint64
	raw, err := os.ReadFile(filepath.Join(dir, tablet+".manifest.json"))
	if err != nil {
		return cp, 0
	}
	for line := range bytes.Lines(raw) {
		var slot struct {
			Manifest struct {
				Seq        uint64            `json:"seq"`
				Checkpoint source.Checkpoint `json:"checkpoint"`
			} `json:"manifest"`
		}
		if json.Unmarshal(line, &slot) == nil && slot.Manifest.Seq > seq {
			cp, seq = slot.Manifest.Checkpoint, slot.Manifest.Seq
		}
	}
	return cp, seq
}

// profile writes what the worker's /debug/pprof/<what> answers (a CPU
// profile, an execution trace) to path.
func (b *bench) profile(ctx context.Context, what, path string) error {
	url := "http://" + b.metrics + "/debug/pprof/" + what
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	publish.Logf("the worker's %s over the first tabletflow pass: %s", what, path)
	return f.Close()
}

// reader reads the backlog through the adapter's Reader into a JSONL sink
// at dir, as the GetChanges activity does but without Temporal, until the
// transaction at lastTerm is committed; timed from opening the sink to
// the last commit.
func (b *bench) reader(ctx context.Context, dir string, w written, lastTerm uint64) (side, error) {
	ctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	start, err := startCheckpoint(w)
	if err != nil {
		return side{}, err
	}
	src, err := vitess.New(b.sourceConfig(), nil)
	if err != nil {
		return side{}, err
	}
	defer src.Close()
	rep := b.replica()
	b.flushDirty()
	cpu0 := b.cpu()
	began := time.Now()
	rd, tw, closeAll, err := pass.OpenJSONL(ctx, src, source.Replica{Tablet: shardID, Alias: rep.Alias, Cell: rep.Cell,
		Type: source.TypeReplica}, dir, "reader")
	if err != nil {
		return side{}, err
	}
	defer closeAll()
	l, err := pass.Adapter(ctx, rd, tw, source.ChangesRequest{Stream: "reader", Tablet: shardID, From: start,
		MaxRecords: b.batch, MaxWait: config.DefaultMaxWait}, began, func(cp source.Checkpoint, _ uint64) bool { return cp.Term >= lastTerm })
	if err != nil {
		return side{}, err
	}
	took := time.Since(began)
	cpu := b.cpu().Minus(cpu0)
	if l.Records != w.records {
		return side{}, fmt.Errorf("read %d records, the workload wrote %d", l.Records, w.records)
	}
	// Ack is a no-op for this adapter; its few ns count as reading.
	s := newSide("reader", w.records, took, l.First, l.FirstCount, l.Batches, cpu)
	s.Split(took, l.InWrite, 0)
	return s, nil
}
