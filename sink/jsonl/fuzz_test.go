package jsonl

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
)

// fuzzTablet is the one tablet the fuzz targets write files for.
const fuzzTablet = "t-0001"

// committedLines returns recs encoded as the sink writes them.
func committedLines(tb testing.TB, recs []source.Record) []byte {
	var buf []byte
	var err error
	for i := range recs {
		buf, err = appendLine(buf, linePrefix(stream, fuzzTablet), &recs[i])
		require.NoError(tb, err)
	}
	return buf
}

// readerSeeds are data files: three lines as the sink writes them, and
// damaged ones.
func readerSeeds(tb testing.TB) [][]byte {
	valid := committedLines(tb, sinktest.Records(fuzzTablet, 1, 3))
	return [][]byte{
		valid,
		{},
		valid[:len(valid)-1], // the last line without its newline
		bytes.Replace(valid, []byte(`"t-0001"`), []byte(`"t-0002"`), 1), // another tablet's line
		[]byte(`{"stream":"orders","tablet":"t-0001","position":"x","op":"nope","key":1}` + "\n"),
		[]byte("null\n"),
	}
}

// FuzzJSONLReader writes arbitrary bytes as a tablet's data file, every
// byte committed by a valid manifest, and reads the directory as a
// consumer does. ReadDir and DigestDir must not panic and must agree: both
// fail, with ErrCorrupt (the manifest is fine, so anything wrong is the
// data), and a nil result; or both succeed, with one line per committed
// newline, each of this tablet, and a digest counting exactly those lines.
func FuzzJSONLReader(f *testing.F) {
	for _, data := range readerSeeds(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(dataPath(dir, fuzzTablet), data, 0o644))
		require.NoError(t, writeManifest(dir, fuzzTablet, manifest{Seq: 1, Stream: stream, Tablet: fuzzTablet, Offset: int64(len(data))}))

		lines, err := ReadDir(dir)
		rep, derr := DigestDir(dir)
		if err != nil {
			require.Nil(t, lines)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Error(t, derr, "ReadDir failed (%v), DigestDir did not", err)
			require.ErrorIs(t, derr, ErrCorrupt)
			require.Zero(t, rep)
			return
		}
		require.NoError(t, derr, "ReadDir succeeded, DigestDir did not")
		require.NotNil(t, lines)
		n := bytes.Count(data, []byte("\n"))
		require.Len(t, lines[fuzzTablet], n, "one line per committed newline")
		require.Len(t, lines, min(n, 1), "no line, or lines of this tablet only")
		require.True(t, len(data) == 0 || data[len(data)-1] == '\n', "committed data ending mid-line was accepted")
		for _, l := range lines[fuzzTablet] {
			require.Equal(t, fuzzTablet, l.Tablet)
			_, _ = l.Record() // a bad position is Record's error, not a panic
		}
		require.Equal(t, uint64(n), rep.Total.Records)
		require.Equal(t, rep.Total, rep.Tablets[fuzzTablet])
		require.NotNil(t, rep.Duplicates)
	})
}

// slotFile returns a manifest file of two slots holding the JSON values m0
// and m1 as their manifests, each with its correct checksum, so the fuzzer
// reaches what is past the checksum. A slot too long for its 4096 bytes is
// cut, as a torn write would leave it.
func slotFile(m0, m1 []byte) []byte {
	out := make([]byte, 0, 2*slotSize)
	for _, m := range [][]byte{m0, m1} {
		s := fmt.Appendf(nil, `{"crc32c":%d,"manifest":%s}`, crc32.Checksum(m, castagnoli), m)
		s = s[:min(len(s), slotSize-1)]
		s = append(s, bytes.Repeat([]byte(" "), slotSize-1-len(s))...)
		out = append(append(out, s...), '\n')
	}
	return out
}

// manifestSeed is one input of FuzzJSONLManifest.
type manifestSeed struct {
	m0, m1 []byte
	slots  bool
}

// manifestSeeds are manifests for the data file of FuzzJSONLManifest (the
// first three of sinktest.Records): each slot current in turn, a torn
// slot, Seq at its limit, the format before the slots, and bad offsets.
func manifestSeeds(tb testing.TB) []manifestSeed {
	full := int64(len(committedLines(tb, sinktest.Records(fuzzTablet, 1, 3))))
	m := func(seq uint64, cp string, offset int64) []byte {
		return fmt.Appendf(nil, `{"seq":%d,"stream":"orders","tablet":"t-0001","checkpoint":%q,"offset":%d,"updated":"2026-11-30T10:00:00Z"}`, seq, cp, offset)
	}
	return []manifestSeed{
		{m(2, "1.3", full), m(1, "", 0), true},
		{m(2, "1.2", 10), m(3, "1.3", full), true},
		{m(1, "1.3", full), []byte(`{"crc32c":1,"manifest":{"seq":`), true},
		{m(math.MaxUint64, "1.3", full), m(math.MaxUint64-1, "1.2", 10), true},
		{[]byte(`{"stream":"orders","tablet":"t-0001","checkpoint":"1.3","offset":` + fmt.Sprint(full) + `}`), []byte{}, false},
		{[]byte(`{"offset":-1}`), []byte{}, false},
		{m(1, "1.3", full+1), m(0, "", 0), true},
	}
}

// FuzzJSONLManifest writes arbitrary manifest bytes beside a data file of
// three committed lines: with slots true, m0 and m1 are the two slots'
// manifest values (checksummed, so the fuzzer gets past the checksum);
// else m0 is the whole file (the format before the slots, or garbage).
// Neither ReadDir nor Open may panic, and both fail with ErrCorrupt if at
// all. A ReadDir that succeeds returns a prefix of the data's lines. An
// Open that succeeds starts at the manifest's checkpoint, leaves the
// manifest in slots and the data cut to the manifest's offset, and a
// commit on top is durable: the manifest holds its checkpoint, and a
// tablet that read back before it reads back after it, the commit's line
// last. (Open does not read the committed data, so a tablet readers
// already refuse may still open; the commit must then not be lost from
// the manifest.)
func FuzzJSONLManifest(f *testing.F) {
	recs := sinktest.Records(fuzzTablet, 1, 4)
	data := committedLines(f, recs[:3])
	for _, s := range manifestSeeds(f) {
		f.Add(s.m0, s.m1, s.slots)
	}
	f.Fuzz(func(t *testing.T, m0, m1 []byte, slots bool) {
		dir := t.TempDir()
		file := m0
		if slots {
			file = slotFile(m0, m1)
		}
		require.NoError(t, os.WriteFile(manifestPath(dir, fuzzTablet), file, 0o644))
		require.NoError(t, os.WriteFile(dataPath(dir, fuzzTablet), data, 0o644))
		want, _, merr := parseManifest(fuzzTablet, file)

		lines, err := ReadDir(dir)
		readable := err == nil
		if err != nil {
			require.Nil(t, lines)
			require.ErrorIs(t, err, ErrCorrupt)
		} else {
			require.NoError(t, merr, "ReadDir took a manifest parseManifest rejects")
			got := lines[fuzzTablet]
			require.LessOrEqual(t, len(got), len(recs)-1)
			for i, l := range got {
				r, err := l.Record()
				require.NoError(t, err)
				require.Equal(t, recs[i], r, "line %d is not the data's", i)
			}
		}

		s, err := New(dir, stream)
		require.NoError(t, err)
		defer s.Close()
		tw, err := s.Open(ctx, fuzzTablet)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		defer tw.Close()
		require.NoError(t, merr, "Open took a manifest parseManifest rejects")
		require.Equal(t, want.Checkpoint, tw.Checkpoint())
		info, err := os.Stat(manifestPath(dir, fuzzTablet))
		require.NoError(t, err)
		require.Equal(t, int64(2*slotSize), info.Size(), "Open leaves the manifest in slots")
		info, err = os.Stat(dataPath(dir, fuzzTablet))
		require.NoError(t, err)
		require.Equal(t, want.Offset, info.Size(), "Open cuts the data to the manifest's offset")

		cp := tw.Checkpoint()
		if cp.Index == math.MaxUint64 {
			return // no position after it in this term
		}
		next := recs[3]
		next.Position = source.Checkpoint{Term: cp.Term, Index: cp.Index + 1}
		require.NoError(t, tw.Write(ctx, []source.Record{next}))
		err = tw.Commit(ctx, next.Position)
		if want.Seq == math.MaxUint64 {
			// The next Seq would wrap: the commit is refused, not lost.
			require.ErrorIs(t, err, ErrCorrupt)
			stored, err := readManifest(dir, fuzzTablet)
			require.NoError(t, err)
			require.Equal(t, want.Checkpoint, stored.Checkpoint)
			info, err := os.Stat(dataPath(dir, fuzzTablet))
			require.NoError(t, err)
			require.Equal(t, want.Offset, info.Size(), "the refused commit left its line behind")
			return
		}
		require.NoError(t, err)
		stored, err := readManifest(dir, fuzzTablet)
		require.NoError(t, err)
		require.Equal(t, next.Position, stored.Checkpoint, "the commit is lost from the manifest")
		require.Equal(t, want.Offset+int64(len(committedLines(t, []source.Record{next}))), stored.Offset)
		if !readable {
			return
		}
		after, err := ReadDir(dir)
		require.NoError(t, err, "a tablet that read back before the commit does not after it")
		got := after[fuzzTablet]
		require.Len(t, got, len(lines[fuzzTablet])+1)
		for i, l := range lines[fuzzTablet] {
			require.Equal(t, l, got[i], "line %d changed in the commit", i)
		}
		last, err := got[len(got)-1].Record()
		require.NoError(t, err)
		require.Equal(t, next, last)
	})
}
