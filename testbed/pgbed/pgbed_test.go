package pgbed_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// requireSameRows compares every table of two nodes and reports the first
// differing ids, not the whole tables.
func requireSameRows(t *testing.T, ctx context.Context, want, got *pgbed.Node) {
	t.Helper()
	w, err := want.AllRows(ctx)
	require.NoError(t, err)
	g, err := got.AllRows(ctx)
	require.NoError(t, err)
	for _, table := range pgbed.Tables {
		if d := diffRows(w[table], g[table]); d != "" {
			t.Fatalf("%s differs between %s (%d rows) and %s (%d rows):\n%s", table, want.Name, len(w[table]), got.Name, len(g[table]), d)
		}
	}
}

func diffRows(want, got pgbed.Rows) string {
	var out []string
	for id, row := range want {
		if other, ok := got[id]; !ok {
			out = append(out, "missing id "+id)
		} else if !reflect.DeepEqual(row, other) {
			out = append(out, fmt.Sprintf("id %s: want %.200v, got %.200v", id, row, other))
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			out = append(out, "extra id "+id)
		}
	}
	slices.Sort(out)
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("… %d more", len(out)-5))
	}
	return strings.Join(out, "\n")
}

func TestStandbysReplayPrimaryWrites(t *testing.T) {
	c := pgbed.StartT(t, pgbed.Options{Standbys: 2})
	ctx := ctxFor(t, 30*time.Second)
	s := c.Shards[0]
	require.Equal(t, "s1-primary", s.Primary.Name)
	require.Equal(t, []string{"s1-standby1", "s1-standby2"}, []string{s.Standbys[0].Name, s.Standbys[1].Name})

	require.NoError(t, s.Primary.Exec(ctx, `
		INSERT INTO public.orders VALUES (1, 'ann', 12.50, repeat('x', 5000), now()), (2, 'bob', 3, NULL, now());
		INSERT INTO public.items VALUES (10, 1, 'sku-1', 2, 'small');
		UPDATE public.orders SET amount = 13 WHERE id = 1`))
	require.NoError(t, c.WaitReplayed(ctx))
	for _, sb := range s.Standbys {
		requireSameRows(t, ctx, s.Primary, sb)
	}
	rows, err := s.Standbys[0].Rows(ctx, "public.orders")
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, "ann", rows["1"]["customer"])
	require.Len(t, rows["1"]["note"], 5000)

	// Under root the servers run as the unprivileged user.
	if os.Geteuid() == 0 {
		for _, n := range s.Nodes() {
			pidFile, err := os.ReadFile(filepath.Join(n.DataDir(), "postmaster.pid"))
			require.NoError(t, err)
			status, err := os.ReadFile("/proc/" + strings.SplitN(string(pidFile), "\n", 2)[0] + "/status")
			require.NoError(t, err)
			require.Regexp(t, `(?m)^Uid:\s+65534\s`, string(status), n.Name)
		}
	}

	// A standby is read-only (25006).
	err = s.Standbys[0].Exec(ctx, "INSERT INTO public.orders (id) VALUES (3)")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "25006", pgErr.Code)
}

func TestAdapterRoleConnectsWithItsPassword(t *testing.T) {
	c := pgbed.StartT(t, pgbed.Options{Standbys: 1})
	ctx := ctxFor(t, 30*time.Second)
	for _, n := range c.Shards[0].Nodes() {
		conn, err := pgx.Connect(ctx, n.DSN())
		require.NoError(t, err, n.Name)
		var user string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_user").Scan(&user))
		require.Equal(t, pgbed.User, user)
		conn.Close(ctx)

		repl, err := pgconn.Connect(ctx, n.ReplicationDSN())
		require.NoError(t, err, n.Name)
		res, err := repl.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
		require.NoError(t, err)
		require.Len(t, res[0].Rows, 1)
		repl.Close(ctx)

		_, err = pgx.Connect(ctx, strings.Replace(n.DSN(), pgbed.Password, "wrong", 1))
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, n.Name)
		require.Equal(t, "28P01", pgErr.Code)
	}
}

// A logical slot made on a standby decodes what the primary writes, with
// test_decoding and with pgoutput over a publication made on the primary.
func TestLogicalSlotOnStandbyDecodesPrimaryWrites(t *testing.T) {
	c := pgbed.StartT(t, pgbed.Options{Standbys: 2})
	ctx := ctxFor(t, 30*time.Second)
	s := c.Shards[0]
	sb1, sb2 := s.Standbys[0], s.Standbys[1]

	// The adapter's role owns the tables, so it may publish them.
	conn, err := pgx.Connect(ctx, s.Primary.DSN())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE PUBLICATION tf FOR TABLE public.orders, public.items")
	require.NoError(t, err)
	conn.Close(ctx)
	require.NoError(t, c.WaitReplayed(ctx))

	_, err = sb1.CreateLogicalSlot(ctx, "t", "test_decoding")
	require.NoError(t, err)
	_, err = sb2.CreateLogicalSlot(ctx, "p", "pgoutput")
	require.NoError(t, err)

	// Three transactions (one query string would be one transaction).
	for _, sql := range []string{
		`INSERT INTO public.orders VALUES (1, 'ann', 12.50, 'hello', now());
		 INSERT INTO public.items VALUES (10, 1, 'sku-1', 2, 'body')`,
		"UPDATE public.orders SET amount = 13 WHERE id = 1",
		"DELETE FROM public.items WHERE id = 10",
	} {
		require.NoError(t, s.Primary.Exec(ctx, sql))
	}
	require.NoError(t, c.WaitReplayed(ctx))

	changes, err := sb1.Query(ctx, "SELECT data FROM pg_logical_slot_get_changes('t', NULL, NULL, 'skip-empty-xacts', '1')")
	require.NoError(t, err)
	var lines []string
	for _, r := range changes {
		lines = append(lines, r["data"].(string))
	}
	text := strings.Join(lines, "\n")
	for _, want := range []string{
		"table public.orders: INSERT: id[bigint]:1 customer[text]:'ann' amount[numeric]:12.50",
		"table public.items: INSERT: id[bigint]:10",
		// REPLICA IDENTITY FULL: the old row comes along.
		"table public.orders: UPDATE: old-key: id[bigint]:1 customer[text]:'ann' amount[numeric]:12.50",
		// DEFAULT: only the key.
		"table public.items: DELETE: id[bigint]:10",
	} {
		require.Contains(t, text, want)
	}
	require.Equal(t, 3, strings.Count(text, "COMMIT"), text)

	bin, err := sb2.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes('p', NULL, NULL,
		'proto_version', '4', 'publication_names', 'tf')`)
	require.NoError(t, err)
	var kinds []byte
	for _, r := range bin {
		kinds = append(kinds, r["data"].([]byte)[0])
	}
	// Begin, Relation, Insert, Relation, Insert, Commit; then Begin, Update,
	// Commit; Begin, Delete, Commit.
	require.Equal(t, "BRIRICBUCBDC", string(kinds))
}

// A stopped standby catches up when started again, and its logical slot
// decodes what the primary wrote meanwhile.
func TestStandbyRestartCatchesUp(t *testing.T) {
	c := pgbed.StartT(t, pgbed.Options{Standbys: 2})
	ctx := ctxFor(t, 30*time.Second)
	s := c.Shards[0]
	sb := s.Standbys[0]
	_, err := sb.CreateLogicalSlot(ctx, "t", "test_decoding")
	require.NoError(t, err)

	require.NoError(t, sb.Stop())
	require.False(t, sb.Running())
	require.Error(t, c.WaitReplayed(ctx), "a stopped standby cannot be waited for")
	require.NoError(t, s.Primary.Exec(ctx, "INSERT INTO public.orders (id, customer) VALUES (1, 'while down')"))
	require.NoError(t, s.Standbys[1].Exec(ctx, "SELECT 1"), "the other standby is unaffected")

	require.NoError(t, sb.Start(ctx))
	require.NoError(t, sb.WaitStreaming(ctx))
	require.NoError(t, c.WaitReplayed(ctx))
	requireSameRows(t, ctx, s.Primary, sb)
	changes, err := sb.Query(ctx, "SELECT data FROM pg_logical_slot_get_changes('t', NULL, NULL, 'skip-empty-xacts', '1')")
	require.NoError(t, err)
	require.Len(t, changes, 3, "BEGIN, INSERT, COMMIT: %v", changes)
	require.Contains(t, changes[1]["data"], "'while down'")
}

// A killed primary comes back with its commits (crash recovery), and its
// standbys stream from it again.
func TestPrimaryKillAndStart(t *testing.T) {
	c := pgbed.StartT(t, pgbed.Options{Standbys: 2})
	ctx := ctxFor(t, 30*time.Second)
	s := c.Shards[0]
	require.NoError(t, s.Primary.Exec(ctx, "INSERT INTO public.orders (id, customer) VALUES (1, 'before')"))

	s.Primary.Kill()
	require.False(t, s.Primary.Running())
	err := s.Primary.Exec(ctx, "SELECT 1")
	require.Error(t, err, "a killed primary answers nothing")

	require.NoError(t, s.Primary.Start(ctx))
	require.Contains(t, s.Primary.Tail(), "database system was interrupted", "the restart ran crash recovery")
	require.NoError(t, s.Primary.Exec(ctx, "INSERT INTO public.orders (id, customer) VALUES (2, 'after')"))
	for _, sb := range s.Standbys {
		require.NoError(t, sb.WaitStreaming(ctx))
	}
	require.NoError(t, c.WaitReplayed(ctx))
	for _, sb := range s.Standbys {
		requireSameRows(t, ctx, s.Primary, sb)
	}
	rows, err := s.Primary.Rows(ctx, "public.orders")
	require.NoError(t, err)
	require.Len(t, rows, 2)
}

// The full bed: three shards of a primary and two standbys under the
// workload; once it stops and the standbys have replayed, every replica of a
// shard has the primary's rows.
func TestThreeShardsUnderWorkload(t *testing.T) {
	start := time.Now()
	c := pgbed.StartT(t, pgbed.Options{Shards: 3, Standbys: 2})
	t.Logf("3 shards × (primary + 2 standbys) up in %s", time.Since(start).Round(time.Millisecond))
	ctx := ctxFor(t, 60*time.Second)

	// Replicas of a shard share its system identifier; shards do not.
	ids := map[string]bool{}
	for _, s := range c.Shards {
		shard := map[string]bool{}
		for _, n := range s.Nodes() {
			var id string
			require.NoError(t, n.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&id))
			shard[id], ids[id] = true, true
		}
		require.Len(t, shard, 1, s.Name)
	}
	require.Len(t, ids, 3)

	w := c.StartWorkload(pgbed.WorkloadOptions{Rate: 100, Seed: 1})
	// Let it run for 3 s; the standbys follow meanwhile.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-tick.C {
		require.NoError(t, c.WaitReplayed(ctx))
	}
	require.NoError(t, w.Stop())
	st := w.Stats()
	t.Logf("workload: %+v", st)
	require.Positive(t, st.Inserts)
	require.Positive(t, st.Updates)
	require.Positive(t, st.Deletes)
	require.Zero(t, st.Errors)

	require.NoError(t, c.WaitReplayed(ctx))
	for i, s := range c.Shards {
		rows, err := w.Rows(ctx, i)
		require.NoError(t, err)
		require.NotEmpty(t, rows["public.orders"], s.Name)
		var large int
		require.NoError(t, s.Primary.QueryRow(ctx, "SELECT count(*) FROM public.orders WHERE length(note) > 2000").Scan(&large))
		require.Positive(t, large, "%s has out-of-line notes", s.Name)
		for id := range rows["public.orders"] {
			require.True(t, strings.HasPrefix(id, fmt.Sprint(i+1)), "shard %d id %s", i, id)
		}
		for _, sb := range s.Standbys {
			requireSameRows(t, ctx, s.Primary, sb)
		}
	}
}

func TestBinNamesTheMakeTarget(t *testing.T) {
	t.Setenv(pgbed.BinEnv, t.TempDir())
	_, err := pgbed.Bin()
	require.True(t, errors.Is(err, pgbed.ErrNoBinaries), "%v", err)
	require.Contains(t, err.Error(), "make pg")
}

// A node whose port another process took between its pick and its start
// (here a plain listener holds the primary's first port) does not fail
// the cluster: the shard starts over on new ports.
func TestAShardWhosePortIsTakenStartsOverOnNewPorts(t *testing.T) {
	pgbed.Require(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	var picks atomic.Int32
	restore := pgbed.SetPickPort(func() (int, error) {
		if picks.Add(1) == 1 { // the first node made: s1-primary
			return taken, nil
		}
		return testbed.FreePort()
	})
	defer restore()
	c := pgbed.StartT(t, pgbed.Options{Standbys: 1})
	require.NotEqual(t, taken, c.Shards[0].Primary.Port, "the primary moved off the taken port")
	require.Greater(t, picks.Load(), int32(2), "the shard's nodes got new ports")
	ctx := ctxFor(t, 30*time.Second)
	require.NoError(t, c.Shards[0].Primary.Exec(ctx, "INSERT INTO public.orders (id) VALUES (1)"))
	require.NoError(t, c.WaitReplayed(ctx))
	requireSameRows(t, ctx, c.Shards[0].Primary, c.Shards[0].Standbys[0])
}
