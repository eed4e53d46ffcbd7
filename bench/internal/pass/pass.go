// Package pass holds what the source benchmarks (bench/pgsource,
// bench/vitess) measure of one reader's pass over a fixed backlog, and the
// adapter loop they time: an adapter's Reader and a sink in a loop, as the
// GetChanges activity does, without Temporal.
package pass

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
)

// Figures are one reader's pass over the whole backlog.
type Figures struct {
	Seconds     float64 `json:"seconds"`
	RecordsPerS float64 `json:"records_per_s"`
	// FirstCommitS: from the start until the first batch was durable;
	// Steady: records/s from then to the end.
	FirstCommitS      float64 `json:"first_commit_s"`
	SteadyRecordsPerS float64 `json:"steady_records_per_s"`
	Batches           int     `json:"batches,omitempty"`
	// Where the wall time went, for the loops in the benchmark itself:
	// reading (receiving and decoding, for the adapter its GetChanges),
	// writing to the file or sink and making it durable, acknowledging
	// (where the loop times it apart from reading).
	ReadS  float64 `json:"read_s,omitempty"`
	WriteS float64 `json:"write_and_sync_s,omitempty"`
	AckS   float64 `json:"ack_s,omitempty"`
	// CPU seconds in the pass: the benchmark ("bench"), the worker and the
	// dev server, the server process sending the changes (when it could be
	// read), and the host.
	CPU map[string]float64 `json:"cpu_seconds"`
}

// New is a pass's figures: records in took in batches, the first batch
// durable after first with firstCount records.
func New(records uint64, took, first time.Duration, firstCount uint64, batches int, cpu map[string]float64) Figures {
	f := Figures{Seconds: took.Seconds(), RecordsPerS: float64(records) / took.Seconds(),
		FirstCommitS: first.Seconds(), Batches: batches, CPU: cpu}
	if took > first && records > firstCount {
		f.SteadyRecordsPerS = float64(records-firstCount) / (took - first).Seconds()
	}
	return f
}

// Split records where a loop's wall time took went: writing and syncing,
// acknowledging, and the rest, reading; each to the millisecond.
func (f *Figures) Split(took, write, ack time.Duration) {
	ms := func(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }
	f.ReadS, f.WriteS, f.AckS = ms(took-write-ack), ms(write), ms(ack)
}

func (f Figures) String() string {
	s := fmt.Sprintf("%.0f records/s in %.2fs (first commit after %.2fs, then %.0f records/s), cpu %v",
		f.RecordsPerS, f.Seconds, f.FirstCommitS, f.SteadyRecordsPerS, f.CPU)
	if f.ReadS > 0 || f.WriteS > 0 {
		s += fmt.Sprintf(", wall: read %.2fs, write+sync %.2fs", f.ReadS, f.WriteS)
		if f.AckS > 0 {
			s += fmt.Sprintf(", ack %.2fs", f.AckS)
		}
	}
	return s
}

// Loop is what an adapter loop counted and timed.
type Loop struct {
	Records, FirstCount uint64
	Batches             int
	// First: from the start until the first batch with records was
	// committed; InWrite: in the sink's Write and Commit; InAck: in the
	// reader's Ack.
	First, InWrite, InAck time.Duration
}

// Adapter reads rd into tw from req.From in batches of req, as the
// GetChanges activity does but without Temporal: GetChanges, then a batch
// past tw's checkpoint is written, committed and acknowledged; until done
// says so of the checkpoint read up to and the records so far. began is
// the start First is timed from.
func Adapter(ctx context.Context, rd source.ReplicaReader, tw sink.TabletWriter, req source.ChangesRequest, began time.Time,
	done func(cp source.Checkpoint, records uint64) bool) (Loop, error) {
	var l Loop
	for !done(req.From, l.Records) {
		batch, err := rd.GetChanges(ctx, req)
		if err != nil {
			return l, fmt.Errorf("after %d records: %w", l.Records, err)
		}
		if batch.Checkpoint.Compare(tw.Checkpoint()) > 0 {
			t0 := time.Now()
			if err := tw.Write(ctx, batch.Records); err != nil {
				return l, err
			}
			if err := tw.Commit(ctx, batch.Checkpoint); err != nil {
				return l, err
			}
			t1 := time.Now()
			if err := rd.Ack(ctx, req.Stream, req.Tablet, batch.Checkpoint); err != nil {
				return l, err
			}
			l.InWrite, l.InAck = l.InWrite+t1.Sub(t0), l.InAck+time.Since(t1)
		}
		req.From = batch.Checkpoint
		if len(batch.Records) > 0 {
			l.Records += uint64(len(batch.Records))
			l.Batches++
			if l.Batches == 1 {
				l.First, l.FirstCount = time.Since(began), l.Records
			}
		}
	}
	return l, nil
}

// OpenJSONL opens what an adapter loop reads and writes: a JSONL sink of
// stream at dir with its writer for rep's tablet, and a reader on rep from
// src. closeAll closes them; on an error what was opened is closed.
func OpenJSONL(ctx context.Context, src source.Source, rep source.Replica, dir, stream string) (
	rd source.ReplicaReader, tw sink.TabletWriter, closeAll func(), err error) {
	snk, err := jsonl.New(dir, stream)
	if err != nil {
		return nil, nil, nil, err
	}
	if tw, err = snk.Open(ctx, rep.Tablet); err != nil {
		snk.Close()
		return nil, nil, nil, err
	}
	if rd, err = src.OpenReplica(ctx, rep); err != nil {
		tw.Close()
		snk.Close()
		return nil, nil, nil, err
	}
	return rd, tw, func() {
		if c, ok := rd.(io.Closer); ok {
			c.Close()
		}
		tw.Close()
		snk.Close()
	}, nil
}
