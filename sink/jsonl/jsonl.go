// Package jsonl is the JSONL sink: one <tablet-id>.jsonl file per tablet
// under a directory, one JSON line per record, exactly once across crashes.
//
// Files under the directory, per tablet:
//
//	<tablet>.jsonl          the data: committed lines, then maybe an
//	                        uncommitted tail left by a crash
//	<tablet>.manifest.json  two checksummed slots, each {"seq","stream",
//	                        "tablet","checkpoint","offset","updated"}: the
//	                        committed checkpoint and the byte length of the
//	                        committed data; written at the tablet's first
//	                        Open, before any data, then one slot rewritten
//	                        in place at each commit (manifest.go)
//	<tablet>.lock           flock(2)-ed by the one open writer; never removed
//
// A line is
//
//	{"stream":…,"tablet":…,"position":"term.index","table":…,
//	 "op":"insert"|"update"|"delete"|"read"|"truncate"|"resync-begin"|"resync-end",
//	 "key":{…}|null,"before":{…}|null,"after":{…}|null,"commitTime":"RFC3339Nano, UTC"}
//
// with key, before and after copied verbatim from the record, so that
// digest.Hash over a parsed line reproduces the source's hash (DigestDir).
// A truncate has no key or images; a resync's markers (source.ResyncBegin,
// source.ResyncEnd) have none and table "": the sink stores them as it
// stores changes, and a reader of the files follows them (docs/sinks.md,
// "Resync markers").
//
// Exactly-once: a Commit appends the staged lines at the end of the
// committed data, syncs the data file, and only then writes the next
// manifest into the slot that does not hold the current one, and syncs
// that. The manifest is the commit point: a crash before its slot is whole
// on disk leaves the previous manifest and a tail that the next Open
// truncates, and readers never look past the manifest's offset. The
// manifest's checkpoint is stored with the data it covers, so a re-read
// batch is skipped by Write. A sync is the file's fdatasync(2), or one
// syncfs(2) shared with the tablets committing at the same time
// (groupsync.go).
//
// Fencing: the lock keeps one writer per tablet across processes on one
// host. Behind it, Commit is a compare-and-set on the manifest: it fails
// with sink.ErrFenced, storing nothing, if the manifest's checkpoint or
// offset changed since this writer's Open or last Commit, or if the data
// file grew behind it. The check and the write are not one atomic step, so
// the compare-and-set catches a writer that lost its lock (a removed lock
// file, a filesystem without coherent locks) at its next commit, but two
// such writers committing at the same instant can still interleave: the
// lock is the guard, the compare-and-set the backstop.
package jsonl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// Errors of this adapter, besides the sink package's. Each is a case of
// the sink package's error of the same name (errors.Is matches both), so
// callers classify them without knowing this package.
var (
	// ErrCorrupt: a tablet's files contradict each other (data without a
	// manifest, a data file shorter than its manifest says, a committed
	// line that does not parse) or belong to another stream.
	ErrCorrupt error = &caseError{"jsonl: corrupt tablet files", sink.ErrCorrupt}
	// ErrBadTablet: a tablet ID that cannot name a file.
	ErrBadTablet error = &caseError{"jsonl: bad tablet id", sink.ErrBadTablet}
	// ErrBadRecord: a record that cannot be written as a line (an op that
	// is neither a change nor a resync marker, invalid JSON, another
	// tablet's record).
	ErrBadRecord error = &caseError{"jsonl: bad record", sink.ErrBadRecord}
	// ErrBadCommit: Commit with a checkpoint before the writer's
	// checkpoint or before its last staged record.
	ErrBadCommit error = &caseError{"jsonl: commit checkpoint goes backwards", sink.ErrBadCommit}
)

// caseError is a sentinel of this adapter that is a case of a sink package
// sentinel: it keeps its own message and unwraps to the general one.
type caseError struct {
	msg  string
	kind error
}

func (e *caseError) Error() string { return e.msg }
func (e *caseError) Unwrap() error { return e.kind }

// Sink writes one stream's tablets under one directory. It is safe for
// concurrent use by different tablets.
type Sink struct {
	dir    string
	stream string
	group  *syncGroup // the filesystem's group sync; nil: file by file

	mu      sync.Mutex
	closed  bool
	writers map[string]*Writer // open (or opening: nil) tablets
}

var _ sink.Sink = (*Sink)(nil)

// New returns a sink writing stream's records under dir, creating dir.
func New(dir, stream string) (*Sink, error) {
	if stream == "" {
		return nil, errors.New("jsonl: empty stream id")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create sink dir: %w", err)
	}
	return &Sink{dir: dir, stream: stream, group: groupFor(dir), writers: map[string]*Writer{}}, nil
}

// Open locks the tablet, reads its manifest, truncates the data file to
// the committed offset, dropping a tail an earlier writer left
// uncommitted, and returns a writer fenced to the manifest's checkpoint.
// A tablet without a manifest is new: Open writes its manifest (zero
// checkpoint, offset 0) before returning, durably, so that from then on a
// missing manifest means lost state. A data file that holds bytes but has
// no manifest is ErrCorrupt, naming both files, and is left as it is:
// nothing says which of its bytes are committed, and dropping them could
// lose data. It returns sink.ErrLocked when another writer, in this
// process or another, holds the tablet, and sink.ErrClosed after Close.
func (s *Sink) Open(ctx context.Context, tablet string) (sink.TabletWriter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := checkTablet(tablet); err != nil {
		return nil, err
	}
	s.mu.Lock()
	switch _, busy := s.writers[tablet]; {
	case s.closed:
		s.mu.Unlock()
		return nil, sink.ErrClosed
	case busy:
		s.mu.Unlock()
		return nil, fmt.Errorf("open tablet %s: %w", tablet, sink.ErrLocked)
	}
	s.writers[tablet] = nil // reserved while opening
	s.mu.Unlock()

	w, err := s.open(tablet)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.closed { // closed while opening
		_ = w.release()
		err = sink.ErrClosed
	}
	if err != nil {
		delete(s.writers, tablet)
		return nil, err
	}
	s.writers[tablet] = w
	return w, nil
}

func (s *Sink) open(tablet string) (*Writer, error) {
	lock := flock.New(lockPath(s.dir, tablet))
	ok, err := lock.TryLock()
	if err != nil {
		return nil, fmt.Errorf("lock tablet %s: %w", tablet, err)
	}
	if !ok {
		return nil, fmt.Errorf("open tablet %s: %w", tablet, sink.ErrLocked)
	}
	w := &Writer{s: s, tablet: tablet, lock: lock, prefix: linePrefix(s.stream, tablet), syncer: newSyncer(s.group)}
	if err := w.load(); err != nil {
		_ = w.release()
		return nil, fmt.Errorf("open tablet %s: %w", tablet, err)
	}
	return w, nil
}

// Close closes every open writer, dropping what they staged, and makes
// further Opens fail with sink.ErrClosed. It is idempotent.
func (s *Sink) Close() error {
	s.mu.Lock()
	s.closed = true
	open := make([]*Writer, 0, len(s.writers))
	for _, w := range s.writers {
		if w != nil {
			open = append(open, w)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, w := range open {
		errs = append(errs, w.Close())
	}
	return errors.Join(errs...)
}

// checkTablet rejects IDs that would escape the directory or collide with
// the directory's own entries.
func checkTablet(tablet string) error {
	if tablet == "" || tablet == "." || tablet == ".." || strings.ContainsAny(tablet, "/\\\x00") {
		return fmt.Errorf("%w: %q", ErrBadTablet, tablet)
	}
	return nil
}

// Writer writes one tablet; see sink.TabletWriter. Records are staged in
// memory (one batch, encoded) and touch the disk only at Commit. After an
// error from Commit other than a bad checkpoint the writer is broken: every
// later call returns that error, and the caller must Close it and Open the
// tablet again, which drops whatever the failed Commit left behind.
type Writer struct {
	s      *Sink
	tablet string
	lock   *flock.Flock
	prefix []byte // the constant start of every line

	mu     sync.Mutex
	syncer syncer // makes its writes durable (groupsync.go)
	f      *os.File
	mf     *os.File          // the manifest file, open for its slots
	mfInfo os.FileInfo       // mf's identity: a manifest replaced behind us is another file
	slots  []byte            // mf's bytes as this writer last read or wrote them
	buf    []byte            // for reading mf back
	seq    uint64            // the committed manifest's Seq
	cp     source.Checkpoint // stored checkpoint as this writer knows it
	offset int64             // committed bytes of the data file
	staged []byte            // encoded lines for the next Commit
	last   source.Checkpoint // position of the last staged record, or cp
	err    error             // sticky: sink.ErrClosed, fenced, or an I/O failure
	closed bool
}

var _ sink.TabletWriter = (*Writer)(nil)

// load reads the manifest (writing a new tablet's first) and opens the
// data file truncated to its offset.
func (w *Writer) load() error {
	dir, tablet := w.s.dir, w.tablet
	m, legacy, err := readManifestFile(dir, tablet)
	fresh := errors.Is(err, errNoManifest)
	if err != nil && !fresh {
		return err
	}
	if !fresh && ((m.Stream != "" && m.Stream != w.s.stream) || (m.Tablet != "" && m.Tablet != tablet)) {
		return fmt.Errorf("%w: manifest is for stream %q tablet %q", ErrCorrupt, m.Stream, m.Tablet)
	}
	f, err := os.OpenFile(dataPath(dir, tablet), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open data: %w", err)
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
	case fresh && fi.Size() > 0:
		err = fmt.Errorf("%w: data file %s holds %d bytes but its manifest %s is missing",
			ErrCorrupt, dataPath(dir, tablet), fi.Size(), manifestPath(dir, tablet))
	case fresh:
		// A new tablet (or one whose first Open crashed before this point,
		// leaving an empty data file). The data file was created first so
		// that the manifest's directory fsync makes both durable.
		m = manifest{Seq: 1, Stream: w.s.stream, Tablet: tablet, Updated: time.Now().UTC()}
		err = writeManifest(dir, tablet, m)
	case fi.Size() < m.Offset:
		err = fmt.Errorf("%w: data file has %d bytes, manifest says %d are committed", ErrCorrupt, fi.Size(), m.Offset)
	case fi.Size() > m.Offset:
		err = f.Truncate(m.Offset) // the uncommitted tail
	}
	if err == nil && legacy {
		// The format before the slots: rewritten once, atomically.
		m.Seq = 1
		err = writeManifest(dir, tablet, m)
	}
	if err == nil {
		err = w.openManifest()
	}
	if err != nil {
		_ = f.Close()
		return err
	}
	w.f, w.cp, w.last, w.offset, w.seq = f, m.Checkpoint, m.Checkpoint, m.Offset, m.Seq
	return nil
}

// openManifest opens the manifest file for its slots.
func (w *Writer) openManifest() error {
	mf, err := os.OpenFile(manifestPath(w.s.dir, w.tablet), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open manifest: %w", err)
	}
	info, err := mf.Stat()
	if err != nil {
		_ = mf.Close()
		return fmt.Errorf("open manifest: %w", err)
	}
	slots, err := readSlots(mf, nil)
	if err != nil {
		_ = mf.Close()
		return fmt.Errorf("open manifest: %w", err)
	}
	if w.mf != nil {
		_ = w.mf.Close()
	}
	w.mf, w.mfInfo, w.slots = mf, info, slots
	return nil
}

// stored returns the committed manifest as it is on disk now: through the
// open manifest file (bytes unchanged since this writer wrote or read them
// are its own manifest, and need no parsing), or, when the file at the
// manifest's path is another one (replaced behind this writer), from that
// file, which the writer then keeps. A missing manifest is ErrCorrupt:
// Open wrote one, so it is lost state, not a new tablet.
func (w *Writer) stored() (manifest, error) {
	info, err := os.Stat(manifestPath(w.s.dir, w.tablet))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return manifest{}, fmt.Errorf("%w: %w: %s", ErrCorrupt, errNoManifest, manifestPath(w.s.dir, w.tablet))
	case err != nil:
		return manifest{}, fmt.Errorf("stat manifest: %w", err)
	case os.SameFile(info, w.mfInfo):
		b, err := readSlots(w.mf, w.buf)
		if err != nil {
			return manifest{}, err
		}
		w.buf = b
		if bytes.Equal(b, w.slots) {
			return manifest{Seq: w.seq, Checkpoint: w.cp, Offset: w.offset}, nil
		}
		return parseSlots(w.tablet, b)
	}
	m, legacy, err := readManifestFile(w.s.dir, w.tablet)
	if err == nil && legacy {
		err = fmt.Errorf("%w: manifest of tablet %s was rewritten in the old format", ErrCorrupt, w.tablet)
	}
	if err == nil {
		err = w.openManifest()
	}
	return m, err
}

// Checkpoint returns the manifest's checkpoint at Open, then the last one
// this writer committed.
func (w *Writer) Checkpoint() source.Checkpoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cp
}

// Write encodes and stages records. Records at or below Checkpoint() or at
// or below the last staged record are skipped. It is all or nothing: on
// ErrBadRecord nothing of this call is staged.
func (w *Writer) Write(ctx context.Context, records []source.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	staged, last := len(w.staged), w.last
	for i := range records {
		rec := &records[i]
		if rec.Position.Compare(w.last) <= 0 {
			continue
		}
		var err error
		if rec.Tablet != w.tablet {
			err = fmt.Errorf("%w: position %s is tablet %q's, not %q's", ErrBadRecord, rec.Position, rec.Tablet, w.tablet)
		} else {
			w.staged, err = appendLine(w.staged, w.prefix, rec)
		}
		if err != nil {
			w.staged, w.last = w.staged[:staged], last
			return err
		}
		w.last = rec.Position
	}
	return nil
}

// Commit stores the staged lines and cp; see sink.TabletWriter. One data
// write and sync, and one manifest slot write and sync, whatever the batch
// size.
// An empty batch with a new cp stores the checkpoint; an empty batch with
// the same cp writes nothing but still checks the fence.
func (w *Writer) Commit(ctx context.Context, cp source.Checkpoint) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if cp.Compare(w.last) < 0 {
		return fmt.Errorf("commit %s to tablet %s: %w: checkpoint %s, last staged %s",
			cp, w.tablet, ErrBadCommit, w.cp, w.last)
	}
	// Pre-check: the data file ends where our committed data does, so
	// nobody appended behind our back and our write lands after committed
	// data only.
	fi, err := w.f.Stat()
	if err != nil {
		return w.fail(fmt.Errorf("commit tablet %s: stat data: %w", w.tablet, err))
	}
	if fi.Size() != w.offset {
		return w.fence(false, fmt.Sprintf("data file has %d bytes, this writer committed %d", fi.Size(), w.offset))
	}
	n := int64(len(w.staged))
	if n > 0 {
		if _, err := w.f.WriteAt(w.staged, w.offset); err != nil {
			return w.fail(w.undo(fmt.Errorf("commit tablet %s: write data: %w", w.tablet, err)))
		}
		if err := w.syncer.syncThen(w.f, n); err != nil {
			return w.fail(w.undo(fmt.Errorf("commit tablet %s: sync data: %w", w.tablet, err)))
		}
	}
	// Compare-and-set: the manifest is still the one this writer knows.
	m, err := w.stored()
	if err != nil {
		return w.fail(w.undo(fmt.Errorf("commit tablet %s: %w", w.tablet, err)))
	}
	if m.Seq != w.seq || m.Checkpoint != w.cp || m.Offset != w.offset {
		return w.fence(n > 0, fmt.Sprintf("stored manifest %d checkpoint %q offset %d, this writer's %d %q offset %d",
			m.Seq, m.Checkpoint, m.Offset, w.seq, w.cp, w.offset))
	}
	if n == 0 && cp == w.cp {
		return nil
	}
	if w.seq == math.MaxUint64 {
		// Seq would wrap to 0, below the other slot's: readers and the
		// next Open would go by that older manifest, losing this commit.
		// No count of commits gets here; the manifest was tampered with.
		return w.fail(w.undo(fmt.Errorf("commit tablet %s: %w: manifest seq %d cannot advance", w.tablet, ErrCorrupt, w.seq)))
	}
	next := manifest{Seq: w.seq + 1, Stream: w.s.stream, Tablet: w.tablet, Checkpoint: cp, Offset: w.offset + n, Updated: time.Now().UTC()}
	if err := writeSlot(w.mf, w.slots, next, w.syncer.sync); err != nil {
		// The slot written holds the manifest of two commits ago, never
		// the current one: whatever reached the disk, the next Open reads
		// either this commit or the previous one, whole. The writer is
		// broken; the next Open goes by what the manifest says.
		return w.fail(w.undo(fmt.Errorf("commit tablet %s: %w", w.tablet, err)))
	}
	w.cp, w.last, w.offset, w.seq = cp, cp, next.Offset, next.Seq
	if cap(w.staged) > 16<<20 {
		w.staged = nil // do not pin one huge batch's buffer
	}
	w.staged = w.staged[:0]
	return nil
}

// fence breaks the writer with sink.ErrFenced. If it appended, it truncates
// its lines away, but never below the data the current manifest commits.
func (w *Writer) fence(appended bool, why string) error {
	err := fmt.Errorf("commit tablet %s: %w: %s", w.tablet, sink.ErrFenced, why)
	if appended {
		err = w.undo(err)
	}
	return w.fail(err)
}

// undo truncates the data file back to this writer's committed offset (or
// the manifest's, if that is further) after a failed commit, so the failed
// batch is not left on disk even until the next Open. It returns err, with
// the truncation's failure joined.
func (w *Writer) undo(err error) error {
	to := w.offset
	if m, merr := readManifest(w.s.dir, w.tablet); merr == nil && m.Offset > to {
		to = m.Offset
	}
	if terr := w.f.Truncate(to); terr != nil {
		return errors.Join(err, fmt.Errorf("truncate data: %w", terr))
	}
	_ = w.f.Sync()
	return err
}

// fail makes err sticky and drops the staged batch.
func (w *Writer) fail(err error) error {
	w.err = err
	w.staged = nil
	return err
}

// Close drops staged records and releases the tablet's lock. It is
// idempotent.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed, w.err = true, sink.ErrClosed
	w.staged = nil
	err := w.release()
	w.mu.Unlock()

	w.s.mu.Lock()
	if w.s.writers[w.tablet] == w {
		delete(w.s.writers, w.tablet)
	}
	w.s.mu.Unlock()
	return err
}

// release closes the data file and unlocks the tablet.
func (w *Writer) release() error {
	var errs []error
	if w.f != nil {
		errs = append(errs, w.f.Close())
	}
	if w.mf != nil {
		errs = append(errs, w.mf.Close())
	}
	errs = append(errs, w.lock.Close())
	return errors.Join(errs...)
}
