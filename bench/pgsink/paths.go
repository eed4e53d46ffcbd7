package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
)

// store makes one tablet's batches durable, one after the other.
type store interface {
	// put stores recs, the next batch, durably: what staging (the sink's
	// Write) and committing took, and how many commits failed and were
	// tried again.
	put(ctx context.Context, recs []source.Record) (staged, committed time.Duration, retries int, err error)
	close() error
}

// pathResult is one path's run over the whole workload.
type pathResult struct {
	Seconds     float64 `json:"seconds"`
	RecordsPerS float64 `json:"records_per_s"`
	Batches     int     `json:"batches"`
	// Busy time summed over the tablets' goroutines: in Write (checking
	// and staging) and in Commit (the transaction, or the file's fsyncs).
	WriteS  float64 `json:"write_s"`
	CommitS float64 `json:"commit_s"`
	// CommitRetries: commits that failed with an error worth retrying and
	// were tried again (as the GetChanges activity would be).
	CommitRetries int `json:"commit_retries"`
	// CPU seconds in the run: this program ("bench"), the PostgreSQL
	// server's processes ("postgres"), the host ("host_busy", steal
	// included) and what the hypervisor gave other guests ("host_steal").
	CPU map[string]float64 `json:"cpu_seconds"`
}

func (r pathResult) String() string {
	s := fmt.Sprintf("%.0f records/s in %.2fs (%d batches; busy in write %.2fs, commit %.2fs), cpu %v",
		r.RecordsPerS, r.Seconds, r.Batches, r.WriteS, r.CommitS, r.CPU)
	if r.CommitRetries > 0 {
		s += fmt.Sprintf(", %d commits retried", r.CommitRetries)
	}
	return s
}

// drive opens a store per tablet (connections made, tablets opened: not
// timed), then stores every tablet's log in batches, one goroutine per
// tablet, and times that from the first batch to the last commit. With
// firstAlone the first tablet's first batch is stored before the others
// start (inside the timed span).
func (b *bench) drive(ctx context.Context, firstAlone bool, open func(ctx context.Context, tablet string) (store, error)) (pathResult, error) {
	ctx, cancel := context.WithTimeout(ctx, pathTimeout)
	defer cancel()
	stores := make([]store, len(b.w.tablets))
	errs := make([]error, len(b.w.tablets))
	var wg sync.WaitGroup
	for i, tablet := range b.w.tablets {
		wg.Go(func() { stores[i], errs[i] = open(ctx, tablet) })
	}
	wg.Wait()
	defer func() {
		for _, s := range stores {
			if s != nil {
				_ = s.close()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return pathResult{}, err
	}

	type tally struct {
		staged, committed time.Duration
		batches, retries  int
	}
	tallies := make([]tally, len(b.w.tablets))
	put := func(i int, recs []source.Record) error {
		t := &tallies[i]
		staged, committed, retries, err := stores[i].put(ctx, recs)
		t.staged, t.committed, t.retries = t.staged+staged, t.committed+committed, t.retries+retries
		if err != nil {
			return fmt.Errorf("tablet %s, batch %d: %w", b.w.tablets[i], t.batches+1, err)
		}
		t.batches++
		return nil
	}
	cpu0 := b.cpu()
	began := time.Now()
	skip := 0
	if firstAlone {
		if err := put(0, batches(b.w.logs[b.w.tablets[0]], b.batch)[0]); err != nil {
			return pathResult{}, err
		}
		skip = 1
	}
	for i, tablet := range b.w.tablets {
		wg.Go(func() {
			todo := batches(b.w.logs[tablet], b.batch)
			if i == 0 {
				todo = todo[skip:]
			}
			for _, recs := range todo {
				if err := put(i, recs); err != nil {
					errs[i] = err
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	cpu := b.cpu().Minus(cpu0)
	if err := errors.Join(errs...); err != nil {
		return pathResult{}, err
	}
	r := pathResult{Seconds: took.Seconds(), RecordsPerS: float64(b.w.records) / took.Seconds(), CPU: cpu}
	var staged, committed time.Duration
	for _, t := range tallies {
		staged, committed = staged+t.staged, committed+t.committed
		r.Batches, r.CommitRetries = r.Batches+t.batches, r.CommitRetries+t.retries
	}
	r.WriteS, r.CommitS = staged.Round(time.Millisecond).Seconds(), committed.Round(time.Millisecond).Seconds()
	return r, nil
}

// rawColumns are the change table's columns, as the sink copies them.
var rawColumns = []string{"stream", "tablet", "pos_term", "pos_index", "tbl", "op", "key", "before", "after", "commit_time", "commit_time_ns"}

// rawDDL makes the raw loop's table: the sink's change table (the same
// DDL: columns, types and primary key) in a schema of its own.
func rawDDL(schema string) []string {
	return []string{
		`DROP SCHEMA IF EXISTS ` + pgx.Identifier{schema}.Sanitize() + ` CASCADE`,
		`CREATE SCHEMA ` + pgx.Identifier{schema}.Sanitize(),
		`CREATE TABLE ` + postgres.ChangeTableDDL(schema),
	}
}

// rawStore is the floor: one connection per tablet and per batch one
// transaction holding one COPY of the batch's rows into the raw table,
// the values as the sink passes them; no checks, no checkpoint.
type rawStore struct {
	conn   *pgx.Conn
	table  pgx.Identifier
	stream string
}

func (s *rawStore) put(ctx context.Context, recs []source.Record) (time.Duration, time.Duration, int, error) {
	t0 := time.Now()
	err := pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error {
		_, err := tx.CopyFrom(ctx, s.table, rawColumns, pgx.CopyFromSlice(len(recs), func(i int) ([]any, error) {
			r := &recs[i]
			return []any{s.stream, r.Tablet, r.Position.Term, r.Position.Index, r.Table, string(r.Op),
				jsonText(r.Key), jsonText(r.Before), jsonText(r.After), r.CommitTime, r.CommitTime.UnixNano()}, nil
		}))
		return err
	})
	return 0, time.Since(t0), 0, err
}

func (s *rawStore) close() error { return s.conn.Close(context.Background()) }

// jsonText is a JSON value as text for a json column, nil (SQL NULL) when
// absent: what the sink passes.
func jsonText(v []byte) any {
	if len(v) == 0 || string(v) == "null" {
		return nil
	}
	return string(v)
}

// sinkStore is a tablet's writer of a sink: Write, then Commit at the
// batch's last position, as the GetChanges activity does.
type sinkStore struct {
	w sink.TabletWriter
}

// maxRetries bounds the tries of one commit.
const maxRetries = 5

func (s *sinkStore) put(ctx context.Context, recs []source.Record) (staged, committed time.Duration, retries int, err error) {
	t0 := time.Now()
	if err := s.w.Write(ctx, recs); err != nil {
		return time.Since(t0), 0, 0, err
	}
	t1 := time.Now()
	for {
		err = s.w.Commit(ctx, recs[len(recs)-1].Position)
		if err == nil || !retryable(err) || ctx.Err() != nil || retries == maxRetries {
			return t1.Sub(t0), time.Since(t1), retries, err
		}
		retries++
		publish.Logf("commit of %s at %s failed, trying again: %v", recs[0].Tablet, recs[len(recs)-1].Position, err)
	}
}

func (s *sinkStore) close() error { return s.w.Close() }

// retryable reports whether a failed commit may succeed if tried again:
// not when the sink says retrying cannot help (sink.go). A failed commit
// keeps its records staged.
func retryable(err error) bool {
	for _, final := range []error{sink.ErrFenced, sink.ErrClosed, sink.ErrCorrupt, sink.ErrBadRecord,
		sink.ErrBadTablet, sink.ErrBadCommit, sink.ErrDenied} {
		if errors.Is(err, final) {
			return false
		}
	}
	return true
}
