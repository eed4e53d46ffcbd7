// Package rawlines is the output side of the source benchmarks' raw loops
// (bench/pgsource, bench/vitess): each row change as the JSONL line a
// tabletflow stream writes, numbered by its transaction's term and its
// ordinal there, written a batch of whole transactions at a time and made
// durable, with the figures a pass reports. The loops encode the row
// images themselves, each from its own protocol.
package rawlines

import (
	"os"
	"strconv"
	"time"

	"github.com/tabletflow/tabletflow/internal/jsontext"
)

// Writer builds the lines of the open transaction and of the batch not
// yet written, and writes the batch to its file. Not safe for concurrent
// use.
type Writer struct {
	f    *os.File
	sync func(*os.File) error
	// Began is the pass's start, FirstCommit is timed from it; Create sets
	// it to the file's creation.
	Began time.Time

	prefix []byte // every line's start, up to the position
	// The open transaction: each record's line from `,"table":` up to the
	// commit time, which comes with the commit; ends[i] is where record i
	// ends in body.
	body []byte
	ends []int
	// The batch: lines not yet written.
	out     []byte
	pending int
	stamp   []byte

	// Records counts the records committed, FirstCount those in the first
	// batch written, FirstCommit when it was durable, Batches the batches
	// written, InWrite the time spent writing and syncing them.
	Records, FirstCount uint64
	FirstCommit         time.Duration
	Batches             int
	InWrite             time.Duration
}

// Create makes the file path for the lines of stream's tablet; sync makes
// a written batch durable ((*os.File).Sync, or an fdatasync).
func Create(path, stream, tablet string, sync func(*os.File) error) (*Writer, error) {
	began := time.Now()
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	prefix := append(jsontext.AppendString([]byte(`{"stream":`), stream), `,"tablet":`...)
	prefix = append(jsontext.AppendString(prefix, tablet), `,"position":"`...)
	return &Writer{f: f, sync: sync, Began: began, prefix: prefix}, nil
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// Begin starts a transaction: records added before and not committed are
// dropped.
func (w *Writer) Begin() { w.body, w.ends = w.body[:0], w.ends[:0] }

// Record starts a row change of the open transaction: it returns the
// transaction's lines so far with this record's fields up to its key
// (`,"table":…,"op":"…","key":`). Append the key, `,"before":` and its
// value, `,"after":` and its value, and hand the result to Add.
func (w *Writer) Record(table, op string) []byte {
	b := append(w.body, `,"table":`...)
	b = jsontext.AppendString(b, table)
	b = append(b, `,"op":"`...)
	b = append(b, op...)
	return append(b, `","key":`...)
}

// Add ends the record Record started; b is what it returned, appended to.
func (w *Writer) Add(b []byte) {
	w.body = b
	w.ends = append(w.ends, len(b))
}

// Open is how many records the open transaction holds.
func (w *Writer) Open() int { return len(w.ends) }

// Pending is how many records the batch holds, not yet written.
func (w *Writer) Pending() int { return w.pending }

// Commit numbers the open transaction's records (position term.ordinal,
// the ordinal from 1) into the batch with its commit time, and ends it.
func (w *Writer) Commit(term uint64, at time.Time) {
	w.stamp = at.UTC().AppendFormat(w.stamp[:0], time.RFC3339Nano)
	start := 0
	for i, end := range w.ends {
		w.out = append(w.out, w.prefix...)
		w.out = strconv.AppendUint(w.out, term, 10)
		w.out = append(w.out, '.')
		w.out = strconv.AppendUint(w.out, uint64(i+1), 10)
		w.out = append(w.out, '"')
		w.out = append(w.out, w.body[start:end]...)
		w.out = append(w.out, `,"commitTime":"`...)
		w.out = append(w.out, w.stamp...)
		w.out = append(w.out, "\"}\n"...)
		start = end
	}
	w.pending += len(w.ends)
	w.Records += uint64(len(w.ends))
	w.Begin()
}

// Flush writes the batch and makes it durable; a batch without records is
// not written.
func (w *Writer) Flush() error {
	if w.pending == 0 {
		return nil
	}
	began := time.Now()
	if _, err := w.f.Write(w.out); err != nil {
		return err
	}
	if err := w.sync(w.f); err != nil {
		return err
	}
	w.InWrite += time.Since(began)
	w.out, w.pending = w.out[:0], 0
	w.Batches++
	if w.Batches == 1 {
		w.FirstCommit, w.FirstCount = time.Since(w.Began), w.Records
	}
	return nil
}
