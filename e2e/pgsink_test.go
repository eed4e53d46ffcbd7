package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
	"github.com/tabletflow/tabletflow/tlsfiles"
	"github.com/tabletflow/tabletflow/workflows"
)

// The PostgreSQL sink from tabletd, two streams on one database — one in
// changelog mode, one in apply mode — with two workers on the task queue
// and one of them killed (kill -9) three times at random moments, and the
// database stopped and started: after the drain, the change table holds
// exactly tabletd's digest of its stream (count and hash), each (tablet,
// position) once, and the mirror tables hold exactly tabletd's final rows.
// The workload starts after both streams, so both are due every change.
func TestTabletdIntoPostgresIsExactAcrossWorkerKills(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	e := newEnv(t, "--tablets", "6", "--rate", "0")
	t.Setenv("TF_E2E_SINK_DSN", db.DSN())
	victim := e.startWorker()
	e.startWorker()
	const stream, mirrored = "pgsink", "pgmirror"
	e.startStream(stream, e.config("", map[string]any{"sink": map[string]any{"kind": "postgres", "dsnEnv": "TF_E2E_SINK_DSN"}}))
	e.startStream(mirrored, e.config("", map[string]any{"sink": map[string]any{
		"kind": "postgres", "dsnEnv": "TF_E2E_SINK_DSN", "mode": "apply", "schema": "mirror"}}))
	e.waitStatus(stream, "every tablet streaming", 2*time.Minute, allStreaming(6))
	e.waitStatus(mirrored, "every tablet streaming", 2*time.Minute, allStreaming(6))
	_, err := e.admin.Workload(context.Background(), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_RATE, Rate: 300})
	require.NoError(t, err)
	e.workload(sourcepb.WorkloadRequest_RESUME)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := db.Connect(ctx)
	require.NoError(t, err)
	defer conn.Close(ctx)
	stored := func() digest.Digest {
		st, err := pgsink.Digest(ctx, conn, "tabletflow", stream)
		require.NoError(t, err)
		require.Zero(t, st.Duplicates, "rows repeating a (tablet, position)")
		return st.Digest
	}
	for i := range 3 {
		time.Sleep(time.Duration(1000+rand.IntN(3000)) * time.Millisecond) // a random moment, not an assertion
		victim.Kill()
		at := stored().Records
		victim = e.startWorker()
		e.eventually(fmt.Sprintf("records keep arriving after kill %d", i+1), time.Minute, func() (bool, string) {
			n := stored().Records
			return n > at+200, fmt.Sprintf("%d records, %d at the kill", n, at)
		})
	}
	// The sink database goes away for a while: tablets say so and wait,
	// excluding no source replica; back, they carry on.
	require.NoError(t, db.Stop())
	e.waitStatus(stream, "tablets waiting for the sink", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		for _, tab := range st.Tablets {
			if tab.State == workflows.Retrying && strings.Contains(tab.Reason, "sink unavailable") {
				return true, ""
			}
		}
		return false, summary(st)
	})
	st, err := e.status(stream)
	require.NoError(t, err)
	for _, tab := range st.Tablets {
		require.Empty(t, tab.Excluded, "%s: the sink's outage excludes no replica", tab.ID)
	}
	require.NoError(t, db.Start(ctx))
	conn, err = db.Connect(ctx)
	require.NoError(t, err)
	defer conn.Close(ctx)
	at := stored().Records
	e.eventually("records arrive again after the sink's outage", time.Minute, func() (bool, string) {
		n := stored().Records
		return n > at+200, fmt.Sprintf("%d records, %d when the sink came back", n, at)
	})

	e.workload(sourcepb.WorkloadRequest_STOP)
	e.eventually("the change table holds exactly the stream's records", 2*time.Minute, func() (bool, string) {
		due, err := e.admin.Digest(ctx, &sourcepb.DigestRequest{Stream: stream})
		if err != nil {
			return false, err.Error()
		}
		got := stored()
		return due.Records == got.Records && due.Hash == got.Hash,
			fmt.Sprintf("due %d records hash %s, table %d records hash %s", due.Records, digest.HashHex(due.Hash), got.Records, digest.HashHex(got.Hash))
	})
	e.eventually("the mirror tables hold exactly tabletd's rows", 2*time.Minute, func() (bool, string) {
		resp, err := e.admin.Rows(ctx, &sourcepb.RowsRequest{})
		if err != nil {
			return false, err.Error()
		}
		want := map[string]map[string]any{} // table/key → row
		for _, r := range resp.Rows {
			var row map[string]any
			require.NoError(t, json.Unmarshal(r.Row, &row))
			want[r.Table+"/"+string(r.Key)] = row
		}
		got, err := mirrorRows(ctx, conn, "mirror", "customers", "orders", "payments")
		if err != nil {
			return false, err.Error()
		}
		return reflect.DeepEqual(want, got), fmt.Sprintf("%d rows mirrored, tabletd has %d", len(got), len(want))
	})
	// And every tablet streams on (one may be between runs for a moment).
	e.waitStatus(stream, "every tablet streaming", time.Minute, allStreaming(6))
	e.waitStatus(mirrored, "every tablet streaming", time.Minute, allStreaming(6))
	// The sink's DSN reached the workers only through the environment:
	// through kills and the sink's outage, no history holds its password.
	e.requireNoSecretInHistories(stream, []byte(pgbed.Password))
	e.requireNoSecretInHistories(mirrored, []byte(pgbed.Password))
}

// mirrorRows reads apply-mode mirror tables keyed by id, as "table/key" →
// row, the key in tabletd's canonical form ({"id":N}).
func mirrorRows(ctx context.Context, conn *pgx.Conn, schema string, tables ...string) (map[string]map[string]any, error) {
	out := map[string]map[string]any{}
	for _, table := range tables {
		rows, err := conn.Query(ctx, `SELECT (to_jsonb(t) - 'tabletflow_tablet')::text FROM `+pgx.Identifier{schema, table}.Sanitize()+` t`) // less the sink's column
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return nil, err
			}
			var row map[string]any
			if err := json.Unmarshal([]byte(s), &row); err != nil {
				return nil, err
			}
			key, err := json.Marshal(map[string]any{"id": row["id"]})
			if err != nil {
				return nil, err
			}
			out[table+"/"+string(key)] = row
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// From the PostgreSQL source (2 shards, read from standbys) into the
// PostgreSQL sink in apply mode: after the drain the sink's mirror tables
// hold exactly the source shards' tables (the shards' keys do not overlap).
// Every server takes only SSL connections from the adapters, whose DSNs say
// sslmode=verify-full with the CA the test made.
func TestPostgresSourceIntoPostgresSinkInApplyModeMirrorsTheShards(t *testing.T) {
	certs, err := testbed.MakeCerts(t.TempDir())
	require.NoError(t, err)
	tlsFiles := tlsfiles.Files{CA: certs.CA, Cert: certs.ServerCert, Key: certs.ServerKey}
	p := newPGEnv(t, pgbed.Options{Shards: 2, Standbys: 1, TLS: tlsFiles})
	target := pgbed.StartT(t, pgbed.Options{Shards: 1, TLS: tlsFiles}).Shards[0].Primary
	require.Contains(t, target.DSN(), "sslmode=verify-full")
	t.Setenv("TF_E2E_TARGET_DSN", target.DSN())
	// Without SSL the servers refuse the adapters' role.
	plain := strings.Replace(target.DSN(), "sslmode=verify-full", "sslmode=disable", 1)
	_, err = pgx.Connect(context.Background(), plain)
	require.ErrorContains(t, err, "no encryption")
	p.startWorker()
	const stream = "pgapply"
	p.startStream(stream, p.config("", map[string]any{
		"startFrom": "snapshot",
		"sink":      map[string]any{"kind": "postgres", "dsnEnv": "TF_E2E_TARGET_DSN", "mode": "apply", "schema": "mirror"},
	}))
	p.waitStatus(stream, "both shards streaming", 2*time.Minute, allStreaming(2))
	load := p.bed.StartWorkload(pgbed.WorkloadOptions{Rate: 60, Count: 300, Seed: 17})
	require.NoError(t, load.Wait())

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p.requireMirrorExact(ctx, target, 2*time.Minute)
}

// requireMirrorExact waits until the apply-mode mirror tables on target
// hold exactly the bed's shards' rows.
func (p *pgEnv) requireMirrorExact(ctx context.Context, target *pgbed.Node, within time.Duration) {
	p.t.Helper()
	require.NoError(p.t, p.bed.WaitReplayed(ctx))
	want := pgbed.TextTables{}
	for _, sh := range p.bed.Shards {
		tt, err := sh.Primary.TextTables(ctx)
		require.NoError(p.t, err)
		for table, rows := range tt {
			if want[table] == nil {
				want[table] = map[string]map[string]any{}
			}
			for k, row := range rows {
				want[table][k] = row
			}
		}
	}
	p.eventually("the mirror tables hold the shards' tables", within, func() (bool, string) {
		got, err := mirrorTables(ctx, target)
		if err != nil {
			return false, err.Error()
		}
		for _, table := range pgbed.Tables {
			if !reflect.DeepEqual(want[table], got[table]) {
				return false, fmt.Sprintf("%s: %d rows mirrored, %d in the shards", table, len(got[table]), len(want[table]))
			}
		}
		return true, ""
	})
}

// mirrorTables reads the apply-mode mirror tables of the bed's tables as
// pgbed.TextTables: jsonb strings as their text, other values as their
// JSON text, JSON or SQL null as nil.
func mirrorTables(ctx context.Context, n *pgbed.Node) (pgbed.TextTables, error) {
	conn, err := n.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	out := pgbed.TextTables{}
	for _, table := range pgbed.Tables {
		rows, err := conn.Query(ctx, `SELECT (to_jsonb(t) - 'tabletflow_tablet')::text FROM mirror.`+strings.ReplaceAll(table, ".", "__")+` t`) // less the sink's column
		if err != nil {
			return nil, err
		}
		tbl := map[string]map[string]any{}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return nil, err
			}
			row, err := pgbed.TextRow([]byte(s))
			if err != nil {
				return nil, err
			}
			tbl[fmt.Sprintf(`{"id":%s}`, row["id"])] = row
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		out[table] = tbl
	}
	return out, nil
}

// Wrong credentials for the sink database: the tablets fail, saying why,
// instead of retrying forever or blaming a source replica.
func TestPostgresSinkWithWrongCredentialsFailsTheTabletsWithTheReason(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	e := newEnv(t, "--tablets", "2", "--rate", "100")
	t.Setenv("TF_E2E_BAD_SINK_DSN", strings.Replace(db.DSN(), pgbed.Password, "not-the-password", 1))
	e.startWorker()
	const stream = "pgdenied"
	e.startStream(stream, e.config("", map[string]any{"sink": map[string]any{"kind": "postgres", "dsnEnv": "TF_E2E_BAD_SINK_DSN"}}))
	st := e.waitStatus(stream, "every tablet Failed", 2*time.Minute, inState(2, workflows.Failed))
	for _, tab := range st.Tablets {
		require.Contains(t, tab.Reason, "password authentication failed", tab.ID)
		require.NotContains(t, tab.Reason, "not-the-password", "%s: the secret is not shown", tab.ID)
		require.Empty(t, tab.Excluded, "%s: no source replica blamed", tab.ID)
	}
	t.Logf("reason: %s", st.Tablets[0].Reason)
}

// A stream whose PostgreSQL sink accepts connections and never answers
// (a black hole on loopback) does not stall another stream on the same
// worker: the healthy stream commits on every tablet while the hung one's
// tablets wait for their sink.
func TestAHungSinkDoesNotStallAnotherStream(t *testing.T) {
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = hole.Close() })
	var held []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	t.Setenv("TF_E2E_HUNG_SINK_DSN", "postgres://tabletflow@"+hole.Addr().String()+"/db?sslmode=disable")

	const tablets = 8
	e := newEnv(t, "--tablets", strconv.Itoa(tablets), "--rate", "200")
	e.startWorker()
	e.startStream("hung", e.config("", map[string]any{"sink": map[string]any{"kind": "postgres", "dsnEnv": "TF_E2E_HUNG_SINK_DSN"}}))
	e.eventually("the hung stream's tablets wait for their sink", time.Minute, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(held) > 0, fmt.Sprintf("%d connections to the black hole", len(held))
	})

	out := filepath.Join(e.dir, "healthy")
	e.startStream("healthy", e.config(out, nil))
	// Committed records, read from the sink itself: the stream's status
	// counts a tablet's records only at its reports (every minute).
	e.eventually("every tablet of the healthy stream commits", time.Minute, func() (bool, string) {
		r, err := jsonl.DigestDir(out)
		if err != nil {
			return false, err.Error()
		}
		committed := 0
		for _, d := range r.Tablets {
			if d.Records > 0 {
				committed++
			}
		}
		return committed == tablets, fmt.Sprintf("%d of %d tablets committed", committed, tablets)
	})
}
