package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// SetTables changes what a running stream reads, and the readers follow
// the stream's record, not the worker's config (which here names
// public.items, a table the stream never published):
//   - a list with a table not there (or unlogged), not the role's, or
//     without a primary key, is refused as BAD_TABLES, naming it, and
//     nothing changes; a change older than the one made changes nothing;
//   - a table added is streamed from the change on, and a snapshot job of
//     it is taken and copied, though the config does not name it;
//   - a table removed is streamed no more, and a reader on the standby
//     still starts (its check reads the record with the publication);
//   - a snapshot job of a table the stream does not read is refused;
//   - the stream ensured again with its config's old tables is refused,
//     naming the tables the change left.
func TestSetTablesChangesWhatTheStreamReadsAndReadersFollowTheRecord(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 3*time.Minute)
	p := b.c.Shards[0].Primary
	require.NoError(t, p.Exec(ctx, `CREATE TABLE public.extra (id bigint PRIMARY KEY, v text);
		CREATE TABLE public.nokey (v text);
		CREATE TABLE public.notmine (id bigint PRIMARY KEY);
		CREATE UNLOGGED TABLE public.unlogged (id bigint PRIMARY KEY);
		ALTER TABLE public.extra OWNER TO `+pgbed.User+`; ALTER TABLE public.nokey OWNER TO `+pgbed.User+`;
		ALTER TABLE public.unlogged OWNER TO `+pgbed.User+`;
		INSERT INTO public.extra SELECT g, 'before ' || g FROM generate_series(1, 30) g`))
	const stream = "tables"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: []string{"public.orders"}, StartFrom: source.StartLatest})
	require.NoError(t, err)
	pub := postgres.PublicationName(stream)
	published := func() (n int) {
		require.NoError(t, p.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = $1`, pub).Scan(&n))
		return n
	}

	for _, bad := range []struct {
		tables []string
		says   string
	}{
		{[]string{"public.orders", "public.nope"}, "public.nope not there"},
		{[]string{"public.orders", "public.nokey"}, "public.nokey without a primary key"},
		{[]string{"public.orders", "public.notmine"}, "public.notmine not owned by the stream's role"},
		{[]string{"public.orders", "public.unlogged"}, "public.unlogged not there (or not a permanent table)"},
		{[]string{"public.orders", "public.orders"}, "tables[1]: \"public.orders\": want schema.table (letters, digits, _), each once"},
		{nil, "tables: must list the tables"},
	} {
		err := b.src.SetTables(ctx, stream, bad.tables, time.Now())
		require.ErrorContains(t, err, bad.says)
		c := b.src.Classify(err)
		require.Equal(t, source.Fatal, c.Action, "%v", err)
		require.Equal(t, "BAD_TABLES", c.Reason)
		require.Equal(t, 1, published(), "nothing changed")
	}

	first := time.Now()
	require.NoError(t, b.src.SetTables(ctx, stream, []string{"public.orders", "public.extra"}, first))
	require.NoError(t, b.src.SetTables(ctx, stream, []string{"public.orders", "public.extra"}, first), "the same change again changes nothing")
	require.NoError(t, b.src.SetTables(ctx, stream, []string{"public.orders"}, first.Add(-time.Minute)), "an older change arriving late changes nothing")
	require.Equal(t, 2, published())
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.extra VALUES (100, 'after'); INSERT INTO public.orders VALUES (1, 'c', 1, NULL, now())`))
	rd := b.primaryReader(t)
	got, cp := read(t, rd, stream, st.Start["s1"], 2)
	require.Equal(t, "public.extra", got[0].Table, "the table added streams from the change on")
	require.Equal(t, "public.orders", got[1].Table)

	err = b.src.Snapshot(ctx, stream, "s1", source.SnapshotJob{ID: "items", Tables: []string{"public.items"}})
	require.ErrorContains(t, err, "public.items is not a table the stream reads (source.tables: [public.orders public.extra])")
	require.Equal(t, "BAD_TABLES", b.src.Classify(err).Reason)
	require.NoError(t, b.src.Snapshot(ctx, stream, "s1", source.SnapshotJob{ID: "backfill", Tables: []string{"public.extra"}}))
	rd2 := b.primaryReader(t)
	recs, cp := readCopyOf(t, rd2, stream, cp, 10, source.CopySnapshot)
	require.Len(t, reads(recs)["public.extra"], 31, "the backfill copies the added table's rows, the ones from before too")
	require.NoError(t, rd.Close())
	require.NoError(t, rd2.Close())

	require.NoError(t, b.src.SetTables(ctx, stream, []string{"public.orders"}, time.Now()))
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.extra VALUES (101, 'removed'); INSERT INTO public.orders VALUES (2, 'c', 2, NULL, now())`))
	require.NoError(t, b.c.WaitReplayed(ctx))
	got, _ = read(t, b.reader(t, b.cfg.Shards[0].Replicas[1].Alias), stream, cp, -1)
	require.Len(t, got, 1, "the table removed streams no more: %+v", got)
	require.Equal(t, "public.orders", got[0].Table)

	_, err = b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: []string{"public.orders", "public.extra"}, StartFrom: source.StartLatest})
	require.ErrorContains(t, err, "reading [public.orders] (changed by configure)")
	require.Equal(t, "BAD_TABLES", b.src.Classify(err).Reason)
}
