package rawlines

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// record adds one row change with a key and images given as JSON.
func record(w *Writer, table, op, key, before, after string) {
	b := w.Record(table, op)
	b = append(b, key...)
	b = append(b, `,"before":`...)
	b = append(b, before...)
	b = append(b, `,"after":`...)
	b = append(b, after...)
	w.Add(b)
}

func TestWriterWritesTabletflowLinesNumberedByTermAndOrdinal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "-80.jsonl")
	syncs := 0
	w, err := Create(path, "raw", "-80", func(f *os.File) error { syncs++; return f.Sync() })
	require.NoError(t, err)
	defer w.Close()

	w.Begin()
	record(w, "customer", "insert", `{"id":1}`, "null", `{"id":1,"email":"a\"b"}`)
	record(w, "corder", "delete", `{"order_id":7}`, `{"order_id":7}`, "null")
	require.Equal(t, 2, w.Open())
	w.Commit(42, time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)))
	require.Equal(t, 0, w.Open())
	require.Equal(t, 2, w.Pending())
	w.Begin()
	record(w, "customer", "update", `{"id":1}`, `{"id":1}`, `{"id":1}`)
	w.Begin() // a transaction begun again drops what it had not committed
	require.Equal(t, 0, w.Open())

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Empty(t, data, "nothing is written before Flush")
	require.NoError(t, w.Flush())
	require.NoError(t, w.Flush(), "an empty batch is not written")
	require.Equal(t, 1, syncs)
	require.Equal(t, 1, w.Batches)
	require.Equal(t, uint64(2), w.Records)
	require.Equal(t, uint64(2), w.FirstCount)
	require.Positive(t, w.FirstCommit)

	data, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, `{"stream":"raw","tablet":"-80","position":"42.1","table":"customer","op":"insert","key":{"id":1},"before":null,"after":{"id":1,"email":"a\"b"},"commitTime":"2026-01-02T02:04:05Z"}
{"stream":"raw","tablet":"-80","position":"42.2","table":"corder","op":"delete","key":{"order_id":7},"before":{"order_id":7},"after":null,"commitTime":"2026-01-02T02:04:05Z"}
`, string(data))
	for line := range strings.Lines(string(data)) {
		require.True(t, json.Valid([]byte(line)), line)
	}
}
