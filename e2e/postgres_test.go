package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// The PostgreSQL source end to end: a real Temporal dev server, worker
// processes, and PostgreSQL 18 shards of a primary and standbys (the npm
// binaries, run as an unprivileged user). Each test ends with the proof:
// replaying the JSONL sink into tables gives every shard's tables, with no
// position twice and positions increasing per shard.

// pgEnv is an env (its tabletd unused) with a PostgreSQL bed: shard i is
// tablet "s<i+1>", its primary "zone1-s<i+1>p", its standbys "zone2-s<i+1>a"
// and "zone3-s<i+1>b"; the worker reads each DSN from a variable of its own.
type pgEnv struct {
	*env
	bed *pgbed.Cluster
	src map[string]any
	// replay is pgbed.Replay, or pgbed.ReplaySnapshot for a stream that
	// starts with a snapshot.
	replay func([]source.Record) (pgbed.TextTables, error)
	// tables requireShardsExact compares (nil: pgbed.Tables).
	tables []string
}

func newPGEnv(t *testing.T, opts pgbed.Options) *pgEnv {
	t.Helper()
	bed := pgbed.StartT(t, opts)
	e := newEnv(t, "--rate", "0")
	var shards []map[string]any
	for i, sh := range bed.Shards {
		id := fmt.Sprintf("s%d", i+1)
		var reps []map[string]any
		for j, n := range sh.Nodes() {
			cell, role, typ := fmt.Sprintf("zone%d", j+1), string(rune('a'+j-1)), "REPLICA"
			if j == 0 {
				role, typ = "p", "PRIMARY"
			}
			dsnEnv := strings.ToUpper(fmt.Sprintf("TF_E2E_%s_%s_DSN", id, role))
			t.Setenv(dsnEnv, n.DSN()) // the worker inherits it
			reps = append(reps, map[string]any{"alias": cell + "-" + id + role, "cell": cell, "type": typ, "dsnEnv": dsnEnv})
		}
		shards = append(shards, map[string]any{"id": id, "replicas": reps})
	}
	return &pgEnv{env: e, bed: bed, src: map[string]any{"kind": "postgres", "tables": pgbed.Tables, "shards": shards}, replay: pgbed.Replay}
}

// config is a stream config from the bed into the JSONL directory out.
func (p *pgEnv) config(out string, extra map[string]any) []byte {
	m := map[string]any{"source": p.src}
	for k, v := range extra {
		m[k] = v
	}
	return p.env.config(out, m)
}

// node is the bed's server of a replica alias.
func (p *pgEnv) node(alias string) *pgbed.Node {
	var shard, j int
	_, err := fmt.Sscanf(alias[strings.Index(alias, "-")+1:], "s%d", &shard)
	require.NoError(p.t, err)
	switch alias[len(alias)-1] {
	case 'p':
		return p.bed.Shards[shard-1].Primary
	case 'a':
		j = 0
	case 'b':
		j = 1
	}
	return p.bed.Shards[shard-1].Standbys[j]
}

// requireShardsExact waits until replaying each shard's JSONL gives the
// shard's tables on its primary (every shard, or those listed), then checks
// that no position is stored twice and positions increase in each file.
func (p *pgEnv) requireShardsExact(out string, within time.Duration, only ...string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	require.NoError(p.t, p.bed.WaitReplayed(ctx))
	// Each try reads the primaries under a context of its own: one shared
	// with the wait above expired part-way through the tries under load,
	// and every later try then failed to connect whatever the sink held.
	p.eventually("replaying the sink gives every shard's tables", within, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lines, err := jsonl.ReadDir(out)
		if err != nil {
			return false, err.Error()
		}
		for i, sh := range p.bed.Shards {
			id := fmt.Sprintf("s%d", i+1)
			if len(only) > 0 && !slices.Contains(only, id) {
				continue
			}
			var recs []source.Record
			for _, l := range lines[id] {
				r, err := l.Record()
				if err != nil {
					return false, err.Error()
				}
				recs = append(recs, r)
			}
			got, err := p.replay(recs)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", id, err)
			}
			want, err := sh.Primary.TextTables(ctx)
			if err != nil {
				return false, err.Error()
			}
			tables := p.tables
			if tables == nil {
				tables = pgbed.Tables
			}
			for _, table := range tables {
				if len(want[table]) == 0 && len(got[table]) == 0 {
					continue
				}
				if !reflect.DeepEqual(want[table], got[table]) {
					return false, fmt.Sprintf("%s %s: %d rows replayed, %d in the source", id, table, len(got[table]), len(want[table]))
				}
			}
		}
		return true, ""
	})
	r, err := jsonl.DigestDir(out)
	require.NoError(p.t, err)
	require.Empty(p.t, r.Duplicates, "no (tablet, position) twice")
	p.requireOrdered(out)
}

// retryBackoffs is what a retry policy waits in all between its attempts
// on one replica: the intervals before attempts 2 to maximumAttempts, each
// the one before times backoffCoefficient, capped at maximumInterval.
func retryBackoffs(r config.Retry) time.Duration {
	var sum time.Duration
	next := r.InitialInterval.D()
	for i := int32(1); i < r.Attempts(); i++ {
		sum += min(next, r.MaximumInterval.D())
		next = time.Duration(float64(next) * r.BackoffCoefficient)
	}
	return sum
}

// replicaOf is the replica a tablet reads from, per the stream's status.
func replicaOf(st workflows.StreamStatus, tablet string) string {
	return tabletStatus(st, tablet).Replica
}

func TestPostgresStreamFromStandbysIsExactThroughAKillAnExclusionAndAStandbyDown(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 3, Standbys: 2})
	worker := p.startWorker()
	out := filepath.Join(p.dir, "out")
	const stream = "pg"
	raw := p.config(out, map[string]any{"topologyRefresh": "2s"})
	cfg, err := config.Decode(raw)
	require.NoError(t, err)
	require.Positive(t, cfg.Retry.Attempts(), "the test's policy gives up on a replica")
	p.startStream(stream, raw)

	// Streaming from standbys (REPLICA before PRIMARY by default).
	st := p.waitStatus(stream, "every shard streaming from a standby", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		ok, why := allStreaming(3)(st)
		for _, tab := range st.Tablets {
			ok = ok && !strings.HasSuffix(tab.Replica, "p")
		}
		return ok, why
	})
	t.Logf("reading from %s, %s, %s", replicaOf(st, "s1"), replicaOf(st, "s2"), replicaOf(st, "s3"))
	// The stream starts where its slots were made (no snapshot of rows
	// that were there before): the workload starts on empty tables now.
	load := p.bed.StartWorkload(pgbed.WorkloadOptions{Rate: 40, Seed: 3, KeepGoing: true})
	p.eventually("records reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 300, fmt.Sprintf("%d records", n)
	})

	// An operator excludes the standby s1 reads from: reads move within
	// seconds.
	st, err = p.status(stream)
	require.NoError(t, err)
	excluded := replicaOf(st, "s1")
	p.signal(stream, "exclude", fmt.Sprintf(`{"aliases": [%q], "reason": "maintenance"}`, excluded))
	began := time.Now()
	p.waitStatus(stream, "s1 off the excluded standby", 15*time.Second, func(st workflows.StreamStatus) (bool, string) {
		r := replicaOf(st, "s1")
		return r != "" && r != excluded && tabletStatus(st, "s1").State == workflows.Streaming, summary(st)
	})
	t.Logf("exclude of %s: s1 moved in %v", excluded, time.Since(began).Round(time.Millisecond))

	// The standby s2 reads from goes down: s2 moves to another replica
	// within its retry policy — at worst every backoff up to
	// maximumAttempts on the stopped standby, then a topology refresh
	// before the picker sees it down — plus a margin of 10 s for the trips
	// through the dev server (the failed attempts, the re-selection, the
	// new run, the tablet's report to the stream) on a 2-core machine the
	// servers and the worker share. The standby comes back and serves again.
	st, err = p.status(stream)
	require.NoError(t, err)
	down := replicaOf(st, "s2")
	require.NoError(t, p.node(down).Stop())
	began = time.Now()
	within := retryBackoffs(cfg.Retry) + cfg.TopologyRefresh.D() + 10*time.Second
	p.waitStatus(stream, "s2 off the stopped standby", within, func(st workflows.StreamStatus) (bool, string) {
		r := replicaOf(st, "s2")
		return r != "" && r != down && tabletStatus(st, "s2").State == workflows.Streaming, summary(st)
	})
	t.Logf("%s down: s2 moved in %v (bound %v)", down, time.Since(began).Round(time.Millisecond), within)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, p.node(down).Start(ctx))
	require.NoError(t, p.node(down).WaitStreaming(ctx))
	// Usable again: with s2's other two replicas excluded for s2, it reads
	// from the restarted standby (its slot behind the checkpoint, never
	// past it: it was advanced only to committed checkpoints).
	st, err = p.status(stream)
	require.NoError(t, err)
	p.signal(stream, "exclude", fmt.Sprintf(`{"aliases": [%q, "zone1-s2p"], "tablet": "s2", "reason": "force the restarted standby"}`, replicaOf(st, "s2")))
	p.waitStatus(stream, "s2 back on the restarted standby", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return replicaOf(st, "s2") == down && tabletStatus(st, "s2").State == workflows.Streaming, summary(st)
	})

	// Last (its sticky workflow tasks take the server a few seconds to
	// hand to the new worker): kill -9 of the worker mid-stream.
	worker.Kill()
	atKill := sinkRecords(out)
	p.startWorker()
	p.eventually("the new worker streams", 90*time.Second, func() (bool, string) {
		n := sinkRecords(out)
		return n > atKill+300, fmt.Sprintf("%d records, %d at the kill", n, atKill)
	})

	require.NoError(t, load.Stop())
	p.requireShardsExact(out, 2*time.Minute)
	t.Logf("workload: %+v", load.Stats())
	// Each shard's row shows its slot (after a run of 5 s): the WAL held
	// past the checkpoint, and no invalidation limit on this bed. A row
	// whose state has not changed since is updated by the tablet's next
	// paced report, due a minute after its last: two minutes, not one.
	st = p.waitStatus(stream, "every shard's slot in the status", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		for _, tab := range st.Tablets {
			if tab.Slot == nil {
				return false, tab.ID + " has no slot figures yet"
			}
		}
		return true, ""
	})
	for _, tab := range st.Tablets {
		require.GreaterOrEqual(t, tab.Slot.LagBytes, int64(0), tab.ID)
		require.Equal(t, int64(-1), tab.Slot.SafeWALBytes, tab.ID)
	}
	// The replicas' DSNs reached the workers only through the environment:
	// after a kill, an exclusion and a standby down (errors and all), no
	// history holds the password.
	p.requireNoSecretInHistories(stream, []byte(pgbed.Password))
}

func TestPostgresShardWithEverySlotLostExpiresAloneAndStopDropsTheSlots(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 2, Standbys: 1})
	p.startWorker()
	out := filepath.Join(p.dir, "out")
	const stream = "pglost"
	p.startStream(stream, p.config(out, map[string]any{"topologyRefresh": "2s"}))
	p.waitStatus(stream, "both shards streaming", 2*time.Minute, allStreaming(2))
	load := p.bed.StartWorkload(pgbed.WorkloadOptions{Rate: 40, Seed: 5, KeepGoing: true})
	p.eventually("records reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 100, fmt.Sprintf("%d records", n)
	})

	// Every replica of s1 loses the stream's slot (dropped by hand, the
	// session reading it ended first): no replica can serve s1's
	// checkpoint any more.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p.dropSlots(ctx, stream, 0)
	st := p.waitStatus(stream, "s1 Expired, s2 streaming", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, "s1").State == workflows.Expired && tabletStatus(st, "s2").State == workflows.Streaming, summary(st)
	})
	reason := tabletStatus(st, "s1").Reason
	t.Logf("s1: %s", reason)
	require.Contains(t, reason, "no replica of the shard can serve the checkpoint", "the reason says why")

	require.NoError(t, load.Stop())
	p.requireShardsExact(out, 2*time.Minute, "s2")

	// stop with dropSourceStream: the stream's slots and publications go.
	p.signal(stream, "stop", `{"dropSourceStream": true}`)
	require.NoError(t, p.temporal.GetWorkflow(ctx, stream, "").Get(ctx, nil), "the stream completes")
	for _, n := range p.bed.Nodes() {
		var slots, pubs int
		require.NoError(t, n.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'tf\_%'),
			(SELECT count(*) FROM pg_publication)`).Scan(&slots, &pubs))
		require.Zero(t, slots, "%s: no slot of the stream left", n.Name)
		require.Zero(t, pubs, "%s: no publication left", n.Name)
	}
}

func TestPostgresSnapshotStartCopiesExistingRowsExactlyThroughAWorkerKill(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 2, Standbys: 1})
	p.replay = pgbed.ReplaySnapshot
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, sh := range p.bed.Shards {
		require.NoError(t, sh.Primary.Exec(ctx, `INSERT INTO public.orders SELECT g, 'c' || g, g * 1.5,
			CASE WHEN g % 50 = 0 THEN repeat('n', 3000) END, now() FROM generate_series(1, 20000) g`))
		require.NoError(t, sh.Primary.Exec(ctx, `INSERT INTO public.items SELECT g, g, 'sku' || g, g % 7,
			CASE WHEN g % 25 = 0 THEN repeat('b', 3000) END FROM generate_series(1, 10000) g`))
	}
	const existing = 2 * 30000
	worker := p.startWorker()
	out := filepath.Join(p.dir, "out")
	const stream = "pgsnap"
	p.startStream(stream, p.config(out, map[string]any{"startFrom": "snapshot", "batch": map[string]any{"maxRecords": 100}}))
	p.waitStatus(stream, "both shards streaming", 2*time.Minute, allStreaming(2))
	// Changes to rows not yet copied and to new ones while the copy runs.
	load := p.bed.StartWorkload(pgbed.WorkloadOptions{Rate: 40, Seed: 11, KeepGoing: true})
	churn := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < 400 && err == nil && ctx.Err() == nil; i++ {
			sh := p.bed.Shards[i%2].Primary
			if i%2 == 0 {
				err = sh.Exec(ctx, `UPDATE public.items SET qty = qty + 1 WHERE id = $1`, 1+i*37%10000)
			} else {
				err = sh.Exec(ctx, `DELETE FROM public.orders WHERE id = $1`, 1+i*53%20000)
			}
		}
		churn <- err
	}()

	// kill -9 of the worker during the copy.
	p.eventually("the copy is under way", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 3000, fmt.Sprintf("%d records", n)
	})
	worker.Kill()
	atKill := sinkRecords(out)
	require.Less(t, atKill, uint64(existing), "killed during the copy")
	p.startWorker()
	require.NoError(t, <-churn)
	p.eventually("the copy is done", 3*time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= existing, fmt.Sprintf("%d records, %d at the kill", n, atKill)
	})
	require.NoError(t, load.Stop())
	p.requireShardsExact(out, 2*time.Minute)
	t.Logf("%d records in the sink, %d at the kill; workload %+v", sinkRecords(out), atKill, load.Stats())
}

// A standby's slot invalidated while the standby was excluded (WAL past its
// max_slot_wal_keep_size): once included again it is never read below its
// slot's new start — the tablet finds the slot re-made past its checkpoint
// and excludes the standby itself — and the stream stays exact.
func TestPostgresInvalidatedStandbySlotIsNeverReadBelowItsNewStart(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	prim, sb := p.bed.Shards[0].Primary, p.bed.Shards[0].Standbys[0]
	require.NoError(t, sb.Exec(ctx, `ALTER SYSTEM SET max_slot_wal_keep_size = '16MB'`))
	require.NoError(t, sb.Exec(ctx, `SELECT pg_reload_conf()`))
	p.startWorker()
	out := filepath.Join(p.dir, "out")
	const stream = "pginval"
	p.startStream(stream, p.config(out, map[string]any{"topologyRefresh": "2s"}))
	p.waitStatus(stream, "s1 streaming from the standby", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return replicaOf(st, "s1") == "zone2-s1a" && tabletStatus(st, "s1").State == workflows.Streaming, summary(st)
	})
	load := p.bed.StartWorkload(pgbed.WorkloadOptions{Rate: 40, Seed: 13, KeepGoing: true})
	p.signal(stream, "exclude", `{"aliases": ["zone2-s1a"], "reason": "maintenance"}`)
	p.waitStatus(stream, "s1 on the primary", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return replicaOf(st, "s1") == "zone1-s1p" && tabletStatus(st, "s1").State == workflows.Streaming, summary(st)
	})

	// WAL the stream does not publish, in bursts, until the standby's
	// unread slot is invalidated at a restartpoint (the reader advances
	// idle slots every 10 s, so a burst may need a second try).
	require.NoError(t, prim.Exec(ctx, `CREATE TABLE public.filler (b text); ALTER TABLE public.filler ALTER COLUMN b SET STORAGE EXTERNAL`))
	slot := postgres.SlotName(stream, "s1")
	p.eventually("the standby's slot invalidated", 2*time.Minute, func() (bool, string) {
		if err := prim.Exec(ctx, `INSERT INTO public.filler SELECT repeat(md5(g::text), 100) FROM generate_series(1, 20000) g`); err != nil {
			return false, err.Error()
		}
		if err := prim.Exec(ctx, `CHECKPOINT`); err != nil {
			return false, err.Error()
		}
		if err := p.bed.WaitReplayed(ctx); err != nil {
			return false, err.Error()
		}
		if err := sb.Exec(ctx, `CHECKPOINT`); err != nil {
			return false, err.Error()
		}
		var why *string
		if err := sb.QueryRow(ctx, `SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&why); err != nil {
			return false, err.Error()
		}
		return why != nil, "not invalidated yet"
	})

	// Included again: the tablet tries the preferred standby, finds its slot
	// invalidated (then re-made past the checkpoint), and stays off it.
	p.signal(stream, "include", `{"aliases": ["zone2-s1a"]}`)
	st := p.waitStatus(stream, "s1 excludes the standby by itself", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		for _, e := range tabletStatus(st, "s1").Excluded {
			if e.Alias == "zone2-s1a" && (strings.Contains(e.Reason, "SLOT_INVALIDATED") || strings.Contains(e.Reason, "POSITION_MISMATCH")) {
				return tabletStatus(st, "s1").State == workflows.Streaming, summary(st)
			}
		}
		return false, fmt.Sprintf("%s; excluded %+v", summary(st), tabletStatus(st, "s1").Excluded)
	})
	t.Logf("s1: %s, excluded %+v", replicaOf(st, "s1"), tabletStatus(st, "s1").Excluded)
	require.Equal(t, "zone1-s1p", replicaOf(st, "s1"))

	require.NoError(t, load.Stop())
	p.requireShardsExact(out, 2*time.Minute)
}
