package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// resyncTablet writes one tablet's records into an apply-mode sink, with
// positions it numbers itself.
type resyncTablet struct {
	t      *testing.T
	s      sink.Sink
	tablet string
	pos    uint64
}

// rec is the tablet's next record: a marker (op alone), a change of a
// keyed table by id with a value, or of a keyless table (key {}) by n.
func (w *resyncTablet) rec(op source.Op, table string, id int, v string) source.Record {
	w.pos++
	r := source.Record{Tablet: w.tablet, Position: source.Checkpoint{Term: 1, Index: w.pos}, Op: op, CommitTime: time.Unix(1, 0)}
	if op.Marker() {
		return r
	}
	r.Table = table
	img := json.RawMessage(fmt.Sprintf(`{"id":%d,"v":%q}`, id, v))
	r.Key = json.RawMessage(fmt.Sprintf(`{"id":%d}`, id))
	if table == "public.log" {
		img, r.Key = json.RawMessage(fmt.Sprintf(`{"n":%d}`, id)), json.RawMessage(`{}`)
	}
	if op == source.Delete {
		r.Before = img
	} else {
		r.After = img
	}
	return r
}

// commit writes recs and commits the last one's position, on a writer
// opened for the batch.
func (w *resyncTablet) commit(recs ...source.Record) error {
	ctx := context.Background()
	tw, err := w.s.Open(ctx, w.tablet)
	require.NoError(w.t, err)
	defer tw.Close()
	if err := tw.Write(ctx, recs); err != nil {
		return err
	}
	return tw.Commit(ctx, recs[len(recs)-1].Position)
}

// ownedRows lists a table's rows as "<id or n>:<owner>", the owner "stale"
// for a row a resync marked, sorted.
func ownedRows(t *testing.T, db *pgbed.Node, table, idCol string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT `+idCol+`::text AS id,
		CASE WHEN length(tabletflow_tablet) > 255 THEN 'stale:' || right(tabletflow_tablet, 3) ELSE tabletflow_tablet END AS owner FROM `+table)
	require.NoError(t, err)
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		out = append(out, fmt.Sprint(r["id"], ":", r["owner"]))
	}
	slices.Sort(out)
	return out
}

// sorted sorts rows as ownedRows does.
func sorted(rows []string) []string { return slices.Sorted(slices.Values(rows)) }

// Apply mode follows a resync: at its begin the tablet's rows in every
// table are marked stale, in the batch's transaction, the mirror tables
// an earlier process made among them; a row the copy gives again (a read),
// updates or inserts is the tablet's again; at the end the rows still
// stale are deleted. Another tablet's rows are untouched; a batch not
// committed (a crash, a row that fails, a fenced writer) marks nothing; a second begin starts the copy over; in a
// table without a key a delete after the begin removes a row the copy
// gave, never a stale one.
func TestApplyModeResyncDeletesTheTabletsRowsItsCopyDidNotGive(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := ctxFor(t, 2*time.Minute)
	require.NoError(t, db.Exec(ctx, `CREATE SCHEMA app;
		GRANT USAGE ON SCHEMA app TO `+pgbed.User+`;
		CREATE TABLE app.owned (id bigint PRIMARY KEY, v text, tabletflow_tablet text);
		GRANT SELECT, INSERT, UPDATE, DELETE ON app.owned TO `+pgbed.User))
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf",
		Tables: map[string]string{"public.owned": "app.owned"}}
	newSink := func() sink.Sink {
		s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	orders := func() []string { return ownedRows(t, db, "tf.public__orders", "id") }
	items := func() []string { return ownedRows(t, db, "tf.public__items", "id") }
	owned := func() []string { return ownedRows(t, db, "app.owned", "id") }
	logs := func() []string { return ownedRows(t, db, "tf.public__log", "n") }

	// An earlier process made the mirror tables and wrote both tablets.
	first := newSink()
	t1 := &resyncTablet{t: t, s: first, tablet: "t-1"}
	t2 := &resyncTablet{t: t, s: first, tablet: "t-2"}
	var recs []source.Record
	for id := 1; id <= 6; id++ {
		recs = append(recs, t1.rec(source.Insert, "public.orders", id, "old"))
	}
	recs = append(recs, t1.rec(source.Insert, "public.items", 1, "old"), t1.rec(source.Insert, "public.items", 2, "old"),
		t1.rec(source.Insert, "public.owned", 1, "old"), t1.rec(source.Insert, "public.owned", 2, "old"),
		t1.rec(source.Insert, "public.log", 1, ""), t1.rec(source.Insert, "public.log", 1, ""), t1.rec(source.Insert, "public.log", 2, ""))
	require.NoError(t, t1.commit(recs...))
	require.NoError(t, t2.commit(t2.rec(source.Insert, "public.orders", 100, "x"), t2.rec(source.Insert, "public.items", 100, "x"),
		t2.rec(source.Insert, "public.owned", 100, "x"), t2.rec(source.Insert, "public.log", 1, "")))
	require.NoError(t, first.Close())
	t2Orders, t2Items, t2Owned := []string{"100:t-2"}, []string{"100:t-2"}, []string{"100:t-2"}

	// This process knows no table yet. A begin, and the copy under way.
	s := newSink()
	t1.s, t2.s = s, s
	require.NoError(t, t1.commit(t1.rec(source.ResyncBegin, "", 0, ""),
		t1.rec(source.Read, "public.orders", 1, "old"),   // given again
		t1.rec(source.Update, "public.orders", 2, "new"), // changed after the begin
		t1.rec(source.Insert, "public.orders", 7, "new"), // new after the begin
		t1.rec(source.Delete, "public.orders", 3, ""),    // gone after the begin
		t1.rec(source.Read, "public.log", 1, "")))
	require.Equal(t, sorted([]string{"1:t-1", "100:t-2", "2:t-1", "4:stale:t-1", "5:stale:t-1", "6:stale:t-1", "7:t-1"}), orders(),
		"rows of the tablet not given since the begin are stale until the end")
	require.Equal(t, sorted(append([]string{"1:stale:t-1", "2:stale:t-1"}, t2Items...)), items())
	require.Equal(t, sorted([]string{"1:stale:t-1", "100:t-2", "2:stale:t-1"}), owned())
	require.Equal(t, sorted([]string{"1:stale:t-1", "1:stale:t-1", "1:t-1", "1:t-2", "2:stale:t-1"}), logs())

	// The source still has two equal rows n=1 and deletes one of them
	// after the copy: the row the copy gave goes, not a stale one.
	require.NoError(t, t1.commit(t1.rec(source.Read, "public.log", 1, ""), t1.rec(source.Delete, "public.log", 1, ""),
		t1.rec(source.Read, "public.items", 2, "old"), t1.rec(source.Read, "public.owned", 2, "old"),
		t1.rec(source.ResyncEnd, "", 0, "")))
	require.Equal(t, sorted([]string{"1:t-1", "100:t-2", "2:t-1", "7:t-1"}), orders(), "the rows still stale at the end are deleted")
	require.Equal(t, sorted([]string{"100:t-2", "2:t-1"}), items())
	require.Equal(t, sorted([]string{"100:t-2", "2:t-1"}), owned())
	require.Equal(t, sorted([]string{"1:t-1", "1:t-2"}), logs())

	// A begin in a batch never committed (a crash): nothing is marked.
	crashed := newSink()
	w, err := crashed.Open(ctx, "t-1")
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, []source.Record{t1.rec(source.ResyncBegin, "", 0, "")}))
	require.NoError(t, crashed.Close()) // the writer abandoned, never committed
	// Nor in a batch whose commit fails: a row a column refuses after
	// the begin (in the transaction), or a writer fenced by another.
	begin := t1.rec(source.ResyncBegin, "", 0, "")
	bad := t1.rec(source.Insert, "public.owned", 9, "x")
	bad.Key, bad.After = json.RawMessage(`{"id":"nine"}`), json.RawMessage(`{"id":"nine"}`)
	err = t1.commit(begin, bad)
	require.ErrorIs(t, err, sink.ErrBadRecord)
	stale, err := s.Open(ctx, "t-1")
	require.NoError(t, err)
	defer stale.Close()
	require.NoError(t, t1.commit(t1.rec(source.Update, "public.orders", 7, "newer")))
	cp := t1.pos
	require.NoError(t, stale.Write(ctx, []source.Record{t1.rec(source.ResyncBegin, "", 0, "")}))
	require.ErrorIs(t, stale.Commit(ctx, source.Checkpoint{Term: 1, Index: t1.pos}), sink.ErrFenced)
	require.Equal(t, sorted([]string{"1:t-1", "100:t-2", "2:t-1", "7:t-1"}), orders(), "a begin not committed marks nothing")
	require.Equal(t, sorted([]string{"100:t-2", "2:t-1"}), owned())
	w, err = s.Open(ctx, "t-1")
	require.NoError(t, err)
	require.Equal(t, source.Checkpoint{Term: 1, Index: cp}, w.Checkpoint())
	require.NoError(t, w.Close())

	// A begin, part of a copy, a second begin (the copy starts over), its
	// copy, the end: what only the first copy gave is gone.
	require.NoError(t, t1.commit(t1.rec(source.ResyncBegin, "", 0, ""), t1.rec(source.Read, "public.orders", 1, "old"),
		t1.rec(source.Read, "public.owned", 2, "old")))
	require.NoError(t, t1.commit(t1.rec(source.ResyncBegin, "", 0, "")))
	require.Equal(t, sorted([]string{"1:stale:t-1", "100:t-2", "2:stale:t-1", "7:stale:t-1"}), orders(), "the second begin marks again")
	require.NoError(t, t1.commit(t1.rec(source.Read, "public.orders", 7, "new"), t1.rec(source.ResyncEnd, "", 0, "")))
	require.Equal(t, sorted([]string{"100:t-2", "7:t-1"}), orders())
	require.Equal(t, t2Items, items())
	require.Equal(t, t2Owned, owned())
	require.Equal(t, []string{"1:t-2"}, logs())
	require.Equal(t, t2Orders, slices.DeleteFunc(orders(), func(r string) bool { return strings.HasSuffix(r, ":t-1") }),
		"the other tablet's rows are untouched throughout")
}

// A resync marker cannot be followed where the sink cannot tell the
// tablet's rows: a given table without the tabletflow_tablet column, or a
// table of the sink's schema whose rows do not say their tablet (made by
// an earlier version). The batch fails whole with ErrBadRecord naming the
// table and the column; nothing is marked or written, the checkpoint
// stays.
func TestApplyModeRefusesAResyncWhereItCannotTellTheTabletsRows(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := ctxFor(t, time.Minute)
	require.NoError(t, db.Exec(ctx, `CREATE SCHEMA app;
		GRANT USAGE ON SCHEMA app TO `+pgbed.User+`;
		CREATE TABLE app.plain (id bigint PRIMARY KEY, v text);
		GRANT SELECT, INSERT, UPDATE, DELETE ON app.plain TO `+pgbed.User))
	newTablet := func(cfg pgsink.Config) *resyncTablet {
		s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return &resyncTablet{t: t, s: s, tablet: "t-1"}
	}
	checkpoint := func(tw *resyncTablet) source.Checkpoint {
		w, err := tw.s.Open(ctx, tw.tablet)
		require.NoError(t, err)
		defer w.Close()
		return w.Checkpoint()
	}

	given := newTablet(pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf",
		Tables: map[string]string{"public.plain": "app.plain"}})
	require.NoError(t, given.commit(given.rec(source.Insert, "public.plain", 1, "x"), given.rec(source.Insert, "public.orders", 1, "x")))
	for _, op := range []source.Op{source.ResyncBegin, source.ResyncEnd} {
		err := given.commit(given.rec(source.Insert, "public.orders", 2, "x"), given.rec(op, "", 0, ""))
		require.ErrorIs(t, err, sink.ErrBadRecord, "%s", op)
		require.ErrorContains(t, err, `table "app"."plain" of sink.tables["public.plain"] has no column tabletflow_tablet`)
	}
	require.Equal(t, source.Checkpoint{Term: 1, Index: 2}, checkpoint(given))
	require.Equal(t, []string{"1:t-1"}, ownedRows(t, db, "tf.public__orders", "id"), "nothing written, nothing marked")

	// A mirror table an earlier version made, its rows without a tablet.
	legacy := newTablet(pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "old"})
	require.NoError(t, legacy.commit(legacy.rec(source.Insert, "public.orders", 1, "x")))
	require.NoError(t, db.Exec(ctx, `CREATE TABLE old.public__items (id jsonb PRIMARY KEY, v jsonb);
		ALTER TABLE old.public__items OWNER TO `+pgbed.User+`;
		INSERT INTO old.public__items VALUES ('1', '"x"')`))
	err := legacy.commit(legacy.rec(source.ResyncBegin, "", 0, ""))
	require.ErrorIs(t, err, sink.ErrBadRecord)
	require.ErrorContains(t, err, `table "old"."public__items" holds rows but no column tabletflow_tablet`)
	require.NoError(t, db.Exec(ctx, `ALTER TABLE old.public__items ADD COLUMN tabletflow_tablet text`))
	err = legacy.commit(legacy.rec(source.ResyncBegin, "", 0, ""))
	require.ErrorIs(t, err, sink.ErrBadRecord)
	require.ErrorContains(t, err, `table "old"."public__items" holds rows without their tablet in tabletflow_tablet`)
	require.Equal(t, []string{"1:t-1"}, ownedRows(t, db, "old.public__orders", "id"), "nothing marked")
	require.Equal(t, source.Checkpoint{Term: 1, Index: 1}, checkpoint(legacy))

	// Once the rows say their tablet, the resync goes through.
	require.NoError(t, db.Exec(ctx, `UPDATE old.public__items SET tabletflow_tablet = 't-2'`))
	require.NoError(t, legacy.commit(legacy.rec(source.ResyncBegin, "", 0, ""), legacy.rec(source.ResyncEnd, "", 0, "")))
	require.Empty(t, ownedRows(t, db, "old.public__orders", "id"))
	require.Equal(t, []string{"1:t-2"}, ownedRows(t, db, "old.public__items", "id"))
}
