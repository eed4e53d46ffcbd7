package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
	pgsource "github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// flow streams tables of one shard of a test bed through the PostgreSQL
// source, read on the shard's primary, into a sink on the first shard's
// primary: what the GetChanges activity does, without Temporal.
type flow struct {
	db, sinkDB *pgbed.Node
	stream     string
	shard      string
	src        *pgsource.Source
	rd         source.ReplicaReader
	w          sink.TabletWriter
	cp         source.Checkpoint
	recs       []source.Record
}

// newFlow is newFlows of one shard.
func newFlow(t *testing.T, ddl string, tables []string, cfg pgsink.Config) *flow {
	return newFlows(t, 1, ddl, tables, cfg)[0]
}

// newFlows starts a bed of n shards, runs ddl on each primary as the
// superuser (tables it makes are given to the adapter's role, which
// publishes them), makes the stream over tables and opens each shard's
// tablet ("s1", "s2", …) in one sink of cfg.
func newFlows(t *testing.T, n int, ddl string, tables []string, cfg pgsink.Config) []*flow {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	bed := pgbed.StartT(t, pgbed.Options{Shards: n})
	env := map[string]string{}
	scfg := pgsource.Config{Tables: tables}
	for i, sh := range bed.Shards {
		require.NoError(t, sh.Primary.Exec(ctx, ddl))
		for _, tbl := range tables {
			require.NoError(t, sh.Primary.Exec(ctx, `ALTER TABLE `+tbl+` OWNER TO `+pgbed.User))
		}
		id := fmt.Sprintf("s%d", i+1)
		env["P"+id] = sh.Primary.DSN()
		scfg.Shards = append(scfg.Shards, pgsource.Shard{ID: id, Replicas: []pgsource.ShardReplica{
			{Alias: "zone1-" + id + "p", Cell: "zone1", Type: "PRIMARY", DSNEnv: "P" + id}}})
	}
	src, err := pgsource.New(scfg, func(k string) string { return env[k] })
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	const stream = "follow"
	st, err := src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: tables, StartFrom: source.StartEarliest})
	require.NoError(t, err)
	sinkDB := bed.Shards[0].Primary
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return sinkDB.DSN() })
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	var out []*flow
	for i, sh := range bed.Shards {
		id := fmt.Sprintf("s%d", i+1)
		rd, err := src.OpenReplica(ctx, source.Replica{Tablet: id, Alias: "zone1-" + id + "p"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = rd.(io.Closer).Close() })
		w, err := s.Open(ctx, id)
		require.NoError(t, err)
		out = append(out, &flow{db: sh.Primary, sinkDB: sinkDB, stream: stream, shard: id, src: src, rd: rd, w: w, cp: st.Start[id]})
	}
	return out
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// drain reads n more records in batches of a few, writing and committing
// each batch into the sink and acknowledging it, as GetChanges does. It
// checks that positions increase.
func (f *flow) drain(t *testing.T, n int) error {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	for got := 0; got < n; {
		b, err := f.rd.GetChanges(ctx, source.ChangesRequest{Stream: f.stream, Tablet: f.shard, From: f.cp, MaxRecords: 3, MaxWait: time.Second})
		require.NoError(t, err)
		for _, r := range b.Records {
			require.Equal(t, 1, r.Position.Compare(f.cp), "positions increase: %s after %s", r.Position, f.cp)
			f.cp = r.Position
		}
		f.cp = b.Checkpoint
		got += len(b.Records)
		f.recs = append(f.recs, b.Records...)
		if err := f.w.Write(ctx, b.Records); err != nil {
			return err
		}
		if err := f.w.Commit(ctx, b.Checkpoint); err != nil {
			return err
		}
		require.NoError(t, f.rd.Ack(ctx, f.stream, f.shard, b.Checkpoint))
	}
	return nil
}

// rowsOf reads a table's rows as sorted JSON texts (to_jsonb, less the
// sink's tabletflow_tablet column), duplicates kept: a multiset to compare
// a mirror table with its source.
func rowsOf(t *testing.T, db *pgbed.Node, table string) []string {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	conn, err := db.Connect(ctx)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT (to_jsonb(t) - 'tabletflow_tablet')::text FROM `+table+` t`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	slices.Sort(out)
	return out
}

// requireMirror checks that the mirror table holds exactly the rows of
// the source table on every flow's shard: the same multiset of rows, none
// twice more than there.
func requireMirror(t *testing.T, flows []*flow, table, mirror string) {
	t.Helper()
	var want []string
	for _, f := range flows {
		want = append(want, rowsOf(t, f.db, table)...)
	}
	slices.Sort(want)
	require.Equal(t, want, rowsOf(t, flows[0].sinkDB, mirror), "%s mirrors %s", mirror, table)
}

// Apply mode follows key changes: an update that changes a row's primary
// key moves the mirror's row (under the default replica identity, whose
// old tuple holds the key only, and under REPLICA IDENTITY FULL), an
// unchanged TOASTed value moving with it; a table without a primary key
// under REPLICA IDENTITY FULL (rows told apart only by their values,
// duplicates and nulls among them) keeps no stale row. The source leaves
// an unchanged TOASTed column out of a key change's after image, as of
// every update: never null.
func TestApplyModeFollowsKeyChangesAndTablesWithoutAKey(t *testing.T) {
	const ddl = `CREATE SCHEMA app;
		CREATE TABLE app.docs (id bigint PRIMARY KEY, rev int NOT NULL, body text);
		ALTER TABLE app.docs ALTER COLUMN body SET STORAGE EXTERNAL;
		CREATE TABLE app.fullrows (id bigint PRIMARY KEY, v text, body text);
		ALTER TABLE app.fullrows REPLICA IDENTITY FULL;
		ALTER TABLE app.fullrows ALTER COLUMN body SET STORAGE EXTERNAL;
		CREATE TABLE app.logs (a int, b text, c jsonb);
		ALTER TABLE app.logs REPLICA IDENTITY FULL;
		GRANT ALL ON SCHEMA app TO ` + pgbed.User
	tables := []string{"app.docs", "app.fullrows", "app.logs"}
	f := newFlow(t, ddl, tables, pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf"})
	ctx := ctxFor(t, time.Minute)
	big := `(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g)` // 12.8 kB, stored out of line
	for _, q := range []string{
		`INSERT INTO app.docs VALUES (1, 1, ` + big + `), (2, 1, ` + big + ` || 'b'), (3, 1, 'small')`,
		`UPDATE app.docs SET id = 1001, rev = rev + 1 WHERE id = 1`, // key change, body unchanged (TOASTed)
		`UPDATE app.docs SET rev = rev + 1 WHERE id = 2`,            // body unchanged
		`UPDATE app.docs SET id = 1003 WHERE id = 3`,                // key change, body inline
		`DELETE FROM app.docs WHERE id = 1003`,
		`UPDATE app.docs SET id = 1002, body = 'new' WHERE id = 2`, // key change, body changed
		`INSERT INTO app.fullrows VALUES (1, 'a', ` + big + `), (2, 'b', 'x')`,
		`UPDATE app.fullrows SET id = 11 WHERE id = 1`, // key change, body unchanged (TOASTed)
		`UPDATE app.fullrows SET v = 'c' WHERE id = 2`,
		`INSERT INTO app.logs VALUES (1, 'x', NULL), (1, 'x', NULL), (2, 'y', '{"k": 1}'), (4, NULL, NULL)`,
		`UPDATE app.logs SET b = 'z' WHERE a = 2`,
		`DELETE FROM app.logs WHERE ctid = (SELECT ctid FROM app.logs WHERE a = 1 LIMIT 1)`, // one of two equal rows
		`UPDATE app.logs SET a = 3 WHERE a = 1`,
		`UPDATE app.logs SET c = '[1]' WHERE a = 4`,
	} {
		require.NoError(t, f.db.Exec(ctx, q), q)
	}
	// 3+1+1+1+1+1 on docs, 2+1+1 on full, 4+1+1+1+1 on logs
	require.NoError(t, f.drain(t, 20))
	for _, r := range f.recs {
		if r.Table == "app.logs" {
			require.JSONEq(t, `{}`, string(r.Key), "a table without a primary key under REPLICA IDENTITY FULL has no key")
		}
		if r.Table == "app.docs" && r.Op == source.Update && strings.Contains(string(r.Key), "1001") {
			require.NotContains(t, string(r.After), `"body":null`, "an unchanged TOASTed value is left out of a key change's after, never null")
		}
	}
	requireMirror(t, []*flow{f}, "app.docs", "tf.app__docs")
	requireMirror(t, []*flow{f}, "app.fullrows", "tf.app__fullrows")
	requireMirror(t, []*flow{f}, "app.logs", "tf.app__logs")
}

// A key change moves a row of a given table too: the row at the before
// image's key goes, and its columns the after image leaves out (an
// unchanged TOASTed value) come along in their types; a generated column
// is computed again. A key change onto a key the table holds (a snapshot's
// copy already had it) sets that row.
func TestApplyModeMovesAGivenTablesRowOnAKeyChange(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := ctxFor(t, time.Minute)
	require.NoError(t, db.Exec(ctx, `CREATE SCHEMA app;
		GRANT USAGE ON SCHEMA app TO `+pgbed.User+`;
		CREATE TABLE app.docs (region text, id bigint, placed date, tags text[], body text,
			twice bigint GENERATED ALWAYS AS (id * 2) STORED, PRIMARY KEY (region, id));
		GRANT SELECT, INSERT, UPDATE, DELETE ON app.docs TO `+pgbed.User))
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf", Tables: map[string]string{"public.docs": "app.docs"}}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	doc := func(pos uint64, op source.Op, key, before, after string) source.Record {
		r := rec(pos, op, key, after)
		r.Table = "public.docs"
		if before != "" {
			r.Before = []byte(before)
		}
		return r
	}
	batch := []source.Record{
		doc(1, source.Insert, `{"region":"eu","id":1}`, "", `{"region":"eu","id":1,"placed":"2026-12-01","tags":["a","b c"],"body":"long"}`),
		doc(2, source.Insert, `{"region":"eu","id":2}`, "", `{"region":"eu","id":2,"placed":"2026-12-02","tags":[],"body":"two"}`),
		doc(3, source.Insert, `{"region":"eu","id":9}`, "", `{"region":"eu","id":9,"body":"copied"}`),
		// key-only before image, body left out: carried over
		doc(4, source.Update, `{"region":"eu","id":5}`, `{"region":"eu","id":1}`, `{"region":"eu","id":5,"placed":"2026-12-05","tags":["a","b c"]}`),
		doc(5, source.Update, `{"region":"us","id":2}`, `{"region":"eu","id":2}`, `{"region":"us","id":2,"body":"moved"}`),
		doc(6, source.Update, `{"region":"eu","id":9}`, `{"region":"us","id":7}`, `{"region":"eu","id":9,"body":"again"}`), // old key not there, new one is
	}
	require.NoError(t, w.Write(ctx, batch))
	require.NoError(t, w.Commit(ctx, batch[len(batch)-1].Position))
	got, err := db.Query(ctx, `SELECT region, id::text AS id, placed::text AS placed, tags::text AS tags, body, twice::text AS twice
		FROM app.docs ORDER BY region, id`)
	require.NoError(t, err)
	require.Equal(t, []map[string]any{
		{"region": "eu", "id": "5", "placed": "2026-12-05", "tags": `{a,"b c"}`, "body": "long", "twice": "10"},
		{"region": "eu", "id": "9", "placed": nil, "tags": nil, "body": "again", "twice": "18"},
		{"region": "us", "id": "2", "placed": "2026-12-02", "tags": "{}", "body": "moved", "twice": "4"},
	}, got)
}

// A key too large for a btree index row (54000, "index row size … exceeds
// btree … maximum") is a record the sink cannot store: the tablet fails
// naming it (SINK_BAD_RECORD), rather than retrying the same batch for
// ever as unavailable (SINK_IO). Nothing of the batch is written.
func TestApplyModeRefusesAKeyTooLargeForItsIndex(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := ctxFor(t, time.Minute)
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf"}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	huge := make([]byte, 8192)
	_, _ = rand.Read(huge)
	key := fmt.Sprintf(`{"id":%q}`, hex.EncodeToString(huge)) // 16 kB that compress badly
	batch := []source.Record{
		rec(1, source.Insert, `{"id":"small"}`, `{"v":1}`),
		rec(2, source.Insert, key, `{"v":2}`),
	}
	require.NoError(t, w.Write(ctx, batch))
	err = w.Commit(ctx, batch[1].Position)
	require.ErrorIs(t, err, sink.ErrBadRecord, "%v", err)
	require.ErrorContains(t, err, "54000")
	require.ErrorContains(t, err, "insert of public.orders at 1.2", "the error names the record")
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM tf.public__orders`).Scan(&n))
	require.Zero(t, n, "nothing of the batch is written")
	w2, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	require.True(t, w2.Checkpoint().IsZero(), "the checkpoint stays")
}

// A table whose REPLICA IDENTITY USING INDEX is another index than its
// primary key is keyed by that index's columns, which PostgreSQL sends
// on a delete and on an update that changes them: every record's key is
// usable (never null), deletes and updates of the primary key reach their
// mirror row, and the mirror equals the table.
func TestApplyModeFollowsATableKeyedByItsReplicaIdentityIndex(t *testing.T) {
	const ddl = `CREATE SCHEMA app;
		CREATE TABLE app.accounts (id bigint PRIMARY KEY, email text NOT NULL, name text);
		CREATE UNIQUE INDEX accounts_email ON app.accounts (email);
		ALTER TABLE app.accounts REPLICA IDENTITY USING INDEX accounts_email;
		GRANT ALL ON SCHEMA app TO ` + pgbed.User
	f := newFlow(t, ddl, []string{"app.accounts"}, pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf"})
	ctx := ctxFor(t, time.Minute)
	for _, q := range []string{
		`INSERT INTO app.accounts VALUES (1, 'a@x', 'a'), (2, 'b@x', 'b'), (3, 'c@x', 'c'), (4, 'd@x', 'd')`,
		`UPDATE app.accounts SET name = 'a2' WHERE id = 1`,
		`UPDATE app.accounts SET email = 'b2@x' WHERE id = 2`, // the identity changes
		`UPDATE app.accounts SET id = 30 WHERE id = 3`,        // the primary key changes, the identity does not
		`DELETE FROM app.accounts WHERE id = 4`,
		`DELETE FROM app.accounts WHERE id = 30`,
	} {
		require.NoError(t, f.db.Exec(ctx, q), q)
	}
	require.NoError(t, f.drain(t, 9))
	for _, r := range f.recs {
		require.NotContains(t, string(r.Key), "null", "%s at %s: a usable key", r.Op, r.Position)
	}
	requireMirror(t, []*flow{f}, "app.accounts", "tf.app__accounts")
}

// TRUNCATE is followed (the case: 50 rows mirrored, then TRUNCATE
// and 5 new rows on the source): the source delivers a record of op
// "truncate" per table, and apply mode removes that shard's rows of the
// table, and only that shard's: the other shard's rows of the same mirror
// tables stay, equal rows of a table without a key among them.
func TestApplyModeRemovesOnlyTheTruncatedShardsRows(t *testing.T) {
	const ddl = `CREATE SCHEMA app;
		CREATE TABLE app.orders (id bigint PRIMARY KEY, v text);
		CREATE TABLE app.tags (a int, b text);
		ALTER TABLE app.tags REPLICA IDENTITY FULL;
		GRANT ALL ON SCHEMA app TO ` + pgbed.User
	tables := []string{"app.orders", "app.tags"}
	flows := newFlows(t, 2, ddl, tables, pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf"})
	ctx := ctxFor(t, time.Minute)
	s1, s2 := flows[0], flows[1]
	require.NoError(t, s1.db.Exec(ctx, `INSERT INTO app.orders SELECT g, 'one' FROM generate_series(1, 50) g;
		INSERT INTO app.tags VALUES (1, 'x'), (2, 'y')`))
	require.NoError(t, s2.db.Exec(ctx, `INSERT INTO app.orders SELECT g, 'two' FROM generate_series(1001, 1010) g;
		INSERT INTO app.tags VALUES (1, 'x'), (3, 'z')`))
	require.NoError(t, s1.drain(t, 52))
	require.NoError(t, s2.drain(t, 12))
	requireMirror(t, flows, "app.orders", "tf.app__orders")
	requireMirror(t, flows, "app.tags", "tf.app__tags")

	require.NoError(t, s1.db.Exec(ctx, `TRUNCATE app.orders, app.tags`))
	require.NoError(t, s1.db.Exec(ctx, `INSERT INTO app.orders SELECT g, 'new' FROM generate_series(51, 55) g;
		INSERT INTO app.tags VALUES (1, 'x')`))
	from := len(s1.recs)
	require.NoError(t, s1.drain(t, 8))
	var truncated []string
	for _, r := range s1.recs[from:] {
		if r.Op == source.Truncate {
			truncated = append(truncated, r.Table)
			require.Nil(t, r.Key, "a truncate has no key")
			require.Nil(t, r.Before)
			require.Nil(t, r.After)
		}
	}
	require.ElementsMatch(t, tables, truncated, "a truncate record per table")
	requireMirror(t, flows, "app.orders", "tf.app__orders")
	requireMirror(t, flows, "app.tags", "tf.app__tags")
	var n int
	require.NoError(t, s1.sinkDB.QueryRow(ctx, `SELECT count(*) FROM tf.app__orders`).Scan(&n))
	require.Equal(t, 15, n, "shard s1's 5 new rows and s2's 10")
}

// Changelog mode stores a truncate like any record: its table and op, no
// key, before or after.
func TestChangelogModeStoresATruncate(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := ctxFor(t, time.Minute)
	s, err := pgsink.New(ctx, pgsink.Config{Kind: "postgres", DSNEnv: "D", Schema: "tf"}, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	batch := []source.Record{
		rec(1, source.Insert, `{"id":1}`, `{"id":1}`),
		{Tablet: "t-0001", Position: source.Checkpoint{Term: 1, Index: 2}, Table: "public.orders", Op: source.Truncate, CommitTime: time.Unix(1, 0)},
	}
	require.NoError(t, w.Write(ctx, batch))
	require.NoError(t, w.Commit(ctx, batch[1].Position))
	got := read(t, db, "tf.changes")["t-0001"]
	require.Len(t, got, 2)
	require.Equal(t, source.Truncate, got[1].Op)
	require.Equal(t, "public.orders", got[1].Table)
	require.Nil(t, got[1].Key)
	require.Nil(t, got[1].After)
}

// A stream's publication made by a tabletflow from before truncates were
// followed does not publish them: the reader makes it publish them and
// starts, so a TRUNCATE from then on is delivered, not passed over, and
// the stream is not failed by the upgrade.
func TestAPublicationWithoutTruncatesIsMadeToPublishThem(t *testing.T) {
	f := newFlow(t, `CREATE SCHEMA app; CREATE TABLE app.t (id int PRIMARY KEY); GRANT ALL ON SCHEMA app TO `+pgbed.User, []string{"app.t"},
		pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf"})
	ctx := ctxFor(t, time.Minute)
	pub := pgsource.PublicationName(f.stream)
	require.NoError(t, f.db.Exec(ctx, `ALTER PUBLICATION `+pub+` SET (publish = 'insert, update, delete')`))
	rd, err := f.src.OpenReplica(ctx, source.Replica{Tablet: f.shard, Alias: "zone1-s1p"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.(io.Closer).Close() })
	_, err = rd.GetChanges(ctx, source.ChangesRequest{Stream: f.stream, Tablet: f.shard, From: f.cp, MaxRecords: 10, MaxWait: 100 * time.Millisecond})
	require.NoError(t, err)
	var truncates bool
	require.NoError(t, f.db.QueryRow(ctx, `SELECT pubtruncate FROM pg_publication WHERE pubname = $1`, pub).Scan(&truncates))
	require.True(t, truncates, "the publication publishes truncates after the reader started")

	require.NoError(t, f.db.Exec(ctx, `INSERT INTO app.t VALUES (1); TRUNCATE app.t`))
	var got []source.Record
	from := f.cp
	require.Eventually(t, func() bool {
		b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: f.stream, Tablet: f.shard, From: from, MaxRecords: 10, MaxWait: 200 * time.Millisecond})
		require.NoError(t, err)
		got, from = append(got, b.Records...), b.Checkpoint
		return len(got) >= 2
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, source.Insert, got[0].Op)
	require.Equal(t, source.Truncate, got[1].Op)
	require.Equal(t, "app.t", got[1].Table)
}

// A given table follows truncates when it has a tabletflow_tablet column,
// which the sink fills: a truncate removes its tablet's rows only. Without
// the column, a truncate fails the tablet naming it, nothing written; so
// does one of a mirror table holding rows that say no tablet (made by an
// earlier version).
func TestApplyModeTruncatesAGivenTableByItsTabletColumn(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := ctxFor(t, time.Minute)
	require.NoError(t, db.Exec(ctx, `CREATE SCHEMA app;
		GRANT USAGE ON SCHEMA app TO `+pgbed.User+`;
		CREATE TABLE app.owned (id bigint PRIMARY KEY, v text, tabletflow_tablet text);
		CREATE TABLE app.plain (id bigint PRIMARY KEY, v text);
		GRANT SELECT, INSERT, UPDATE, DELETE ON app.owned, app.plain TO `+pgbed.User))
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf",
		Tables: map[string]string{"public.owned": "app.owned", "public.plain": "app.plain"}}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	on := func(tablet, table string, pos uint64, op source.Op, id int) source.Record {
		r := source.Record{Tablet: tablet, Position: source.Checkpoint{Term: 1, Index: pos}, Table: table, Op: op, CommitTime: time.Unix(1, 0)}
		if op != source.Truncate {
			r.Key, r.After = []byte(fmt.Sprintf(`{"id":%d}`, id)), []byte(fmt.Sprintf(`{"id":%d,"v":"x"}`, id))
		}
		return r
	}
	commit := func(tablet string, recs ...source.Record) error {
		w, err := s.Open(ctx, tablet)
		require.NoError(t, err)
		if err := w.Write(ctx, recs); err != nil {
			return err
		}
		return w.Commit(ctx, recs[len(recs)-1].Position)
	}
	require.NoError(t, commit("t-1", on("t-1", "public.owned", 1, source.Insert, 1), on("t-1", "public.owned", 2, source.Insert, 2),
		on("t-1", "public.plain", 3, source.Insert, 1)))
	require.NoError(t, commit("t-2", on("t-2", "public.owned", 1, source.Insert, 3), on("t-2", "public.plain", 2, source.Insert, 3)))
	require.NoError(t, commit("t-1", on("t-1", "public.owned", 4, source.Truncate, 0), on("t-1", "public.owned", 5, source.Insert, 4)))
	got, err := db.Query(ctx, `SELECT id::text AS id, tabletflow_tablet AS tablet FROM app.owned ORDER BY id`)
	require.NoError(t, err)
	require.Equal(t, []map[string]any{{"id": "3", "tablet": "t-2"}, {"id": "4", "tablet": "t-1"}}, got)

	err = commit("t-1", on("t-1", "public.plain", 6, source.Truncate, 0))
	require.ErrorIs(t, err, sink.ErrBadRecord)
	require.ErrorContains(t, err, "has no column tabletflow_tablet")
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM app.plain`).Scan(&n))
	require.Equal(t, 2, n, "nothing removed")

	// A mirror table an earlier version made: its rows say no tablet.
	require.NoError(t, db.Exec(ctx, `CREATE TABLE tf.public__legacy (id jsonb PRIMARY KEY, v jsonb);
		ALTER TABLE tf.public__legacy OWNER TO `+pgbed.User+`;
		INSERT INTO tf.public__legacy VALUES ('1', '"x"')`))
	err = commit("t-2", on("t-2", "public.legacy", 3, source.Truncate, 0))
	require.ErrorIs(t, err, sink.ErrBadRecord)
	require.ErrorContains(t, err, "holds rows without their tablet")
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM tf.public__legacy`).Scan(&n))
	require.Equal(t, 1, n, "nothing removed")
}
