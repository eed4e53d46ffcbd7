package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// The Vitess source end to end: a real Temporal dev server, worker
// processes, and the Vitess test bed (etcd, vtctld, keyspace commerce with
// shards -80 and 80-, each a primary in zone1 and replicas in zone2 and
// zone3 over MariaDB, vtgate; testbed/vitessbed). Each test ends with the
// proof: replaying each shard's JSONL file gives the shard's rows as read
// through vtgate, with no position twice and positions increasing per
// shard.

// vtEnv is an env (its tabletd unused) with a Vitess bed.
type vtEnv struct {
	*env
	bed *vitessbed.Cluster
}

func newVTEnv(t *testing.T) *vtEnv {
	t.Helper()
	bed := vitessbed.StartT(t, vitessbed.Options{})
	return &vtEnv{env: newEnv(t, "--rate", "0"), bed: bed}
}

// config is a stream config from the bed's keyspace into the JSONL
// directory out, starting at each shard's current position.
func (v *vtEnv) config(out string, extra map[string]any) []byte {
	m := map[string]any{
		"source":    map[string]any{"kind": "vitess", "vtctld": v.bed.Addresses().Vtctld, "keyspace": vitessbed.Keyspace, "tables": vitessbed.Tables},
		"startFrom": "latest",
	}
	for k, val := range extra {
		m[k] = val
	}
	return v.env.config(out, m)
}

// requireShardsExact waits until replaying each shard's JSONL file (every
// shard, or those listed) gives the shard's rows as vtgate reads them from
// its primary, then checks that
// no position is stored twice and positions increase in each file.
func (v *vtEnv) requireShardsExact(out string, within time.Duration, only ...string) {
	v.t.Helper()
	v.eventually("replaying the sink gives every shard's rows", within, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		recs, err := sinkRecordsByTablet(out)
		if err != nil {
			return false, err.Error()
		}
		for _, shard := range vitessbed.Shards {
			if len(only) > 0 && !slices.Contains(only, shard) {
				continue
			}
			if ok, why := v.replayIsShard(ctx, shard, recs[shard]); !ok {
				return false, why
			}
		}
		return true, ""
	})
	r, err := jsonl.DigestDir(out)
	require.NoError(v.t, err)
	require.Empty(v.t, r.Duplicates, "no (tablet, position) twice")
	v.requireOrdered(out)
}

// sinkRecordsByTablet reads every tablet's records in the JSONL sink
// directory out, in the order of their files.
func sinkRecordsByTablet(out string) (map[string][]source.Record, error) {
	lines, err := jsonl.ReadDir(out)
	if err != nil {
		return nil, err
	}
	recs := map[string][]source.Record{}
	for tablet, ls := range lines {
		for _, l := range ls {
			r, err := l.Record()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", tablet, err)
			}
			recs[tablet] = append(recs[tablet], r)
		}
	}
	return recs, nil
}

// replayIsShard reports whether replaying recs gives the shard's rows as
// vtgate reads them from its primary, and if not, where they differ.
func (v *vtEnv) replayIsShard(ctx context.Context, shard string, recs []source.Record) (bool, string) {
	got, err := vitessbed.Replay(recs)
	if err != nil {
		return false, fmt.Sprintf("%s: %v", shard, err)
	}
	want, err := v.bed.ShardRows(ctx, shard)
	if err != nil {
		return false, err.Error()
	}
	if d := vitessbed.Diff(want, got); d != "" {
		return false, shard + " " + d
	}
	return true, ""
}

// stopAndRequireExact stops the workload, then requires the sink exact for
// every shard (or those listed) within 2 minutes (requireShardsExact), and
// logs the workload's figures.
func (v *vtEnv) stopAndRequireExact(load *vitessbed.Workload, out string, only ...string) {
	v.t.Helper()
	require.NoError(v.t, load.Stop())
	v.requireShardsExact(out, 2*time.Minute, only...)
	v.t.Logf("workload %+v", load.Stats())
}

// pauseAndPurge pauses a shard's tablet and waits until it is Paused (its
// reader lets go of the binary logs it read), then purges the binary logs
// of each of the vttablets given up to past the shard's checkpoint in the
// sink, which it returns.
func (v *vtEnv) pauseAndPurge(stream, out, shard string, purge ...*vitessbed.Tablet) source.Checkpoint {
	v.t.Helper()
	v.signal(stream, "pause", fmt.Sprintf(`{"tablets": [%q]}`, shard))
	v.waitStatus(stream, shard+" paused", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, shard).State == workflows.Paused, summary(st)
	})
	cp := sinkCheckpoint(out, shard)
	require.NotEmpty(v.t, cp.Opaque, "%s has a checkpoint in the sink", shard)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, tab := range purge {
		v.eventually(tab.Alias+" purged past "+cp.Opaque, time.Minute, func() (bool, string) {
			begins, err := tab.PurgeBinlogs(ctx, cp.Opaque)
			return err == nil, fmt.Sprintf("binary logs begin at %s: %v", begins, err)
		})
	}
	return cp
}

// waitStarted waits until the sink holds a checkpoint of every shard: the
// stream starts each shard at its position when its tablet first reads,
// and changes made before are not due, so a test's writes begin after.
func (v *vtEnv) waitStarted(out string) {
	v.t.Helper()
	v.eventually("every shard has a checkpoint in the sink", time.Minute, func() (bool, string) {
		for _, shard := range vitessbed.Shards {
			if sinkCheckpoint(out, shard).IsZero() {
				return false, shard + " has no checkpoint yet"
			}
		}
		return true, ""
	})
}

// sinkCheckpoint is the latest checkpoint in a tablet's manifest (the
// JSONL sink's commit record: two slots of one JSON line each), read
// without the sink's lock; zero if none.
func sinkCheckpoint(out, tablet string) source.Checkpoint {
	var cp source.Checkpoint
	b, err := os.ReadFile(filepath.Join(out, tablet+".manifest.json"))
	if err != nil {
		return cp
	}
	for line := range bytes.Lines(b) {
		var slot struct {
			Manifest struct {
				Checkpoint source.Checkpoint `json:"checkpoint"`
			} `json:"manifest"`
		}
		if json.Unmarshal(line, &slot) == nil {
			cp = source.Max(cp, slot.Manifest.Checkpoint)
		}
	}
	return cp
}

// isPrimary reports whether an alias is one of the bed's primaries (cell
// zone1).
func isPrimary(alias string) bool { return strings.HasPrefix(alias, vitessbed.PrimaryCell+"-") }

// fromReplicas is a waitStatus condition: every shard Streaming from a
// replica (not a primary).
func fromReplicas(st workflows.StreamStatus) (bool, string) {
	ok, why := allStreaming(len(vitessbed.Shards))(st)
	for _, tab := range st.Tablets {
		ok = ok && tab.Replica != "" && !isPrimary(tab.Replica)
	}
	return ok, why
}

func TestVitessStreamFromReplicasIsExactThroughAWorkerKill(t *testing.T) {
	v := newVTEnv(t)
	worker := v.startWorker()
	out := filepath.Join(v.dir, "out")
	const stream = "vt"
	v.startStream(stream, v.config(out, map[string]any{"topologyRefresh": "2s"}))

	// Both shards stream from a replica (REPLICA before PRIMARY by default).
	st := v.waitStatus(stream, "both shards streaming from a replica", 2*time.Minute, fromReplicas)
	t.Logf("reading -80 from %s, 80- from %s", replicaOf(st, "-80"), replicaOf(st, "80-"))
	v.waitStarted(out)
	load := v.bed.StartWorkload(vitessbed.WorkloadOptions{Rate: 30, Seed: 3, KeepGoing: true})
	v.eventually("records reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 300, fmt.Sprintf("%d records", n)
	})

	// kill -9 of the worker mid-stream.
	worker.Kill()
	atKill := sinkRecords(out)
	v.startWorker()
	v.eventually("the new worker streams", 2*time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n > atKill+300, fmt.Sprintf("%d records, %d at the kill", n, atKill)
	})

	require.NoError(t, load.Stop())
	stats := load.Stats()
	require.Positive(t, stats.KeyUpdates, "the workload updated keys")
	require.Positive(t, stats.MultiRowTxs, "and wrote transactions of several rows")
	v.requireShardsExact(out, 2*time.Minute)
	t.Logf("workload %+v; %d records in the sink, %d at the kill", stats, sinkRecords(out), atKill)
	for _, shard := range vitessbed.Shards {
		cp := sinkCheckpoint(out, shard)
		require.True(t, strings.HasPrefix(cp.Opaque, "MariaDB/"), "%s: the checkpoint %s holds the shard's GTID position", shard, cp)
	}
}

// The seed's case on a real cluster: a replica whose replication stopped
// is picked after the stream moved past it; it answers GTIDSet Mismatch,
// the shard moves to another vttablet, and the status shows the replica
// excluded for that reason. With its replication started again and the
// exclusion lifted, it serves the shard again.
func TestVitessReplicaBehindThePositionAnswersGTIDSetMismatchAndTheShardMovesOn(t *testing.T) {
	v := newVTEnv(t)
	v.startWorker()
	out := filepath.Join(v.dir, "out")
	const stream = "vtseed"
	// A stopped replica's lag grows as its vttablet sees it; maxLag must
	// not be what keeps it from being picked.
	v.startStream(stream, v.config(out, map[string]any{"topologyRefresh": "2s",
		"selection": map[string]any{"maxLag": "1h"}}))
	st := v.waitStatus(stream, "both shards streaming from a replica", 2*time.Minute, fromReplicas)
	v.waitStarted(out)
	const shard = "-80"
	reading := replicaOf(st, shard)
	var behind *vitessbed.Tablet
	for _, r := range v.bed.Replicas(shard) {
		if r.Alias != reading {
			behind = r
		}
	}
	require.NotNil(t, behind)
	t.Logf("%s reads from %s; %s falls behind", shard, reading, behind.Alias)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	require.NoError(t, behind.StopReplication(ctx))
	load := v.bed.StartWorkload(vitessbed.WorkloadOptions{Rate: 30, Seed: 7, KeepGoing: true})
	// The stream moves past the stopped replica's position.
	stopped, err := behind.Position(ctx)
	require.NoError(t, err)
	v.eventually(shard+" past the stopped replica", time.Minute, func() (bool, string) {
		cp := sinkCheckpoint(out, shard)
		return cp.Compare(source.Checkpoint{Term: gtidCount(t, stopped)}) > 0,
			fmt.Sprintf("checkpoint %s in the sink, stopped replica at %s", cp, stopped)
	})

	// The operator takes the replica read out of service: the picker's
	// next choice is the other replica (REPLICA before PRIMARY), the one
	// behind. It answers GTIDSet Mismatch and the shard moves on, to the
	// primary, with the replica behind excluded for that reason.
	v.signal(stream, "exclude", fmt.Sprintf(`{"aliases": [%q], "tablet": %q, "reason": "maintenance"}`, reading, shard))
	st = v.waitStatus(stream, shard+" off the replica behind, which is excluded as POSITION_MISMATCH", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		tab := tabletStatus(st, shard)
		for _, e := range tab.Excluded {
			if e.Alias == behind.Alias && strings.Contains(e.Reason, "POSITION_MISMATCH") {
				return tab.State == workflows.Streaming && tab.Replica != behind.Alias && tab.Replica != reading, summary(st)
			}
		}
		return false, fmt.Sprintf("%s; excluded %+v", summary(st), tab.Excluded)
	})
	t.Logf("%s: on %s, excluded %+v", shard, replicaOf(st, shard), tabletStatus(st, shard).Excluded)
	require.True(t, isPrimary(replicaOf(st, shard)), "the primary is the one left")

	// Replication started again and the exclusions lifted: with the
	// primary and the other replica excluded, the shard reads from it.
	require.NoError(t, behind.StartReplication(ctx))
	require.NoError(t, behind.WaitCaughtUp(ctx))
	v.signal(stream, "include", fmt.Sprintf(`{"aliases": [%q, %q]}`, behind.Alias, reading))
	v.signal(stream, "exclude", fmt.Sprintf(`{"aliases": [%q, %q], "tablet": %q, "reason": "force the replica that was behind"}`,
		reading, v.bed.Primary(shard).Alias, shard))
	v.waitStatus(stream, shard+" back on the replica that was behind", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		tab := tabletStatus(st, shard)
		return tab.Replica == behind.Alias && tab.State == workflows.Streaming, summary(st)
	})
	v.eventually("it delivers", time.Minute, func() (bool, string) {
		before := sinkRecords(out)
		time.Sleep(2 * time.Second)
		n := sinkRecords(out)
		return n > before, fmt.Sprintf("%d records", n)
	})

	v.stopAndRequireExact(load, out)
}

// Every vttablet of one shard purged the binary logs holding the shard's
// checkpoint while its tablet was paused: the tablet is Expired, saying
// why, and the other shard streams on, exactly. A resync then copies the
// shard's rows again at its primary's position, between its markers,
// under the workload: both shards end exact.
func TestVitessShardWhoseEveryVttabletPurgedThePositionExpiresAloneAndAResyncMakesItExact(t *testing.T) {
	v := newVTEnv(t)
	v.startWorker()
	out := filepath.Join(v.dir, "out")
	const stream = "vtgone"
	v.startStream(stream, v.config(out, map[string]any{"topologyRefresh": "2s"}))
	v.waitStatus(stream, "both shards streaming", 2*time.Minute, allStreaming(len(vitessbed.Shards)))
	v.waitStarted(out)
	load := v.bed.StartWorkload(vitessbed.WorkloadOptions{Rate: 30, Seed: 9, KeepGoing: true})
	v.eventually("records reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 100, fmt.Sprintf("%d records", n)
	})

	// -80 pauses (its reader lets go of the binary logs it read), the
	// workload goes on, and every vttablet of -80 purges its binary logs
	// up to past -80's checkpoint.
	const shard = "-80"
	var all []*vitessbed.Tablet
	for _, tab := range v.bed.Tablets() {
		if tab.Shard == shard {
			all = append(all, tab)
		}
	}
	cp := v.pauseAndPurge(stream, out, shard, all...)

	v.signal(stream, "resume", fmt.Sprintf(`{"tablets": [%q]}`, shard))
	st := v.waitStatus(stream, shard+" Expired, 80- streaming", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, shard).State == workflows.Expired && tabletStatus(st, "80-").State == workflows.Streaming, summary(st)
	})
	reason := tabletStatus(st, shard).Reason
	t.Logf("%s: %s", shard, reason)
	require.Contains(t, reason, "no vttablet of shard -80 holds position "+cp.Opaque+" any more", "the reason says why")
	v.requireShardsExact(out, 2*time.Minute, "80-")

	// The resync: -80 copies its rows again, then streams, while the
	// workload goes on.
	v.signal(stream, "resync", fmt.Sprintf(`{"tablets": [%q], "reason": "binary logs purged"}`, shard))
	st = v.waitStatus(stream, shard+"'s resync copy done", 3*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		tab := tabletStatus(st, shard)
		return tab.State == workflows.Streaming && tab.Copy != nil && tab.Copy.Kind == source.CopyResync && tab.Copy.Done, summary(st)
	})
	t.Logf("%s: %+v", shard, tabletStatus(st, shard).Copy)
	v.stopAndRequireExact(load, out)

	// Its file: the records before the expiry, a resync-begin after them,
	// the copy's reads, one resync-end, then changes.
	recs, err := sinkRecordsByTablet(out)
	require.NoError(t, err)
	var ops []source.Op
	for _, r := range recs[shard] {
		if len(ops) == 0 || ops[len(ops)-1] != r.Op || r.Op.Marker() {
			ops = append(ops, r.Op)
		}
	}
	begin := slices.Index(ops, source.ResyncBegin)
	end := slices.Index(ops, source.ResyncEnd)
	require.Positive(t, begin, "records before the resync-begin: %v", ops)
	require.Greater(t, end, begin, "a resync-end after it: %v", ops)
	require.Contains(t, ops[begin:end], source.Read, "the copy's reads between the markers: %v", ops)
	require.Equal(t, 1, strings.Count(fmt.Sprint(ops), string(source.ResyncEnd)), "one copy: %v", ops)
	i := slices.IndexFunc(recs[shard], func(r source.Record) bool { return r.Op == source.ResyncBegin })
	require.Positive(t, recs[shard][i].Position.Compare(cp), "the resync begins after the expired checkpoint %s", cp)
}

// gtidCount is the transactions a MariaDB GTID position holds (the sum of
// its domains' sequence numbers), as the vitess source counts them.
func gtidCount(t *testing.T, pos string) uint64 {
	t.Helper()
	var n uint64
	for g := range strings.SplitSeq(strings.TrimPrefix(pos, "MariaDB/"), ",") {
		var d, s, seq uint64
		_, err := fmt.Sscanf(g, "%d-%d-%d", &d, &s, &seq)
		require.NoError(t, err, pos)
		n += seq
	}
	return n
}
