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

	"github.com/tabletflow/tabletflow/config"
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
		cfg := config.Sink{Kind: "postgres", DSNEnv: "SINK_DSN", Mode: "changelog", Schema: fmt.Sprintf("contract_%d", n)}
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
	cfg := config.Sink{Kind: "postgres", DSNEnv: "SINK_DSN", Mode: "changelog", Schema: "tf"}
	_, err := pgsink.New(ctx, cfg, stream, func(string) string { return bad })
	require.ErrorIs(t, err, sink.ErrDenied)
	_, err = pgsink.New(ctx, cfg, stream, func(string) string { return "" })
	require.ErrorIs(t, err, sink.ErrDenied)
	require.ErrorContains(t, err, "SINK_DSN is not set")
	require.NotContains(t, err.Error(), "wrong-password")
}
