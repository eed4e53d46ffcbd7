package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// More of the Vitess source on the real test bed (the harness is
// vitess_test.go's): a vttablet killed under its shard, a replica that
// purged the shard's position, and an operator's exclude and include of a
// replica. Each ends with the same proof: replaying each shard's JSONL
// gives its rows through vtgate, no position twice, positions increasing.

// healthWait is how long source/vitess waits for a vttablet's health (its
// healthTimeout, docs/sources/vitess.md: "2 s each"): what each retry's
// look at its replica's health can take when the vttablet does not answer.
const healthWait = 2 * time.Second

// commitsElsewhere waits until shard commits from a replica other than
// from, by began+within: its status shows it Streaming on another replica
// (a tablet whose last run failed shows Streaming again only once a run
// committed), and the sink's checkpoint of the shard then passes the one
// it held when the status first showed that — which no commit of data
// read from `from` can do, as the run leaves a replica (or fails on it)
// after committing what it read there. check, if set, sees every status
// read meanwhile. It returns the replica and how long after began the
// commit was seen.
func (v *vtEnv) commitsElsewhere(stream, out, shard, from string, began time.Time, within time.Duration,
	check func(workflows.StreamStatus)) (string, time.Duration) {
	v.t.Helper()
	var to string
	var at source.Checkpoint
	v.eventually(fmt.Sprintf("%s commits from a replica other than %s within %v", shard, from, within), within-time.Since(began),
		func() (bool, string) {
			st, err := v.status(stream)
			if err != nil {
				return false, err.Error()
			}
			if check != nil {
				check(st)
			}
			tab := tabletStatus(st, shard)
			if to == "" {
				if tab.State != workflows.Streaming || tab.Replica == "" || tab.Replica == from {
					return false, summary(st)
				}
				to, at = tab.Replica, sinkCheckpoint(out, shard)
			}
			require.NotEqual(v.t, from, tab.Replica, "%s back on %s: %s", shard, from, summary(st))
			cp := sinkCheckpoint(out, shard)
			return cp.Compare(at) > 0, fmt.Sprintf("%s on %s since the sink held %s; it holds %s", shard, to, at, cp)
		})
	return to, time.Since(began)
}

// vstreams reads a vttablet's VStream counters from its /debug/vars: the
// VStreams it serves now (VStreamerCount) and has ever been asked for
// (VStreamersCreated, failed ones too). A commit read from a vttablet
// needs a VStream on it.
func vstreams(tab *vitessbed.Tablet) (open, created int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+tab.HTTP+"/debug/vars", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%s /debug/vars: %s", tab.Alias, resp.Status)
	}
	var vars struct{ VStreamerCount, VStreamersCreated int64 }
	if err := json.NewDecoder(resp.Body).Decode(&vars); err != nil {
		return 0, 0, fmt.Errorf("%s /debug/vars: %w", tab.Alias, err)
	}
	return vars.VStreamerCount, vars.VStreamersCreated, nil
}

// A replica's vttablet killed (kill -9) while it serves a shard: the shard
// commits from another vttablet within what the stream's retry policy
// allows, and the other shard streams on from its replica throughout. The
// vttablet restarted, the stream is exact.
func TestVitessVttabletKilledUnderItsShardMovesItWithinTheRetryPolicy(t *testing.T) {
	v := newVTEnv(t)
	v.startWorker()
	out := filepath.Join(v.dir, "out")
	const stream = "vtkill"
	raw := v.config(out, map[string]any{"topologyRefresh": "2s"})
	cfg, err := config.Decode(raw)
	require.NoError(t, err)
	require.Positive(t, cfg.Retry.Attempts(), "the test's policy gives up on a replica")
	v.startStream(stream, raw)
	v.waitStatus(stream, "both shards streaming from a replica", 2*time.Minute, fromReplicas)
	v.waitStarted(out)
	load := v.bed.StartWorkload(vitessbed.WorkloadOptions{Rate: 30, Seed: 11, KeepGoing: true})
	v.eventually("records reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 100, fmt.Sprintf("%d records", n)
	})

	const shard, other = "-80", "80-"
	st, err := v.status(stream)
	require.NoError(t, err)
	killed := v.bed.Tablet(replicaOf(st, shard))
	require.NotNil(t, killed, "%s reads from a vttablet of the bed: %s", shard, summary(st))
	otherOn, otherAt := replicaOf(st, other), sinkCheckpoint(out, other)
	killed.Kill()
	began := time.Now()
	// At worst every retry on the dead vttablet fails: the policy's
	// backoffs between its maximumAttempts, each attempt's look at the
	// vttablet's health (which does not answer), then the tablet's first
	// backoff of 1 s (workflows' minBackoff) before it selects again; plus
	// 10 s for the trips through the dev server (the failed attempts, the
	// selection, the new run and its first commit, the report to the
	// stream) on a 2-core machine the bed, the servers and the worker share.
	// (A dead vttablet's health normally fails the second attempt at once:
	// the tablet selects another then.)
	within := retryBackoffs(cfg.Retry) + time.Duration(cfg.Retry.Attempts())*healthWait + time.Second + 10*time.Second
	to, took := v.commitsElsewhere(stream, out, shard, killed.Alias, began, within, func(st workflows.StreamStatus) {
		tab := tabletStatus(st, other)
		require.True(t, tab.State == workflows.Streaming && tab.Replica == otherOn,
			"%s streams on from %s while %s moves: %s", other, otherOn, shard, summary(st))
	})
	t.Logf("%s killed: %s commits from %s after %v (bound %v)", killed.Alias, shard, to, took.Round(time.Millisecond), within)
	v.eventually(other+" commits on", 30*time.Second, func() (bool, string) {
		cp := sinkCheckpoint(out, other)
		return cp.Compare(otherAt) > 0, fmt.Sprintf("%s at %s, %s at the kill", other, cp, otherAt)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	require.NoError(t, killed.Restart(ctx))
	require.NoError(t, load.Stop())
	v.requireShardsExact(out, 2*time.Minute)
	t.Logf("workload %+v; %s excluded %+v", load.Stats(), shard, tabletStatus(v.mustStatus(stream), shard).Excluded)
}

// A replica whose binary logs were purged past the stream's position,
// the shard's other vttablets still holding it: picked first again (its
// cell comes first), it answers that the logs are gone; the shard reads on
// from the next vttablet in the picker's order, and its status lists the
// purged one excluded as BINLOG_PURGED.
func TestVitessReplicaThatPurgedThePositionIsLeftForOneThatHoldsIt(t *testing.T) {
	v := newVTEnv(t)
	v.startWorker()
	out := filepath.Join(v.dir, "out")
	const stream, shard = "vtpurge", "-80"
	var purged, next *vitessbed.Tablet
	for _, r := range v.bed.Replicas(shard) {
		switch r.Cell {
		case "zone2":
			purged = r
		case "zone3":
			next = r
		}
	}
	require.NotNil(t, purged)
	require.NotNil(t, next)
	// zone2 first: each shard reads its zone2 replica, and picks it first
	// again after the purge.
	raw := v.config(out, map[string]any{"topologyRefresh": "2s", "selection": map[string]any{"cells": []string{"zone2"}}})
	cfg, err := config.Decode(raw)
	require.NoError(t, err)
	v.startStream(stream, raw)
	v.waitStatus(stream, "both shards streaming from their zone2 replica", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		ok, why := fromReplicas(st)
		return ok && replicaOf(st, shard) == purged.Alias, why
	})
	v.waitStarted(out)
	load := v.bed.StartWorkload(vitessbed.WorkloadOptions{Rate: 30, Seed: 17, KeepGoing: true})
	v.eventually("records reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 100, fmt.Sprintf("%d records", n)
	})

	// The shard pauses (its reader lets go of the binary log it read), the
	// workload goes on, and its zone2 replica alone purges its binary logs
	// up to past the shard's checkpoint.
	v.pauseAndPurge(stream, out, shard, purged)
	_, askedBefore, err := vstreams(purged)
	require.NoError(t, err)

	v.signal(stream, "resume", fmt.Sprintf(`{"tablets": [%q]}`, shard))
	st := v.waitStatus(stream, shard+" off "+purged.Alias+", which is excluded as BINLOG_PURGED", 2*time.Minute,
		func(st workflows.StreamStatus) (bool, string) {
			tab := tabletStatus(st, shard)
			for _, e := range tab.Excluded {
				if e.Alias == purged.Alias && e.Reason == "BINLOG_PURGED" {
					return tab.State == workflows.Streaming && tab.Replica != "" && tab.Replica != purged.Alias, summary(st)
				}
			}
			return false, fmt.Sprintf("%s; excluded %+v", summary(st), tab.Excluded)
		})
	tab := tabletStatus(st, shard)
	t.Logf("%s: on %s, excluded %+v", shard, tab.Replica, tab.Excluded)
	require.Equal(t, next.Alias, tab.Replica, "the next in the picker's order: the other replica, before the primary")
	for _, e := range tab.Excluded {
		if e.Alias == purged.Alias {
			require.WithinDuration(t, time.Now().Add(cfg.AutoExcludeTTL.D()), e.Expires, time.Minute, "excluded for autoExcludeTTL")
		}
	}
	require.Equal(t, workflows.Streaming, tabletStatus(st, "80-").State, "80- streams on: %s", summary(st))
	_, askedAfter, err := vstreams(purged)
	require.NoError(t, err)
	require.Greater(t, askedAfter, askedBefore, "the purged replica was asked for the position")
	at := sinkCheckpoint(out, shard)
	v.eventually(shard+" commits from "+next.Alias, time.Minute, func() (bool, string) {
		now := sinkCheckpoint(out, shard)
		return now.Compare(at) > 0, fmt.Sprintf("%s at %s, %s at the move", shard, now, at)
	})

	v.stopAndRequireExact(load, out)
}

// An operator excludes the replica a shard reads, with the starter: the
// shard commits from another within seconds (its runs last a minute, so
// it is the exclusion that moves it, not a run's end) and never from the
// excluded one after; included again, it is off the stream's exclude list
// and, the shard's two other vttablets excluded for it, read again.
func TestVitessOperatorExclusionMovesAShardOffAReplicaWithinSecondsAndIncludeMakesItEligible(t *testing.T) {
	v := newVTEnv(t)
	v.startWorker()
	out := filepath.Join(v.dir, "out")
	const stream, shard = "vtexclude", "-80"
	v.startStream(stream, v.config(out, map[string]any{"topologyRefresh": "2s",
		"run": map[string]any{"duration": "1m", "heartbeatTimeout": "5s"}}))
	v.waitStatus(stream, "both shards streaming from a replica", 2*time.Minute, fromReplicas)
	v.waitStarted(out)
	load := v.bed.StartWorkload(vitessbed.WorkloadOptions{Rate: 30, Seed: 13, KeepGoing: true})
	v.eventually("records reach the sink", time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 100, fmt.Sprintf("%d records", n)
	})

	st, err := v.status(stream)
	require.NoError(t, err)
	excluded := v.bed.Tablet(replicaOf(st, shard))
	require.NotNil(t, excluded, "%s reads from a vttablet of the bed: %s", shard, summary(st))
	open, _, err := vstreams(excluded)
	require.NoError(t, err)
	require.Positive(t, open, "%s serves %s's VStream", excluded.Alias, shard)

	// From the command to the first commit from another replica: 10 s.
	const bound = 10 * time.Second
	began := time.Now()
	msg, err := v.starter("exclude", stream, "--aliases", excluded.Alias, "--reason", "maintenance")
	require.NoError(t, err, msg)
	to, took := v.commitsElsewhere(stream, out, shard, excluded.Alias, began, bound, nil)
	t.Logf("exclude of %s: %s commits from %s after %v", excluded.Alias, shard, to, took.Round(time.Millisecond))
	st = v.mustStatus(stream)
	require.Len(t, st.Exclude, 1, summary(st))
	require.Equal(t, excluded.Alias, st.Exclude[0].Alias)
	require.Equal(t, "maintenance", st.Exclude[0].Reason)

	// No commit from it after the move: its VStream closes, and no other
	// is asked of it while the shard commits on from elsewhere.
	var asked int64
	v.eventually(excluded.Alias+" serves no VStream", 10*time.Second, func() (bool, string) {
		var err error
		open, asked, err = vstreams(excluded)
		return err == nil && open == 0, fmt.Sprintf("%d open: %v", open, err)
	})
	atMove := sinkRecordsOf(out, shard)
	v.eventually(shard+" commits on off "+excluded.Alias, time.Minute, func() (bool, string) {
		st, err := v.status(stream)
		if err != nil {
			return false, err.Error()
		}
		require.NotEqual(t, excluded.Alias, replicaOf(st, shard), "%s back on the excluded replica: %s", shard, summary(st))
		n := sinkRecordsOf(out, shard)
		return n >= atMove+100, fmt.Sprintf("%d records of %s, %d at the move", n, shard, atMove)
	})
	open, askedLater, err := vstreams(excluded)
	require.NoError(t, err)
	require.Zero(t, open, "%s serves no VStream while excluded", excluded.Alias)
	require.Equal(t, asked, askedLater, "no VStream was asked of %s while excluded", excluded.Alias)

	// Included again: off the stream's list, so eligible; with the shard's
	// two other vttablets excluded for it, the shard reads from it again.
	msg, err = v.starter("include", stream, "--aliases", excluded.Alias)
	require.NoError(t, err, msg)
	v.waitStatus(stream, excluded.Alias+" off the exclude list", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
		return len(st.Exclude) == 0, summary(st)
	})
	msg, err = v.starter("exclude", stream, "--aliases", to+","+v.bed.Primary(shard).Alias, "--tablet", shard,
		"--reason", "read the included replica")
	require.NoError(t, err, msg)
	back, _ := v.commitsElsewhere(stream, out, shard, to, time.Now(), time.Minute, nil)
	require.Equal(t, excluded.Alias, back, "%s reads the included replica again", shard)
	_, askedAgain, err := vstreams(excluded)
	require.NoError(t, err)
	require.Greater(t, askedAgain, askedLater, "%s is asked for a VStream again", excluded.Alias)

	v.stopAndRequireExact(load, out)
}

// mustStatus is the stream's status, failing the test if it cannot be
// read.
func (v *vtEnv) mustStatus(stream string) workflows.StreamStatus {
	v.t.Helper()
	st, err := v.status(stream)
	require.NoError(v.t, err)
	return st
}
