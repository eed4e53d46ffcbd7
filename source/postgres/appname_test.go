package postgres_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// A reader whose worker died leaves its session holding the slot until
// wal_sender_timeout; the next reader of the stream ends that session by
// its application_name and reads at once. The name must still match
// when the server has cut it to 63 bytes or rewritten its non-ASCII
// characters: for a long stream ID, one that is not ASCII, and a plain
// one.
func TestAReaderEndsADeadReadersSessionWhateverTheStreamID(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1})
	ctx := ctxT(t, 2*time.Minute)
	p := b.c.Shards[0].Primary
	for _, stream := range []string{"plain", "orders-" + strings.Repeat("x", 80), "commandes-été-€"} {
		st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
		require.NoError(t, err)
		dead := b.primaryReader(t) // its worker is gone: the reader is never closed
		_, err = dead.GetChanges(ctx, source.ChangesRequest{Stream: stream, Tablet: "s1", From: st.Start["s1"], MaxRecords: 10, MaxWait: 100 * time.Millisecond})
		require.NoError(t, err)
		require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES ($1, 1, 'a', 1, 'x')`, len(stream)))
		recs, _ := read(t, b.primaryReader(t), stream, st.Start["s1"], 1)
		require.Len(t, recs, 1, "%s: the next reader read", stream)
	}
}
