package jsonl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
)

const stream = "orders"

var ctx = context.Background()

func TestContract(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		dir := t.TempDir()
		return sinktest.Harness{
			Open: func(t *testing.T) sink.Sink { return newSink(t, dir) },
			Read: func(t *testing.T) map[string][]source.Record { return readRecords(t, dir) },
			Tamper: func(t *testing.T, tablet string, cp source.Checkpoint) {
				m, err := readManifest(dir, tablet)
				require.NoError(t, err)
				m.Stream, m.Tablet, m.Checkpoint = stream, tablet, cp
				require.NoError(t, writeManifest(dir, tablet, m))
			},
			Corrupt: func(t *testing.T, tablet string) {
				require.NoError(t, os.Remove(manifestPath(dir, tablet)))
			},
			Crash: func(t *testing.T, s sink.Sink) { s.(*Sink).crash() },
		}
	})
}

// crash makes s act as if its process died mid-Commit, the worst moment:
// each open writer's staged lines are half written past the committed data
// (a torn last line) and never fsynced or committed, and its file and lock
// are closed as the kernel would on exit. The manifest is not touched.
func (s *Sink) crash() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for tablet, w := range s.writers {
		if w == nil {
			continue
		}
		w.mu.Lock()
		_, _ = w.f.WriteAt(w.staged[:len(w.staged)/2], w.offset)
		_ = w.release()
		w.closed, w.err = true, sink.ErrClosed
		w.mu.Unlock()
		delete(s.writers, tablet)
	}
}

func newSink(t *testing.T, dir string) *Sink {
	s, err := New(dir, stream)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func readRecords(t *testing.T, dir string) map[string][]source.Record {
	lines, err := ReadDir(dir)
	require.NoError(t, err)
	out := map[string][]source.Record{}
	for tablet, ls := range lines {
		for _, l := range ls {
			r, err := l.Record()
			require.NoError(t, err)
			out[tablet] = append(out[tablet], r)
		}
	}
	return out
}

// commit opens tablet on a new sink over dir, stores recs and closes.
func commit(t *testing.T, dir, tablet string, recs []source.Record) {
	s := newSink(t, dir)
	w, err := s.Open(ctx, tablet)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, recs))
	require.NoError(t, w.Commit(ctx, recs[len(recs)-1].Position))
	require.NoError(t, w.Close())
	require.NoError(t, s.Close())
}

func TestLineFormat(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 11, 30, 10, 5, 0, 120000000, time.FixedZone("CET", 3600))
	recs := []source.Record{
		{Tablet: "t-0001", Position: source.Checkpoint{Term: 2, Index: 7}, CommitTime: at, Table: "orders",
			Op: source.Insert, Key: json.RawMessage(`{"id":7}`), After: json.RawMessage(`{"id":7,"note":"<b> & \"x\""}`)},
		{Tablet: "t-0001", Position: source.Checkpoint{Term: 2, Index: 8}, CommitTime: at.Add(time.Nanosecond), Table: "order \"items\"",
			Op: source.Delete, Key: json.RawMessage(`{"id":8}`), Before: json.RawMessage("{\n  \"id\": 8\n}")},
		{Tablet: "t-0001", Position: source.Checkpoint{Term: 2, Index: 9}, CommitTime: at, Table: "orders", Op: source.Truncate},
		{Tablet: "t-0001", Position: source.Checkpoint{Term: 3, Index: 1}, CommitTime: at, Op: source.ResyncBegin},
		{Tablet: "t-0001", Position: source.Checkpoint{Term: 3, Index: 2}, CommitTime: at, Op: source.ResyncEnd},
	}
	commit(t, dir, "t-0001", recs)

	data, err := os.ReadFile(filepath.Join(dir, "t-0001.jsonl"))
	require.NoError(t, err)
	want := `{"stream":"orders","tablet":"t-0001","position":"2.7","table":"orders","op":"insert",` +
		`"key":{"id":7},"before":null,"after":{"id":7,"note":"<b> & \"x\""},"commitTime":"2026-11-30T09:05:00.12Z"}` + "\n" +
		`{"stream":"orders","tablet":"t-0001","position":"2.8","table":"order \"items\"","op":"delete",` +
		`"key":{"id":8},"before":{"id":8},"after":null,"commitTime":"2026-11-30T09:05:00.120000001Z"}` + "\n" +
		`{"stream":"orders","tablet":"t-0001","position":"2.9","table":"orders","op":"truncate",` +
		`"key":null,"before":null,"after":null,"commitTime":"2026-11-30T09:05:00.12Z"}` + "\n" +
		`{"stream":"orders","tablet":"t-0001","position":"3.1","table":"","op":"resync-begin",` +
		`"key":null,"before":null,"after":null,"commitTime":"2026-11-30T09:05:00.12Z"}` + "\n" +
		`{"stream":"orders","tablet":"t-0001","position":"3.2","table":"","op":"resync-end",` +
		`"key":null,"before":null,"after":null,"commitTime":"2026-11-30T09:05:00.12Z"}` + "\n"
	require.Equal(t, want, string(data), "fields in order, JSON verbatim (compacted only across a line break), UTC RFC3339Nano")
	got := readRecords(t, dir)["t-0001"]
	require.Len(t, got, len(recs))
	for i, r := range got[3:] {
		require.Equal(t, recs[3+i].Op, r.Op, "a marker reads back as itself")
		require.True(t, r.Op.Marker())
		require.Equal(t, recs[3+i].Position, r.Position)
		require.Empty(t, r.Table)
		require.Nil(t, r.Key)
		require.Nil(t, r.Before)
		require.Nil(t, r.After)
	}
}

func TestWriteRejectsBadRecordsAndStagesNothingOfTheCall(t *testing.T) {
	good := sinktest.Records("t-0001", 1, 4)
	tests := []struct {
		name   string
		mutate func(r *source.Record)
	}{
		// An op outside insert/update/delete.
		{name: "unknown op", mutate: func(r *source.Record) { r.Op = "upsert" }},
		// JSON that would break the line.
		{name: "invalid key JSON", mutate: func(r *source.Record) { r.Key = json.RawMessage(`{"id":`) }},
		// Another tablet's record.
		{name: "wrong tablet", mutate: func(r *source.Record) { r.Tablet = "t-0002" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := newSink(t, dir)
			w, err := s.Open(ctx, "t-0001")
			require.NoError(t, err)
			require.NoError(t, w.Write(ctx, good[:2]))
			bad := slices.Clone(good[2:])
			tt.mutate(&bad[1])
			err = w.Write(ctx, bad)
			require.ErrorIs(t, err, ErrBadRecord)
			require.ErrorIs(t, err, sink.ErrBadRecord, "a case of the sink package's error")
			require.NoError(t, w.Commit(ctx, good[1].Position))
			require.NoError(t, w.Close())
			require.Equal(t, sinktest.Records("t-0001", 1, 2), readRecords(t, dir)["t-0001"])
		})
	}
}

func TestOpenRejectsBadTabletIDs(t *testing.T) {
	s := newSink(t, t.TempDir())
	for _, id := range []string{"", ".", "..", "a/b", "../x", `a\b`, "a\x00b"} {
		_, err := s.Open(ctx, id)
		require.ErrorIs(t, err, ErrBadTablet, "tablet %q", id)
		require.ErrorIs(t, err, sink.ErrBadTablet, "tablet %q", id)
	}
}

func TestOpenTruncatesTornTail(t *testing.T) {
	dir := t.TempDir()
	recs := sinktest.Records("t-0001", 1, 5)
	commit(t, dir, "t-0001", recs)
	path := filepath.Join(dir, "t-0001.jsonl")
	committed, err := os.ReadFile(path)
	require.NoError(t, err)

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"stream":"orders","tablet":"t-0001","position":"1.6","tab`)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	// Readers ignore the tail even before a writer truncates it.
	require.Len(t, readRecords(t, dir)["t-0001"], 5)

	s := newSink(t, dir)
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	require.Equal(t, recs[4].Position, w.Checkpoint())
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, committed, after, "Open truncates the data file back to the manifest's offset")
}

func TestOpenRejectsDataShorterThanManifest(t *testing.T) {
	dir := t.TempDir()
	commit(t, dir, "t-0001", sinktest.Records("t-0001", 1, 5))
	require.NoError(t, os.Truncate(filepath.Join(dir, "t-0001.jsonl"), 10))

	_, err := newSink(t, dir).Open(ctx, "t-0001")
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorIs(t, err, sink.ErrCorrupt)
	_, err = ReadDir(dir)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestOpenWritesTheManifestBeforeAnyCommit(t *testing.T) {
	dir := t.TempDir()
	w, err := newSink(t, dir).Open(ctx, "t-0001")
	require.NoError(t, err)
	defer w.Close()

	m, err := readManifest(dir, "t-0001")
	require.NoError(t, err, "the manifest exists as soon as Open returns")
	require.Equal(t, manifest{Seq: 1, Stream: stream, Tablet: "t-0001", Updated: m.Updated}, m, "zero checkpoint, nothing committed")
	require.False(t, m.Updated.IsZero())
	_, err = os.Stat(manifestPath(dir, "t-0001") + tempExt)
	require.ErrorIs(t, err, os.ErrNotExist, "written through a temp file that is renamed away")
	lines, err := ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, lines)
}

// TestOpenRejectsDataWithoutManifest: data whose manifest is gone is not a
// new tablet. Open fails loudly, naming the files, and leaves the data as
// it was (it used to truncate it to nothing).
func TestOpenRejectsDataWithoutManifest(t *testing.T) {
	dir := t.TempDir()
	commit(t, dir, "t-0001", sinktest.Records("t-0001", 1, 5))
	data := filepath.Join(dir, "t-0001.jsonl")
	before, err := os.ReadFile(data)
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(dir, "t-0001.manifest.json")))

	_, err = newSink(t, dir).Open(ctx, "t-0001")
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorIs(t, err, sink.ErrCorrupt)
	require.ErrorContains(t, err, data)
	require.ErrorContains(t, err, filepath.Join(dir, "t-0001.manifest.json"))
	after, err := os.ReadFile(data)
	require.NoError(t, err)
	require.Equal(t, before, after, "the data is left as it was")
	_, err = os.Stat(filepath.Join(dir, "t-0001.manifest.json"))
	require.ErrorIs(t, err, os.ErrNotExist, "no manifest is made up for it")

	_, err = ReadDir(dir)
	require.ErrorIs(t, err, ErrCorrupt, "readers do not skip it silently either")
}

// TestOpenStartsATabletWhoseFirstOpenCrashed: Open creates the data file,
// then writes the manifest; a crash in between leaves an empty data file
// without a manifest, which holds nothing and opens as a new tablet.
func TestOpenStartsATabletWhoseFirstOpenCrashed(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "t-0001.jsonl"), nil, 0o644))
	lines, err := ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, lines)

	recs := sinktest.Records("t-0001", 1, 3)
	commit(t, dir, "t-0001", recs)
	require.Equal(t, recs, readRecords(t, dir)["t-0001"])
}

// TestCommitFailsWhenTheManifestIsRemovedBehindTheWriter: the manifest
// Open wrote is gone at commit time; the commit fails as corruption and
// leaves no bytes behind, rather than starting the tablet over.
func TestCommitFailsWhenTheManifestIsRemovedBehindTheWriter(t *testing.T) {
	dir := t.TempDir()
	w, err := newSink(t, dir).Open(ctx, "t-0001")
	require.NoError(t, err)
	defer w.Close()
	require.NoError(t, os.Remove(manifestPath(dir, "t-0001")))

	recs := sinktest.Records("t-0001", 1, 3)
	require.NoError(t, w.Write(ctx, recs))
	require.ErrorIs(t, w.Commit(ctx, recs[2].Position), sink.ErrCorrupt)
	info, err := os.Stat(dataPath(dir, "t-0001"))
	require.NoError(t, err)
	require.Zero(t, info.Size(), "the failed commit's lines are truncated away")
}

func TestOpenRejectsAnotherStreamsManifest(t *testing.T) {
	dir := t.TempDir()
	commit(t, dir, "t-0001", sinktest.Records("t-0001", 1, 2))
	s, err := New(dir, "payments")
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Open(ctx, "t-0001")
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorIs(t, err, sink.ErrCorrupt)
}

func TestCommitLeavesOnlyDataManifestAndLockFiles(t *testing.T) {
	dir := t.TempDir()
	commit(t, dir, "t-0001", sinktest.Records("t-0001", 1, 5))
	commit(t, dir, "t-0001", sinktest.Records("t-0001", 6, 9))
	commit(t, dir, "t-0002", sinktest.Records("t-0002", 1, 3))

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{
		"t-0001.jsonl", "t-0001.lock", "t-0001.manifest.json",
		"t-0002.jsonl", "t-0002.lock", "t-0002.manifest.json",
	}, names, "no temp file is left behind; only data files end in .jsonl")

	// The manifest file as docs/sinks.md describes it to readers: two lines
	// of 4096 bytes, each {"crc32c","manifest"}; the committed one is the
	// valid line with the higher seq.
	b, err := os.ReadFile(filepath.Join(dir, "t-0001.manifest.json"))
	require.NoError(t, err)
	lines := bytes.SplitAfter(b, []byte("\n"))
	require.Len(t, lines, 3, "two lines, then nothing")
	require.Empty(t, lines[2])
	var best map[string]any
	for _, l := range lines[:2] {
		require.Len(t, l, 4096)
		var sl struct {
			CRC32C   uint32          `json:"crc32c"`
			Manifest json.RawMessage `json:"manifest"`
		}
		require.NoError(t, json.Unmarshal(l, &sl))
		require.Equal(t, crc32.Checksum(sl.Manifest, crc32.MakeTable(crc32.Castagnoli)), sl.CRC32C)
		var m map[string]any
		require.NoError(t, json.Unmarshal(sl.Manifest, &m))
		if best == nil || m["seq"].(float64) > best["seq"].(float64) {
			best = m
		}
	}
	data, err := os.Stat(filepath.Join(dir, "t-0001.jsonl"))
	require.NoError(t, err)
	require.Equal(t, "orders", best["stream"])
	require.Equal(t, "t-0001", best["tablet"])
	require.Equal(t, "1.9", best["checkpoint"])
	require.Equal(t, float64(data.Size()), best["offset"])
	require.Contains(t, best, "updated")
}

// TestCommitWritesTheManifestInPlace: commits rewrite a slot of the file
// Open made (no new file, no rename), alternating slots.
func TestCommitWritesTheManifestInPlace(t *testing.T) {
	dir := t.TempDir()
	w, err := newSink(t, dir).Open(ctx, "t-0001")
	require.NoError(t, err)
	defer w.Close()
	before, err := os.Stat(manifestPath(dir, "t-0001"))
	require.NoError(t, err)
	recs := sinktest.Records("t-0001", 1, 6)
	for i := range 3 {
		require.NoError(t, w.Write(ctx, recs[2*i:2*i+2]))
		require.NoError(t, w.Commit(ctx, recs[2*i+1].Position))
		after, err := os.Stat(manifestPath(dir, "t-0001"))
		require.NoError(t, err)
		require.True(t, os.SameFile(before, after), "commit %d replaced the manifest file", i+1)
		b, err := os.ReadFile(manifestPath(dir, "t-0001"))
		require.NoError(t, err)
		m, ok := decodeSlot(b[(uint64(i)+2)%2*slotSize : ((uint64(i)+2)%2+1)*slotSize])
		require.True(t, ok)
		require.Equal(t, uint64(i+2), m.Seq, "commit %d wrote slot %d", i+1, (i+2)%2)
		require.Equal(t, recs[2*i+1].Position, m.Checkpoint)
	}
}

// TestOpenGoesByThePreviousManifestWhenTheLastSlotIsTorn: a crash while a
// commit writes its slot leaves that slot failing its checksum; the other
// slot, the commit before, is what Open and readers go by, and the lines
// the torn commit appended are an uncommitted tail.
func TestOpenGoesByThePreviousManifestWhenTheLastSlotIsTorn(t *testing.T) {
	dir := t.TempDir()
	recs := sinktest.Records("t-0001", 1, 6)
	commit(t, dir, "t-0001", recs[:3])
	commit(t, dir, "t-0001", recs)
	m, err := readManifest(dir, "t-0001")
	require.NoError(t, err)
	require.Equal(t, recs[5].Position, m.Checkpoint)

	f, err := os.OpenFile(manifestPath(dir, "t-0001"), os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte(`{"crc32c":1,"manifest":{"seq":`), int64(m.Seq%2)*slotSize+40) // a torn write
	require.NoError(t, err)
	require.NoError(t, f.Close())

	require.Equal(t, recs[:3], readRecords(t, dir)["t-0001"], "readers stop at the previous commit")
	w, err := newSink(t, dir).Open(ctx, "t-0001")
	require.NoError(t, err)
	require.Equal(t, recs[2].Position, w.Checkpoint())
	require.NoError(t, w.Write(ctx, recs))
	require.NoError(t, w.Commit(ctx, recs[5].Position))
	require.NoError(t, w.Close())
	require.Equal(t, recs, readRecords(t, dir)["t-0001"], "the tail was truncated and written again, once")

	// Both slots bad: nothing says what is committed.
	b, err := os.ReadFile(manifestPath(dir, "t-0001"))
	require.NoError(t, err)
	b[10], b[slotSize+10] = 'x', 'x'
	require.NoError(t, os.WriteFile(manifestPath(dir, "t-0001"), b, 0o644))
	_, err = newSink(t, dir).Open(ctx, "t-0001")
	require.ErrorIs(t, err, sink.ErrCorrupt)
	require.ErrorContains(t, err, "neither slot")
	_, err = ReadDir(dir)
	require.ErrorIs(t, err, ErrCorrupt)
}

// TestOpenReadsAndRewritesAManifestOfTheOldFormat: a tablet committed by
// a worker from before the slots (one JSON object, replaced by rename) is
// read as it is, and its first Open rewrites it in slots.
func TestOpenReadsAndRewritesAManifestOfTheOldFormat(t *testing.T) {
	dir := t.TempDir()
	recs := sinktest.Records("t-0001", 1, 5)
	commit(t, dir, "t-0001", recs[:3])
	m, err := readManifest(dir, "t-0001")
	require.NoError(t, err)
	old, err := json.Marshal(map[string]any{"stream": stream, "tablet": "t-0001",
		"checkpoint": m.Checkpoint, "offset": m.Offset, "updated": m.Updated})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(manifestPath(dir, "t-0001"), append(old, '\n'), 0o644))
	require.Equal(t, recs[:3], readRecords(t, dir)["t-0001"], "readers take the old format")

	commit(t, dir, "t-0001", recs)
	require.Equal(t, recs, readRecords(t, dir)["t-0001"])
	info, err := os.Stat(manifestPath(dir, "t-0001"))
	require.NoError(t, err)
	require.Equal(t, int64(2*slotSize), info.Size(), "rewritten in slots")
}

// TestWriterThatLostItsLockIsFenced removes the lock file under a writer,
// so a second writer gets a new lock and opens at the same checkpoint,
// as on a filesystem without coherent locks. The compare-and-set catches
// whichever commits second, before it touches the first one's data.
func TestWriterThatLostItsLockIsFenced(t *testing.T) {
	dir := t.TempDir()
	wa, err := newSink(t, dir).Open(ctx, "t-0001")
	require.NoError(t, err)
	_, err = newSink(t, dir).Open(ctx, "t-0001")
	require.ErrorIs(t, err, sink.ErrLocked, "the lock works across Sink instances")

	require.NoError(t, os.Remove(filepath.Join(dir, "t-0001.lock")))
	wb, err := newSink(t, dir).Open(ctx, "t-0001")
	require.NoError(t, err)

	recs := sinktest.Records("t-0001", 1, 10)
	require.NoError(t, wa.Write(ctx, recs[:4]))
	require.NoError(t, wa.Commit(ctx, recs[3].Position))
	require.NoError(t, wb.Write(ctx, recs))
	require.ErrorIs(t, wb.Commit(ctx, recs[9].Position), sink.ErrFenced)

	// B also loses when only the checkpoint moved (an empty commit by A).
	require.NoError(t, os.Remove(filepath.Join(dir, "t-0001.lock"))) // B's
	wc, err := newSink(t, dir).Open(ctx, "t-0001")
	require.NoError(t, err)
	require.NoError(t, wa.Commit(ctx, recs[5].Position))
	require.NoError(t, wc.Write(ctx, recs))
	require.ErrorIs(t, wc.Commit(ctx, recs[9].Position), sink.ErrFenced)

	require.Equal(t, recs[:4], readRecords(t, dir)["t-0001"])
	info, err := os.Stat(filepath.Join(dir, "t-0001.jsonl"))
	require.NoError(t, err)
	m, err := readManifest(dir, "t-0001")
	require.NoError(t, err)
	require.Equal(t, m.Offset, info.Size(), "the fenced writers left no bytes behind")
	require.Equal(t, recs[5].Position, m.Checkpoint)
}

func TestDigestDirMatchesSourceDigest(t *testing.T) {
	dir := t.TempDir()
	var want digest.Digest
	wantTablets := map[string]digest.Digest{}
	for _, tablet := range []string{"t-0001", "t-0002"} {
		recs := sinktest.Records(tablet, 1, 50)
		commit(t, dir, tablet, recs[:30])
		commit(t, dir, tablet, recs) // re-read overlap is skipped
		var d digest.Digest
		for _, r := range recs {
			d.Add(sourceHash(r))
		}
		wantTablets[tablet] = d
		want = want.Plus(d)
	}

	got, err := DigestDir(dir)
	require.NoError(t, err)
	require.Equal(t, want, got.Total)
	require.Equal(t, wantTablets, got.Tablets)
	require.Empty(t, got.Duplicates)
}

func TestDigestDirReportsDuplicates(t *testing.T) {
	dir := t.TempDir()
	recs := sinktest.Records("t-0001", 1, 5)
	commit(t, dir, "t-0001", recs)
	clean, err := DigestDir(dir)
	require.NoError(t, err)

	// Duplicate the third line by hand, and commit it in the manifest.
	path := filepath.Join(dir, "t-0001.jsonl")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	dup := slices.Concat(lines[:3], [][]byte{lines[2]}, lines[3:])
	require.NoError(t, os.WriteFile(path, bytes.Join(dup, nil), 0o644))
	m, err := readManifest(dir, "t-0001")
	require.NoError(t, err)
	m.Offset += int64(len(lines[2]))
	require.NoError(t, writeManifest(dir, "t-0001", m))

	got, err := DigestDir(dir)
	require.NoError(t, err)
	require.Equal(t, []Duplicate{{Tablet: "t-0001", Position: "1.3", Count: 2}}, got.Duplicates)
	require.Equal(t, clean.Total.Records+1, got.Total.Records)
	require.Equal(t, clean.Total.Hash+sourceHash(recs[2]), got.Total.Hash, "the hash is additive: a duplicate adds its hash again")
}

// sourceHash is the record's hash as the source computes it.
func sourceHash(r source.Record) uint64 {
	return digest.Hash(digest.Fields{
		Tablet: r.Tablet, Position: r.Position.String(), Table: r.Table, Op: string(r.Op),
		Key: r.Key, Before: r.Before, After: r.After, CommitTime: r.CommitTime,
	})
}

// DigestDir digests the tablets' files in parallel: it must still add up
// every tablet, list every duplicate sorted, and fail the way reading the
// files in name order would (the first bad file's error).
func TestDigestDirOverManyTablets(t *testing.T) {
	dir := t.TempDir()
	var want digest.Digest
	var tablets []string
	for i := range 9 {
		tablet := fmt.Sprintf("t-%04d", 9-i) // written out of name order
		tablets = append(tablets, tablet)
		recs := sinktest.Records(tablet, 1, uint64(20+i))
		commit(t, dir, tablet, recs)
		for _, r := range recs {
			want.Add(sourceHash(r))
		}
	}
	// Duplicate the first line of two tablets' files.
	dupFirst := func(tablet string) {
		path := filepath.Join(dir, tablet+".jsonl")
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		first := data[:bytes.IndexByte(data, '\n')+1]
		require.NoError(t, os.WriteFile(path, append(slices.Clone(first), data...), 0o644))
		m, err := readManifest(dir, tablet)
		require.NoError(t, err)
		m.Offset += int64(len(first))
		require.NoError(t, writeManifest(dir, tablet, m))
	}
	dupFirst("t-0007")
	dupFirst("t-0002")

	got, err := DigestDir(dir)
	require.NoError(t, err)
	require.Len(t, got.Tablets, len(tablets))
	require.Equal(t, want.Records+2, got.Total.Records)
	require.Equal(t, []Duplicate{{Tablet: "t-0002", Position: "1.1", Count: 2}, {Tablet: "t-0007", Position: "1.1", Count: 2}}, got.Duplicates)

	// Two corrupt files: the error is the first one's by name.
	for _, tablet := range []string{"t-0008", "t-0004"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, tablet+".jsonl"), []byte("not json\n"), 0o644))
		m, err := readManifest(dir, tablet)
		require.NoError(t, err)
		m.Offset = int64(len("not json\n"))
		require.NoError(t, writeManifest(dir, tablet, m))
	}
	for range 20 {
		_, err = DigestDir(dir)
		require.ErrorIs(t, err, ErrCorrupt)
		require.Contains(t, err.Error(), "t-0004 line 1")
	}
}
