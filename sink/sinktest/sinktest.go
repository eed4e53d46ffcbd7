// Package sinktest is the contract test suite every sink adapter must pass.
// An adapter's test calls Run with a factory for fresh, empty storage:
//
//	func TestContract(t *testing.T) {
//		sinktest.Run(t, func(t *testing.T) sinktest.Harness {
//			dir := t.TempDir()
//			return sinktest.Harness{Open: …New(dir)…, Read: …, Tamper: …, Corrupt: …, Crash: …}
//		})
//	}
//
// The suite is adapter-neutral: it reaches the storage only through the
// Harness. It compares records the way the digest does: Key, Before and
// After in canonical JSON ("null" and absent alike), commit times to the
// nanosecond.
package sinktest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// Harness is one adapter's storage under test, fresh for each case.
type Harness struct {
	// Open returns a new Sink instance over the harness's storage. Every
	// call is a separate instance, as a second worker process would have;
	// the suite closes them.
	Open func(t *testing.T) sink.Sink
	// Read returns the committed records per tablet, in stored order.
	// Tablets without records may be absent.
	Read func(t *testing.T) map[string][]source.Record
	// Tamper stores cp as the tablet's checkpoint behind every writer's
	// back, keeping its data, as another writer's commit would. Nil skips
	// the direct fencing case.
	Tamper func(t *testing.T, tablet string, cp source.Checkpoint)
	// Corrupt damages the tablet's stored data so that it no longer has a
	// valid record of what is committed (for the JSONL sink: it removes
	// the manifest and keeps the data), as a lost or deleted file would.
	// Nil skips the corruption case.
	Corrupt func(t *testing.T, tablet string)
	// Crash makes s behave as if its process died at the worst moment:
	// what s's writers staged may be partly on disk but is not committed,
	// nothing more is stored through s, and what s held (locks,
	// connections) is released, as the OS or the server would release it.
	// Nil: the suite abandons the writers and closes s without closing
	// them, which is a crash for adapters whose uncommitted work dies with
	// the connection (an open transaction).
	Crash func(t *testing.T, s sink.Sink)
}

// Tablet IDs the suite writes.
const (
	tabletA = "t-0001"
	tabletB = "t-0002"
	tabletC = "t-0003"
)

// Run runs the contract suite, one subtest per behaviour, each on storage
// from newHarness.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"CommitThenReopenKeepsCheckpointAndRecords", testCommitThenReopen},
		{"UncommittedRecordsAreDroppedOnClose", testUncommittedDroppedOnClose},
		{"CrashLosesOnlyTheUncommittedBatch", testCrash},
		{"WriteSkipsRecordsAtOrBelowCheckpoint", testWriteSkips},
		{"SecondWriterIsLockedOrFenced", testSecondWriter},
		{"CommitIsFencedWhenCheckpointChangedBehindWriter", testTamperFences},
		{"TabletsAreIndependent", testTabletsIndependent},
		{"CommitBeforeCheckpointFailsWithErrBadCommit", testCommitBackwards},
		{"WriteRejectsAnotherTabletsRecordWithErrBadRecord", testWriteOtherTablet},
		{"OpenedTabletIsStoredBeforeItsFirstCommit", testOpenStores},
		{"CorruptTabletFailsOpenWithErrCorrupt", testCorruptFailsOpen},
		{"EmptyCommitAdvancesCheckpoint", testEmptyCommit},
		{"ClosedSinkStopsWriters", testClosedSink},
		{"ResyncMarkersAreStoredLikeRecords", testResyncMarkers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, &env{t: t, h: newHarness(t)})
		})
	}
}

// env wraps a Harness with the suite's helpers.
type env struct {
	t *testing.T
	h Harness
}

var ctx = context.Background()

// open returns a new Sink instance, closed at the end of the test.
func (e *env) open() sink.Sink {
	s := e.h.Open(e.t)
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// openTablet opens tablet on s, closed at the end of the test.
func (e *env) openTablet(s sink.Sink, tablet string) sink.TabletWriter {
	w, err := s.Open(ctx, tablet)
	require.NoError(e.t, err, "open %s", tablet)
	e.t.Cleanup(func() { _ = w.Close() })
	return w
}

// commit writes records and commits the last one's position.
func (e *env) commit(w sink.TabletWriter, recs []source.Record) {
	require.NoError(e.t, w.Write(ctx, recs))
	require.NoError(e.t, w.Commit(ctx, recs[len(recs)-1].Position))
}

// requireStored checks the storage holds exactly want for tablet.
func (e *env) requireStored(tablet string, want []source.Record) {
	e.t.Helper()
	got := e.h.Read(e.t)[tablet]
	require.Equal(e.t, canon(e.t, want), canon(e.t, got), "records stored for %s", tablet)
}

// requireCheckpoint checks a fresh writer sees cp as tablet's checkpoint.
func (e *env) requireCheckpoint(tablet string, cp source.Checkpoint) {
	e.t.Helper()
	s := e.open()
	w := e.openTablet(s, tablet)
	require.Equal(e.t, cp, w.Checkpoint(), "stored checkpoint of %s", tablet)
	require.NoError(e.t, w.Close())
	require.NoError(e.t, s.Close())
}

// crash simulates s's process dying; see Harness.Crash.
func (e *env) crash(s sink.Sink) {
	if e.h.Crash != nil {
		e.h.Crash(e.t, s)
		return
	}
	require.NoError(e.t, s.Close())
}

// Records returns tablet's records with positions 1.from to 1.to, cycling
// through insert, update and delete, with nanosecond commit times and about
// 200 bytes of JSON each.
func Records(tablet string, from, to uint64) []source.Record {
	base := time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC)
	var out []source.Record
	for i := from; i <= to; i++ {
		r := source.Record{
			Tablet:     tablet,
			Position:   cp(i),
			CommitTime: base.Add(time.Duration(i) * 1001 * time.Microsecond),
			Table:      "orders",
			Key:        json.RawMessage(fmt.Sprintf(`{"id":%d}`, i)),
		}
		img := func(v int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"customer":"c-%05d","id":%d,"note":"two words, \"quoted\"","qty":%d,"sku":"sku-%08d","total":"%d.50"}`, i%997, i, v, i*7, v*3))
		}
		switch i % 3 {
		case 1:
			r.Op, r.After = source.Insert, img(1)
		case 2:
			r.Op, r.Before, r.After = source.Update, img(1), img(2)
		default:
			r.Op, r.Before = source.Delete, img(2)
		}
		out = append(out, r)
	}
	return out
}

// Marker returns a resync marker of tablet (op source.ResyncBegin or
// source.ResyncEnd) at the position 1.at: Tablet, Position, CommitTime and
// Op set, Table, Key, Before and After empty, as a source delivers it.
func Marker(tablet string, op source.Op, at uint64) source.Record {
	return source.Record{Tablet: tablet, Position: cp(at), Op: op,
		CommitTime: time.Date(2026, 11, 30, 10, 0, 0, 987654321, time.UTC).Add(time.Duration(at) * time.Millisecond)}
}

// cp is the checkpoint 1.i.
func cp(i uint64) source.Checkpoint { return source.Checkpoint{Term: 1, Index: i} }

// canonRecord is a record in the form the suite compares.
type canonRecord struct {
	Tablet, Position, Table, Op string
	Key, Before, After          string
	CommitTime                  int64
}

func canon(t *testing.T, recs []source.Record) []canonRecord {
	t.Helper()
	out := make([]canonRecord, 0, len(recs))
	for _, r := range recs {
		c := canonRecord{Tablet: r.Tablet, Position: r.Position.String(), Table: r.Table, Op: string(r.Op), CommitTime: r.CommitTime.UnixNano()}
		for _, f := range []struct {
			dst *string
			raw json.RawMessage
		}{{&c.Key, r.Key}, {&c.Before, r.Before}, {&c.After, r.After}} {
			b, err := digest.Canonical(f.raw)
			require.NoError(t, err)
			*f.dst = string(b)
		}
		out = append(out, c)
	}
	return out
}

func testCommitThenReopen(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	require.True(t, w.Checkpoint().IsZero(), "a new tablet starts at the zero checkpoint")
	recs := Records(tabletA, 1, 10)
	e.commit(w, recs[:4])
	e.commit(w, recs[4:])
	require.Equal(t, cp(10), w.Checkpoint())
	require.NoError(t, w.Close())
	require.NoError(t, s.Close())

	e.requireCheckpoint(tabletA, cp(10))
	e.requireStored(tabletA, recs)
}

func testUncommittedDroppedOnClose(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	recs := Records(tabletA, 1, 8)
	e.commit(w, recs[:5])
	require.NoError(t, w.Write(ctx, recs[5:]))
	require.NoError(t, w.Close())

	e.requireCheckpoint(tabletA, cp(5))
	e.requireStored(tabletA, recs[:5])
}

func testCrash(t *testing.T, e *env) {
	s1 := e.open()
	w1 := e.openTablet(s1, tabletA)
	recs := Records(tabletA, 1, 300)
	e.commit(w1, recs[:100])
	require.NoError(t, w1.Write(ctx, recs[100:200]))
	e.crash(s1) // w1 is abandoned, never closed

	s2 := e.open()
	w2 := e.openTablet(s2, tabletA)
	require.Equal(t, cp(100), w2.Checkpoint(), "only the committed batch survives")
	e.requireStored(tabletA, recs[:100])

	// The next run re-reads from an earlier point; nothing is stored twice.
	e.commit(w2, recs[50:300])
	require.NoError(t, w2.Close())
	e.requireStored(tabletA, recs)
	e.requireCheckpoint(tabletA, cp(300))
}

func testWriteSkips(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	recs := Records(tabletA, 1, 10)
	e.commit(w, recs[:6])

	// A re-read overlapping the checkpoint, with records repeated inside
	// the batch and one out of order: each record is stored once.
	batch := append(append([]source.Record{}, recs[2:8]...), recs[7], recs[3])
	batch = append(batch, recs[8:]...)
	require.NoError(t, w.Write(ctx, batch))
	require.NoError(t, w.Write(ctx, recs)) // all already staged or stored
	require.NoError(t, w.Commit(ctx, cp(10)))
	require.NoError(t, w.Close())

	// After reopening, the stored checkpoint drives the skipping.
	w = e.openTablet(s, tabletA)
	require.NoError(t, w.Write(ctx, recs))
	require.NoError(t, w.Commit(ctx, cp(10)))
	e.requireStored(tabletA, recs)
}

// testSecondWriter races two writers on one tablet, each on its own Sink
// instance. B opens while A holds the tablet: an adapter with a lock
// refuses B with ErrLocked; one without lets B open at the same (zero)
// checkpoint, and then B's commit, after A's, must fail with ErrFenced and
// store nothing. Either way only A's data is stored, and the next writer
// starts from A's checkpoint.
func testSecondWriter(t *testing.T, e *env) {
	sa, sb := e.open(), e.open()
	wa := e.openTablet(sa, tabletA)
	wb, err := sb.Open(ctx, tabletA)
	if err != nil {
		require.ErrorIs(t, err, sink.ErrLocked, "a second writer is refused with ErrLocked, or opens and is fenced")
		wb = nil
	} else {
		t.Cleanup(func() { _ = wb.Close() })
		require.True(t, wb.Checkpoint().IsZero())
	}

	recs := Records(tabletA, 1, 10)
	e.commit(wa, recs[:4])
	require.NoError(t, wa.Close())

	if wb != nil {
		require.NoError(t, wb.Write(ctx, recs))
		require.ErrorIs(t, wb.Commit(ctx, cp(10)), sink.ErrFenced)
		require.ErrorIs(t, wb.Commit(ctx, cp(10)), sink.ErrFenced, "a fenced writer stays fenced")
		require.NoError(t, wb.Close())
	}
	e.requireStored(tabletA, recs[:4])

	// Once A is gone a new writer opens, from A's checkpoint.
	wb2 := e.openTablet(sb, tabletA)
	require.Equal(t, cp(4), wb2.Checkpoint())
	e.commit(wb2, recs)
	e.requireStored(tabletA, recs)
}

// testTamperFences changes the stored checkpoint behind an open writer, as
// a writer that took over the tablet would: the writer's next commit is
// fenced and stores nothing.
func testTamperFences(t *testing.T, e *env) {
	if e.h.Tamper == nil {
		t.Skip("the adapter has no Tamper hook")
	}
	s := e.open()
	w := e.openTablet(s, tabletA)
	recs := Records(tabletA, 1, 10)
	e.commit(w, recs[:3])

	e.h.Tamper(t, tabletA, cp(7))
	require.NoError(t, w.Write(ctx, recs[3:]))
	err := w.Commit(ctx, cp(10))
	require.ErrorIs(t, err, sink.ErrFenced)
	require.ErrorIs(t, w.Commit(ctx, cp(10)), sink.ErrFenced, "a fenced writer stays fenced")
	require.NoError(t, w.Close())

	e.requireStored(tabletA, recs[:3])
	e.requireCheckpoint(tabletA, cp(7))
}

// testTabletsIndependent commits to three tablets at once from two Sink
// instances; every commit succeeds and each tablet holds its own records.
func testTabletsIndependent(t *testing.T, e *env) {
	s1, s2 := e.open(), e.open()
	jobs := []struct {
		s      sink.Sink
		tablet string
	}{{s1, tabletA}, {s2, tabletB}, {s1, tabletC}}
	writers := make([]sink.TabletWriter, len(jobs))
	for i, j := range jobs {
		writers[i] = e.openTablet(j.s, j.tablet)
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			recs := Records(j.tablet, 1, 200)
			for k := 0; k < len(recs) && errs[i] == nil; k += 20 {
				if errs[i] = writers[i].Write(ctx, recs[k:k+20]); errs[i] == nil {
					errs[i] = writers[i].Commit(ctx, recs[k+19].Position)
				}
			}
		})
	}
	wg.Wait()
	for i, j := range jobs {
		require.NoError(t, errs[i], "tablet %s", j.tablet)
		require.Equal(t, cp(200), writers[i].Checkpoint())
	}
	stored := e.h.Read(t)
	for _, j := range jobs {
		require.Equal(t, canon(t, Records(j.tablet, 1, 200)), canon(t, stored[j.tablet]), "tablet %s", j.tablet)
	}
}

func testCommitBackwards(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	recs := Records(tabletA, 1, 10)
	e.commit(w, recs[:5])

	require.ErrorIs(t, w.Commit(ctx, cp(4)), sink.ErrBadCommit, "a checkpoint before Checkpoint()")
	require.Equal(t, cp(5), w.Checkpoint())
	// A checkpoint before the last staged record would let those records
	// be read again after a restart and stored twice.
	require.NoError(t, w.Write(ctx, recs[5:]))
	require.ErrorIs(t, w.Commit(ctx, cp(7)), sink.ErrBadCommit, "a checkpoint before the last staged record")

	// Neither failure broke the writer or lost the staged batch.
	require.NoError(t, w.Commit(ctx, cp(10)))
	require.NoError(t, w.Close())
	e.requireStored(tabletA, recs)
	e.requireCheckpoint(tabletA, cp(10))
}

func testEmptyCommit(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	recs := Records(tabletA, 1, 3)
	e.commit(w, recs)

	require.NoError(t, w.Write(ctx, nil))
	require.NoError(t, w.Commit(ctx, cp(9)), "an empty batch that moves the checkpoint")
	require.Equal(t, cp(9), w.Checkpoint())
	require.NoError(t, w.Commit(ctx, cp(9)), "an empty batch at the same checkpoint")
	require.NoError(t, w.Close())

	e.requireCheckpoint(tabletA, cp(9))
	e.requireStored(tabletA, recs)
}

func testClosedSink(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	recs := Records(tabletA, 1, 6)
	e.commit(w, recs[:3])
	require.NoError(t, w.Write(ctx, recs[3:]))
	require.NoError(t, s.Close())

	require.ErrorIs(t, w.Write(ctx, recs), sink.ErrClosed)
	require.ErrorIs(t, w.Commit(ctx, cp(6)), sink.ErrClosed)
	_, err := s.Open(ctx, tabletB)
	require.ErrorIs(t, err, sink.ErrClosed)
	_ = w.Close() // its sink closed it already

	e.requireCheckpoint(tabletA, cp(3))
	e.requireStored(tabletA, recs[:3])
}

// testWriteOtherTablet writes a batch holding another tablet's record: the
// call fails with ErrBadRecord and stages nothing, and what was staged
// before it still commits.
func testWriteOtherTablet(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	recs := Records(tabletA, 1, 6)
	require.NoError(t, w.Write(ctx, recs[:3]))
	bad := append(append([]source.Record{}, recs[3:5]...), Records(tabletB, 6, 6)...)
	require.ErrorIs(t, w.Write(ctx, bad), sink.ErrBadRecord)
	require.NoError(t, w.Commit(ctx, cp(3)))
	require.NoError(t, w.Close())

	e.requireStored(tabletA, recs[:3])
	e.requireCheckpoint(tabletA, cp(3))
}

// testOpenStores opens a new tablet and closes it without a commit: the
// tablet is stored, empty, at the zero checkpoint, and opens again as such.
// (The adapter stores it at Open, so that later its data without a commit
// record is corruption, not a new tablet; see CorruptTabletFailsOpen.)
func testOpenStores(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	require.True(t, w.Checkpoint().IsZero())
	require.NoError(t, w.Close())
	require.NoError(t, s.Close())

	e.requireCheckpoint(tabletA, source.Checkpoint{})
	e.requireStored(tabletA, nil)
}

// testCorruptFailsOpen damages a tablet that holds committed records:
// Open fails with ErrCorrupt instead of treating the tablet as new (which
// would drop its records or store them twice), and keeps failing: the
// first failure repaired nothing.
func testCorruptFailsOpen(t *testing.T, e *env) {
	if e.h.Corrupt == nil {
		t.Skip("the adapter has no Corrupt hook")
	}
	s := e.open()
	w := e.openTablet(s, tabletA)
	e.commit(w, Records(tabletA, 1, 5))
	require.NoError(t, w.Close())

	e.h.Corrupt(t, tabletA)
	for range 2 {
		_, err := s.Open(ctx, tabletA)
		require.ErrorIs(t, err, sink.ErrCorrupt)
	}
	// Other tablets are not affected.
	e.commit(e.openTablet(s, tabletB), Records(tabletB, 1, 2))
}

// testResyncMarkers writes a resync as a source delivers it: a begin, rows
// and changes, a second begin (the copy started over), a batch of a
// marker alone, the end. Write refuses no marker; each is stored once, in
// order among the records, with its position, and reads back as it was
// written (no table, no key or images); a commit at a marker's position
// is the tablet's checkpoint; a re-read batch with markers stores none
// twice; and the markers do not touch another tablet.
func testResyncMarkers(t *testing.T, e *env) {
	s := e.open()
	w := e.openTablet(s, tabletA)
	before := Records(tabletA, 1, 4)
	e.commit(w, before)
	wb := e.openTablet(s, tabletB)
	other := Records(tabletB, 1, 3)
	e.commit(wb, other)

	recs := append(append([]source.Record{}, before...), Marker(tabletA, source.ResyncBegin, 5))
	recs = append(recs, Records(tabletA, 6, 7)...)
	recs = append(recs, Marker(tabletA, source.ResyncBegin, 8))
	e.commit(w, recs[4:])
	require.Equal(t, cp(8), w.Checkpoint(), "a commit at a marker's position")

	alone := Marker(tabletA, source.ResyncBegin, 9) // a batch of a marker alone
	require.NoError(t, w.Write(ctx, []source.Record{alone}))
	require.NoError(t, w.Commit(ctx, alone.Position))
	recs = append(recs, alone)
	require.NoError(t, w.Close())
	e.requireCheckpoint(tabletA, cp(9))
	w = e.openTablet(s, tabletA)

	tail := append(Records(tabletA, 10, 12), Marker(tabletA, source.ResyncEnd, 13))
	tail = append(tail, Records(tabletA, 14, 15)...)
	// Read again from before the first marker: what is stored is skipped.
	require.NoError(t, w.Write(ctx, append(append([]source.Record{}, recs[3:]...), tail...)))
	require.NoError(t, w.Commit(ctx, cp(15)))
	recs = append(recs, tail...)
	require.NoError(t, w.Close())

	e.requireStored(tabletA, recs)
	e.requireCheckpoint(tabletA, cp(15))
	e.requireStored(tabletB, other)
	for _, r := range e.h.Read(t)[tabletA] {
		if r.Op.Marker() {
			require.Empty(t, r.Table, "a marker at %s has no table", r.Position)
			require.Empty(t, r.Key, "a marker at %s has no key", r.Position)
			require.Empty(t, r.Before, "a marker at %s has no before image", r.Position)
			require.Empty(t, r.After, "a marker at %s has no after image", r.Position)
		}
	}
}
