package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

const stream = "orders"

// TestContract runs the Sink contract suite against a real PostgreSQL 18
// (the test bed's primary), each case in a schema of its own.
func TestContract(t *testing.T) {
	bed := pgbed.StartT(t, pgbed.Options{Shards: 1})
	db := bed.Shards[0].Primary
	env := map[string]string{"SINK_DSN": db.DSN()}
	n := 0
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		n++
		cfg := pgsink.Config{Kind: "postgres", DSNEnv: "SINK_DSN", Mode: "changelog", Schema: fmt.Sprintf("contract_%d", n)}
		ctx := context.Background()
		exec := func(t *testing.T, q string, args ...any) {
			require.NoError(t, db.Exec(ctx, q, args...))
		}
		tbl := func(name string) string { return pgx.Identifier{cfg.Schema, name}.Sanitize() }
		return sinktest.Harness{
			Open: func(t *testing.T) sink.Sink {
				s, err := pgsink.New(ctx, cfg, stream, func(k string) string { return env[k] })
				require.NoError(t, err)
				return s
			},
			Read: func(t *testing.T) map[string][]source.Record { return read(t, db, tbl("changes")) },
			Tamper: func(t *testing.T, tablet string, cp source.Checkpoint) {
				exec(t, `UPDATE `+tbl("checkpoints")+` SET checkpoint = $3 WHERE stream = $1 AND tablet = $2`, stream, tablet, cp.String())
			},
			Corrupt: func(t *testing.T, tablet string) {
				exec(t, `DELETE FROM `+tbl("checkpoints")+` WHERE stream = $1 AND tablet = $2`, stream, tablet)
			},
		}
	})
}

// read returns the committed records per tablet, in position order.
func read(t *testing.T, db *pgbed.Node, table string) map[string][]source.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := db.Connect(ctx)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT tablet, pos_term::text || '.' || pos_index::text, tbl, op,
		key::text, before::text, after::text, commit_time_ns FROM `+table+` WHERE stream = $1 ORDER BY tablet, pos_term, pos_index`, stream)
	require.NoError(t, err)
	out := map[string][]source.Record{}
	for rows.Next() {
		var r source.Record
		var pos, op string
		var key, before, after *string
		var ns int64
		require.NoError(t, rows.Scan(&r.Tablet, &pos, &r.Table, &op, &key, &before, &after, &ns))
		r.Position, err = source.ParseCheckpoint(pos)
		require.NoError(t, err)
		r.Op, r.CommitTime = source.Op(op), time.Unix(0, ns).UTC()
		for _, f := range []struct {
			dst *json.RawMessage
			v   *string
		}{{&r.Key, key}, {&r.Before, before}, {&r.After, after}} {
			if f.v != nil {
				*f.dst = json.RawMessage(*f.v)
			}
		}
		out[r.Tablet] = append(out[r.Tablet], r)
	}
	require.NoError(t, rows.Err())
	return out
}

// Wrong credentials are ErrDenied (the tablet fails with the reason,
// instead of retrying forever); a variable that is not set names itself.
func TestWrongCredentialsAreDenied(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	bad := strings.Replace(db.DSN(), pgbed.Password, "wrong-password", 1)
	require.NotEqual(t, db.DSN(), bad)
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "SINK_DSN", Mode: "changelog", Schema: "tf"}
	_, err := pgsink.New(ctx, cfg, stream, func(string) string { return bad })
	require.ErrorIs(t, err, sink.ErrDenied)
	_, err = pgsink.New(ctx, cfg, stream, func(string) string { return "" })
	require.ErrorIs(t, err, sink.ErrDenied)
	require.ErrorContains(t, err, "SINK_DSN is not set")
	require.NotContains(t, err.Error(), "wrong-password")
}

// A missing permission is ErrDenied with PostgreSQL's reason (42501), not
// trouble to retry: a role that may not create the sink's schema, one that
// may not insert into its checkpoints table, and one that may not write
// the table apply mode was given.
func TestMissingPermissionIsDeniedWithTheReason(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	const role, password = "weak", "weak-pw"
	require.NoError(t, db.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD '`+password+`'`))
	weak := strings.Replace(db.DSN(), pgbed.User+":"+pgbed.Password, role+":"+password, 1)
	require.NotEqual(t, db.DSN(), weak)
	newSink := func(cfg pgsink.Config) (sink.Sink, error) {
		s, err := pgsink.New(ctx, cfg, stream, func(string) string { return weak })
		if err == nil {
			t.Cleanup(func() { _ = s.Close() })
		}
		return s, err
	}
	requireDenied := func(t *testing.T, err error, what string) {
		t.Helper()
		require.ErrorIs(t, err, sink.ErrDenied)
		require.NotErrorIs(t, err, sink.ErrBadRecord)
		require.ErrorContains(t, err, "42501")
		require.ErrorContains(t, err, "permission denied for "+what)
		require.NotContains(t, err.Error(), password)
	}

	t.Run("no CREATE on the database", func(t *testing.T) {
		_, err := newSink(pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "changelog", Schema: "tf_weak"})
		requireDenied(t, err, "database postgres")
	})

	t.Run("no INSERT on the checkpoints table", func(t *testing.T) {
		// The sink's schema and tables made by their owner; the role may
		// use them (no CREATE on the database or the schema: it need not
		// make them), but not add a checkpoint row.
		owner, err := pgsink.New(ctx, pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "changelog", Schema: "tf_shared"}, stream,
			func(string) string { return db.DSN() })
		require.NoError(t, err)
		require.NoError(t, owner.Close())
		require.NoError(t, db.Exec(ctx, `GRANT USAGE ON SCHEMA tf_shared TO `+role+`;
			GRANT SELECT, UPDATE ON tf_shared.checkpoints TO `+role+`;
			GRANT SELECT, INSERT ON tf_shared.changes TO `+role))
		s, err := newSink(pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "changelog", Schema: "tf_shared"})
		require.NoError(t, err, "the tables are there: nothing to create")
		_, err = s.Open(ctx, "t-0001")
		requireDenied(t, err, "table checkpoints")
	})

	t.Run("no INSERT on a given table", func(t *testing.T) {
		require.NoError(t, db.Exec(ctx, `CREATE SCHEMA app; GRANT USAGE ON SCHEMA app TO `+role+`;
			GRANT CREATE ON DATABASE postgres TO `+role+`;
			CREATE TABLE app.orders (id bigint PRIMARY KEY, amount numeric);
			GRANT SELECT ON app.orders TO `+role))
		s, err := newSink(pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "tf_apply",
			Tables: map[string]string{"public.orders": "app.orders"}})
		require.NoError(t, err)
		w, err := s.Open(ctx, "t-0001")
		require.NoError(t, err)
		r := source.Record{Tablet: "t-0001", Position: source.Checkpoint{Term: 1, Index: 1}, Table: "public.orders", Op: source.Insert,
			Key: json.RawMessage(`{"id":1}`), After: json.RawMessage(`{"id":1,"amount":2}`), CommitTime: time.Unix(1, 0)}
		require.NoError(t, w.Write(ctx, []source.Record{r}))
		requireDenied(t, w.Commit(ctx, r.Position), "table orders")
		require.True(t, w.Checkpoint().IsZero())
	})
}

// Digest counts rows beyond the first of each (tablet, position) — which
// the change table's primary key rules out, so the key is dropped here to
// store one twice — and digests every row, the repeated one too.
func TestDigestCountsRowsRepeatingAPosition(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "changelog", Schema: "dup"}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	recs := sinktest.Records("t-0001", 1, 5)
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, recs))
	require.NoError(t, w.Commit(ctx, recs[4].Position))

	conn, err := db.Connect(ctx)
	require.NoError(t, err)
	defer conn.Close(ctx)
	clean, err := pgsink.Digest(ctx, conn, "dup", stream)
	require.NoError(t, err)
	require.Equal(t, uint64(5), clean.Digest.Records)
	require.Zero(t, clean.Duplicates)

	require.NoError(t, db.Exec(ctx, `ALTER TABLE dup.changes DROP CONSTRAINT changes_pkey;
		INSERT INTO dup.changes SELECT * FROM dup.changes WHERE pos_index IN (2, 4);
		INSERT INTO dup.changes SELECT * FROM dup.changes WHERE pos_index = 4 LIMIT 1`))
	got, err := pgsink.Digest(ctx, conn, "dup", stream)
	require.NoError(t, err)
	require.Equal(t, uint64(3), got.Duplicates, "1.2 once more, 1.4 twice more")
	require.Equal(t, uint64(8), got.Digest.Records)
	require.NotEqual(t, clean.Digest.Hash, got.Digest.Hash)
}
