package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// insert is an insert of row {"id": id} into table, at position pos.
func insert(table string, pos uint64, id int) source.Record {
	return source.Record{Tablet: "t-0001", Position: source.Checkpoint{Term: 1, Index: pos}, Table: table, Op: source.Insert,
		Key: json.RawMessage(fmt.Sprintf(`{"id":%d}`, id)), After: json.RawMessage(fmt.Sprintf(`{"id":%d,"v":"%s"}`, id, table)),
		CommitTime: time.Unix(1, 0)}
}

// mirrorTables lists schema's tables other than the sink's own, each with
// its rows' ids.
func mirrorTables(t *testing.T, ctx context.Context, db *pgbed.Node, schema string) map[string][]string {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT relname::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND relname NOT IN ('changes', 'checkpoints')`, schema)
	require.NoError(t, err)
	out := map[string][]string{}
	for _, r := range rows {
		name := r["name"].(string)
		ids, err := db.Query(ctx, fmt.Sprintf(`SELECT id::text AS id FROM %s.%q ORDER BY id::text`, schema, name))
		require.NoError(t, err)
		out[name] = []string{}
		for _, id := range ids {
			out[name] = append(out[name], id["id"].(string))
		}
	}
	return out
}

// mirrorOf is the table of schema whose comment says it mirrors table.
func mirrorOf(t *testing.T, ctx context.Context, db *pgbed.Node, schema, table string) string {
	t.Helper()
	var name string
	require.NoError(t, db.QueryRow(ctx, `SELECT relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND obj_description(c.oid, 'pg_class') = $2`, schema, "tabletflow mirror of "+table).Scan(&name))
	return name
}

// Source tables whose names differ only in case or in characters other
// than a-z, 0-9 and _, a name past 63 bytes, and one named like the
// sink's own tables each get a mirror table of their own, holding their
// rows only.
func TestApplyModeGivesEverySourceTableItsOwnMirrorTable(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "own"}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	long := "public." + strings.Repeat("x", 70)
	tables := []string{"public.orders", "public.Orders", "orders-eu", "orders_eu", long, long + "y", "changes", "a_.b", "a._b", "a__b"}
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	var batch []source.Record
	for i, tbl := range tables {
		batch = append(batch, insert(tbl, uint64(i+1), i+1))
	}
	require.NoError(t, w.Write(ctx, batch))
	require.NoError(t, w.Commit(ctx, batch[len(batch)-1].Position))

	got := mirrorTables(t, ctx, db, "own")
	require.Len(t, got, len(tables), "a mirror table per source table: %v", got)
	for i, tbl := range tables {
		name := mirrorOf(t, ctx, db, "own", tbl)
		require.Equal(t, []string{fmt.Sprint(i + 1)}, got[name], "%s's mirror table %s holds its row only", tbl, name)
	}
	require.Equal(t, "public__orders", mirrorOf(t, ctx, db, "own", "public.orders"), "a plain name keeps its readable mirror")
	require.Equal(t, "orders_eu", mirrorOf(t, ctx, db, "own", "orders_eu"))
}

// Mirror tables an earlier version made are written on: a table whose
// name it folded (public.Orders into public__orders) keeps its mirror
// table, which then names it, and another source table folding to the
// same name (public.orders) gets a table of its own instead of sharing.
func TestApplyModeKeepsTheMirrorTablesOfAnEarlierVersion(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	// As the earlier version made them, with a row each.
	require.NoError(t, db.Exec(ctx, `CREATE SCHEMA old;
		CREATE TABLE old.public__orders (id jsonb PRIMARY KEY, v jsonb, tabletflow_tablet text);
		INSERT INTO old.public__orders VALUES ('1', '"before"', 't-0001');
		CREATE TABLE old.public__items (id jsonb PRIMARY KEY, v jsonb, tabletflow_tablet text);
		INSERT INTO old.public__items VALUES ('1', '"before"', 't-0001');
		ALTER SCHEMA old OWNER TO `+pgbed.User+`;
		ALTER TABLE old.public__orders OWNER TO `+pgbed.User+`;
		ALTER TABLE old.public__items OWNER TO `+pgbed.User))
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "old"}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	batch := []source.Record{insert("public.Orders", 1, 2), insert("public.items", 2, 2)}
	require.NoError(t, w.Write(ctx, batch))
	require.NoError(t, w.Commit(ctx, batch[1].Position))
	later := []source.Record{insert("public.orders", 3, 5)}
	require.NoError(t, w.Write(ctx, later))
	require.NoError(t, w.Commit(ctx, later[0].Position))

	got := mirrorTables(t, ctx, db, "old")
	require.Equal(t, []string{"1", "2"}, got["public__orders"], "public.Orders goes on in its mirror table, public.orders does not mix in: %v", got)
	require.Equal(t, []string{"1", "2"}, got["public__items"])
	require.Equal(t, "public__orders", mirrorOf(t, ctx, db, "old", "public.Orders"))
	require.Equal(t, "public__items", mirrorOf(t, ctx, db, "old", "public.items"))
	own := mirrorOf(t, ctx, db, "old", "public.orders")
	require.Equal(t, []string{"5"}, got[own])
}
