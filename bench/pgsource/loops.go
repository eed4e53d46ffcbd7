package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"go.temporal.io/sdk/client"

	"github.com/tabletflow/tabletflow/bench/internal/pass"
	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/workflows"
)

// reader reads the standby through the adapter's Reader into a JSONL sink
// at dir, as the GetChanges activity does but without Temporal, until want
// records are committed; timed from opening the sink to the last commit.
func (b *bench) reader(ctx context.Context, dir string, want uint64, start source.Checkpoint) (pass.Figures, error) {
	ctx, cancel := context.WithTimeout(ctx, loopTimeout)
	defer cancel()
	cpu0 := b.cpu(0)
	began := time.Now()
	rd, w, closeAll, err := pass.OpenJSONL(ctx, b.src, source.Replica{Tablet: shardID, Alias: standby.Alias, Cell: standby.Cell,
		Type: source.TypeReplica}, dir, readerStream)
	if err != nil {
		return pass.Figures{}, err
	}
	defer closeAll()
	l, err := pass.Adapter(ctx, rd, w, source.ChangesRequest{Stream: readerStream, Tablet: shardID, From: start,
		MaxRecords: b.batch, MaxWait: maxWait}, began, func(_ source.Checkpoint, n uint64) bool { return n >= want })
	if err != nil {
		return pass.Figures{}, err
	}
	took := time.Since(began)
	if l.Records != want {
		return pass.Figures{}, fmt.Errorf("read %d records, the workload wrote %d", l.Records, want)
	}
	cpu := b.cpu(b.walsender(ctx, postgres.SlotName(readerStream, shardID))).Minus(cpu0)
	r := pass.New(want, took, l.First, l.FirstCount, l.Batches, cpu)
	r.Split(took, l.InWrite, l.InAck)
	return r, nil
}

// flowRun is what polling the stream's slot saw, from ExecuteWorkflow.
type flowRun struct {
	wall        time.Duration // confirmed at the last transaction
	replicating time.Duration // the slot's walsender active
	firstAckAt  time.Duration // confirmed past the start
	firstAck    pglogrepl.LSN // where, then
	cpu         map[string]float64
}

// result is the run's figures, given how many records were at or below
// the first confirmed position.
func (f flowRun) result(records, firstCount uint64) pass.Figures {
	return pass.New(records, f.wall, f.firstAckAt, firstCount, 0, f.cpu)
}

// flow starts the StreamWorkflow reading the standby into dir and times it
// until the standby's slot for the stream is confirmed at last. The
// adapter acknowledges a batch only after the sink committed it, so that
// is when the last record was durable (or a poll, 20 ms, later).
func (b *bench) flow(ctx context.Context, dir string, start source.Checkpoint, last pglogrepl.LSN) (flowRun, error) {
	var res flowRun
	src, err := config.SectionOf[config.Source](b.srcCfg)
	if err != nil {
		return res, err
	}
	snk, err := config.SectionOf[config.Sink](jsonl.Config{Kind: "jsonl", Path: dir})
	if err != nil {
		return res, err
	}
	cfg, err := json.Marshal(config.Stream{
		Source:    src,
		Sink:      snk,
		Selection: config.Selection{TabletTypes: []string{string(source.TypeReplica)}},
		Batch:     config.Batch{MaxRecords: b.batch, MaxWait: config.Duration(maxWait)},
		Run:       config.Run{Duration: config.Duration(time.Minute), HeartbeatTimeout: config.Duration(10 * time.Second)},
	})
	if err != nil {
		return res, err
	}
	if _, err := config.Decode(cfg); err != nil {
		return res, fmt.Errorf("stream config: %w", err)
	}
	slot := postgres.SlotName(flowID, shardID)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cpu0 := b.cpu(0)
	began := time.Now()
	run, err := b.temporal.ExecuteWorkflow(wctx, client.StartWorkflowOptions{ID: flowID, TaskQueue: taskQueue},
		workflows.StreamWorkflow, json.RawMessage(cfg), (*workflows.StreamState)(nil))
	if err != nil {
		return res, fmt.Errorf("start the stream: %w", err)
	}
	ended := make(chan error, 1)
	go func() { ended <- run.Get(wctx, nil) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(loopTimeout)
	var pid int
	for logged := time.Now(); ; {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-ended:
			return res, fmt.Errorf("the stream workflow ended before it caught up: %v", err)
		case <-timeout:
			return res, fmt.Errorf("not caught up within %v", loopTimeout)
		case <-tick.C:
		}
		confirmed, active, err := b.slot(ctx, slot)
		if err != nil {
			return res, err
		}
		now := time.Since(began)
		if active != 0 && pid == 0 {
			pid, res.replicating = active, now
		}
		if confirmed > pglogrepl.LSN(start.Term) && res.firstAck == 0 {
			res.firstAck, res.firstAckAt = confirmed, now
		}
		if confirmed >= last {
			res.wall = now
			res.cpu = b.cpu(pid).Minus(cpu0)
			return res, nil
		}
		if time.Since(logged) >= time.Second {
			logged = time.Now()
			publish.Logf("tabletflow: %v: slot confirmed at %s of %s", now.Round(100*time.Millisecond), confirmed, last)
		}
	}
}

// slot reads a logical slot on the standby: its confirmed position and
// the pid of the walsender reading it (0: none).
func (b *bench) slot(ctx context.Context, name string) (confirmed pglogrepl.LSN, pid int, err error) {
	var lsn *string
	var active *int32
	err = b.admin.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = $1`,
		name).Scan(&lsn, &active)
	if err != nil {
		return 0, 0, fmt.Errorf("slot %s: %w", name, err)
	}
	if lsn != nil {
		if confirmed, err = pglogrepl.ParseLSN(*lsn); err != nil {
			return 0, 0, err
		}
	}
	if active != nil {
		pid = int(*active)
	}
	return confirmed, pid, nil
}

// walsender is the pid of the walsender reading the slot, 0 if none or
// unknown: its CPU is the decoding's.
func (b *bench) walsender(ctx context.Context, slot string) int {
	_, pid, err := b.slot(ctx, slot)
	if err != nil {
		publish.Logf("walsender of %s: %v", slot, err)
	}
	return pid
}
