package jsonl

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	segjson "github.com/segmentio/encoding/json"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
)

const benchBatch = 1000

// benchRecords returns one batch of inserts whose key and after image are
// about 200 bytes of JSON together.
func benchRecords() []source.Record {
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	recs := make([]source.Record, benchBatch)
	for i := range recs {
		recs[i] = source.Record{
			Tablet:     "t-0001",
			CommitTime: at.Add(time.Duration(i) * time.Microsecond),
			Table:      "orders",
			Op:         source.Insert,
			Key:        json.RawMessage(fmt.Sprintf(`{"id":%d}`, 1000000+i)),
			After: json.RawMessage(fmt.Sprintf(`{"customer":"c-%06d","id":%d,"lines":3,"note":"deliver to the back door",`+
				`"sku":"sku-%010d","status":"paid","total":"%d.95","ts":"2026-11-30T10:00:00Z"}`, i, 1000000+i, i*31, i)),
		}
	}
	return recs
}

// nextBatch moves the batch's positions past the previous one's.
func nextBatch(recs []source.Record, n int) {
	for i := range recs {
		recs[i].Position = source.Checkpoint{Term: 1, Index: uint64(n*benchBatch + i + 1)}
	}
}

// BenchmarkCommit stores 1000-record batches with one Commit each. The
// baseline writes the same lines with bufio and one fsync per batch and no
// manifest, so jsonl/baseline is the price of exactly-once.
func BenchmarkCommit(b *testing.B) {
	recs := benchRecords()
	prefix := linePrefix(stream, "t-0001")
	var batchBytes int64
	for i := range recs {
		line, err := appendLine(nil, prefix, &recs[i])
		require.NoError(b, err)
		batchBytes += int64(len(line))
	}
	report := func(b *testing.B, batches int) {
		b.ReportMetric(float64(batches*benchBatch)/b.Elapsed().Seconds(), "records/s")
	}

	b.Run("jsonl", func(b *testing.B) {
		s, err := New(b.TempDir(), stream)
		require.NoError(b, err)
		defer s.Close()
		w, err := s.Open(ctx, "t-0001")
		require.NoError(b, err)
		b.SetBytes(batchBytes)
		n := 0
		for b.Loop() {
			nextBatch(recs, n)
			n++
			if err := w.Write(ctx, recs); err != nil {
				b.Fatal(err)
			}
			if err := w.Commit(ctx, recs[benchBatch-1].Position); err != nil {
				b.Fatal(err)
			}
		}
		report(b, n)
	})

	b.Run("baseline", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "t-0001.jsonl"))
		require.NoError(b, err)
		defer f.Close()
		bw := bufio.NewWriterSize(f, 64<<10)
		b.SetBytes(batchBytes)
		var line []byte
		n := 0
		for b.Loop() {
			nextBatch(recs, n)
			n++
			for i := range recs {
				if line, err = appendLine(line[:0], prefix, &recs[i]); err != nil {
					b.Fatal(err)
				}
				_, _ = bw.Write(line)
			}
			if err := bw.Flush(); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
		report(b, n)
	})
}

// BenchmarkAppendLine is the encoding alone, per record.
func BenchmarkAppendLine(b *testing.B) {
	recs := benchRecords()
	nextBatch(recs, 0)
	prefix := linePrefix(stream, "t-0001")
	buf, err := appendLine(nil, prefix, &recs[0])
	require.NoError(b, err)
	b.SetBytes(int64(len(buf)))
	i := 0
	for b.Loop() {
		buf, _ = appendLine(buf[:0], prefix, &recs[i%benchBatch])
		i++
	}
}

// BenchmarkDigestDir digests a directory of 4 tablets × 50,000 records
// (how the benchmarks and the e2e tests check a sink against tabletd).
func BenchmarkDigestDir(b *testing.B) {
	dir := b.TempDir()
	s, err := New(dir, stream)
	require.NoError(b, err)
	recs := benchRecords()
	for tb := range 4 {
		tablet := fmt.Sprintf("t-%04d", tb+1)
		for i := range recs {
			recs[i].Tablet = tablet
		}
		w, err := s.Open(ctx, tablet)
		require.NoError(b, err)
		for n := range 50 {
			nextBatch(recs, n)
			require.NoError(b, w.Write(ctx, recs))
			require.NoError(b, w.Commit(ctx, recs[benchBatch-1].Position))
		}
		require.NoError(b, w.Close())
	}
	require.NoError(b, s.Close())
	for b.Loop() {
		r, err := DigestDir(dir)
		require.NoError(b, err)
		require.Equal(b, uint64(200_000), r.Total.Records)
	}
	b.ReportMetric(float64(200_000*b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkParseLine parses one line as scanFile does (segmentio) against
// encoding/json, the baseline it replaced, in the same run.
func BenchmarkParseLine(b *testing.B) {
	recs := benchRecords()
	nextBatch(recs, 0)
	line, err := appendLine(nil, linePrefix(stream, "t-0001"), &recs[0])
	require.NoError(b, err)
	for _, c := range []struct {
		name      string
		unmarshal func([]byte, any) error
	}{{"segmentio", segjson.Unmarshal}, {"encoding-json", json.Unmarshal}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				var l Line
				if err := c.unmarshal(line, &l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
