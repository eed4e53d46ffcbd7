package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// Every slot of shard s1 is dropped under a write workload, and rows of
// s1 are deleted while it is Expired (changes no stream will ever read).
// Two streams over the same shards see it: one into JSONL, one into a
// PostgreSQL sink in apply mode. The operator resyncs s1 on both, one
// after the other; a worker is killed (kill -9) in the middle of the
// second one's copy. Afterwards:
// replaying each shard's JSONL (the records before the expiry, then,
// from resync-begin on, the copy and the changes) gives the shard's
// tables, with no position twice and positions increasing across the
// resync; the mirror tables hold exactly the shards' rows (the rows
// deleted while s1 was Expired are gone); and the JSONL stream's s2
// streamed on while its s1 was resynced, its newest record never more
// than 2 s old.
func TestPostgresResyncRecoversAnExpiredShardExactlyThroughAWorkerKill(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 2, Standbys: 1})
	p.replay = pgbed.ReplaySnapshot // the streams start with a copy
	target := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	t.Setenv("TF_E2E_TARGET_DSN", target.DSN())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s1 := p.bed.Shards[0].Primary
	// Rows the resync's copy will take a while over (and ids the
	// workload does not use).
	require.NoError(t, s1.Exec(ctx, `INSERT INTO public.orders SELECT g, 'c' || g, g * 1.5, NULL, now() FROM generate_series(1000001, 1030000) g`))
	worker := p.startWorker()
	out := filepath.Join(p.dir, "out")
	const logged, mirrored = "pgresync", "pgresyncmirror"
	small := map[string]any{"batch": map[string]any{"maxRecords": 100}, "startFrom": "snapshot"}
	p.startStream(logged, p.config(out, small))
	p.startStream(mirrored, p.config("", map[string]any{"batch": small["batch"], "startFrom": "snapshot",
		"sink": map[string]any{"kind": "postgres", "dsnEnv": "TF_E2E_TARGET_DSN", "mode": "apply", "schema": "mirror"}}))
	p.waitStatus(logged, "both shards streaming", 2*time.Minute, allStreaming(2))
	p.waitStatus(mirrored, "both shards streaming", 2*time.Minute, allStreaming(2))
	load := p.bed.StartWorkload(pgbed.WorkloadOptions{Rate: 40, Seed: 21, KeepGoing: true})
	p.eventually("the first copy is done and changes reach the sink", 3*time.Minute, func() (bool, string) {
		n := sinkRecords(out)
		return n >= 30000+100, fmt.Sprintf("%d records", n)
	})

	for _, stream := range []string{logged, mirrored} {
		p.dropSlots(ctx, stream, 0)
	}
	for _, stream := range []string{logged, mirrored} {
		p.waitStatus(stream, "s1 Expired, s2 streaming", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
			return tabletStatus(st, "s1").State == workflows.Expired && tabletStatus(st, "s2").State == workflows.Streaming, summary(st)
		})
	}
	require.NoError(t, s1.Exec(ctx, `DELETE FROM public.orders WHERE id BETWEEN 1000001 AND 1000500`))

	// The JSONL stream's s1 first, s2's newest record sampled meanwhile.
	lag := watchNewest(t, filepath.Join(out, "s2.jsonl"))
	p.signal(logged, workflows.CmdResync, `{"tablets": ["s1"], "reason": "e2e: slots dropped"}`)
	p.eventually("the JSONL stream's copy is complete", 4*time.Minute, func() (bool, string) {
		return hasOp(t, out, "s1", source.ResyncEnd), fmt.Sprintf("%d rows copied", readsAfterBegin(t, out, "s1"))
	})
	maxLag := lag()
	t.Logf("JSONL: %d rows copied; s2's newest record at most %v old meanwhile", readsAfterBegin(t, out, "s1"), maxLag)

	// Then the mirror's, with the worker killed in the middle of it.
	p.signal(mirrored, workflows.CmdResync, `{"tablets": ["s1"], "reason": "e2e: slots dropped"}`)
	p.waitStatus(mirrored, "the mirror's s1 resynced", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, "s1").Resyncs == 1, summary(st)
	})
	chunks := func() int { // the resync deleted the first copy's

		var n int
		require.NoError(t, s1.QueryRow(ctx, `SELECT count(*) FROM tabletflow.snapshot_chunks WHERE stream = $1 AND acked`, mirrored).Scan(&n))
		return n
	}
	p.eventually("the mirror's copy is under way", 2*time.Minute, func() (bool, string) {
		n := chunks()
		return n >= 5, fmt.Sprintf("%d chunks copied", n)
	})
	worker.Kill()
	atKill := chunks()
	p.startWorker()
	p.eventually("the mirror's copy is complete", 4*time.Minute, func() (bool, string) {
		var done bool
		err := s1.QueryRow(ctx, `SELECT EXISTS (SELECT FROM tabletflow.snapshot_chunks WHERE stream = $1 AND acked AND all_done)`, mirrored).Scan(&done)
		return err == nil && done, fmt.Sprintf("%d chunks copied, %d at the kill (%v)", chunks(), atKill, err)
	})
	require.Less(t, atKill, chunks(), "killed in the middle of the copy")
	require.NoError(t, load.Stop())
	for _, stream := range []string{logged, mirrored} {
		st := p.waitStatus(stream, "both shards streaming again", 2*time.Minute, allStreaming(2))
		require.Equal(t, 1, tabletStatus(st, "s1").Resyncs)
	}
	p.requireShardsExact(out, 3*time.Minute)
	p.requireMirrorExact(ctx, target, 3*time.Minute)
	require.Less(t, maxLag, 2*time.Second, "the JSONL stream's s2 streamed on while its s1 was resynced")
	t.Logf("mirror: %d of %d chunks copied at the kill", atKill, chunks())
	require.Less(t, maxLag, 2*time.Second, "s2 streamed on while s1 was resynced")
}

// dropSlots drops every replica's slot of stream on shard i (ending the
// session that reads it first): no replica can serve its checkpoint.
func (p *pgEnv) dropSlots(ctx context.Context, stream string, i int) {
	p.t.Helper()
	for _, n := range p.bed.Shards[i].Nodes() {
		require.NoError(p.t, pgbed.DropSlot(ctx, n.DSN(), postgres.SlotName(stream, fmt.Sprintf("s%d", i+1))), n.Name)
	}
}

// tabletLines reads one tablet's committed JSONL lines.
func tabletLines(t *testing.T, out, tablet string) []jsonl.Line {
	lines, err := jsonl.ReadDir(out)
	require.NoError(t, err)
	return lines[tablet]
}

// readsAfterBegin counts the read records after the tablet's last
// resync-begin.
func readsAfterBegin(t *testing.T, out, tablet string) int {
	n := -1
	for _, l := range tabletLines(t, out, tablet) {
		switch {
		case l.Op == source.ResyncBegin:
			n = 0
		case l.Op == source.Read && n >= 0:
			n++
		}
	}
	return max(n, 0)
}

// hasOp reports whether the tablet's file holds a record of op.
func hasOp(t *testing.T, out, tablet string, op source.Op) bool {
	for _, l := range tabletLines(t, out, tablet) {
		if l.Op == op {
			return true
		}
	}
	return false
}

// watchNewest samples how old the newest record of a JSONL file is, every
// 200 ms, until the returned function is called, which returns the most
// it was.
func watchNewest(t *testing.T, path string) func() time.Duration {
	var mu sync.Mutex
	var worst time.Duration
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				newest, ok := newestCommit(path)
				if !ok {
					continue
				}
				mu.Lock()
				worst = max(worst, now.Sub(newest))
				mu.Unlock()
			}
		}
	}()
	return func() time.Duration {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return worst
	}
}

// newestCommit is the commit time of a JSONL file's last whole line.
func newestCommit(path string) (time.Time, bool) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return time.Time{}, false
	}
	const tail = 8 << 10
	off := max(0, st.Size()-tail)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return time.Time{}, false
	}
	lines := bytes.Split(bytes.TrimRight(buf, "\n"), []byte("\n"))
	var l jsonl.Line
	if len(lines) == 0 || json.Unmarshal(lines[len(lines)-1], &l) != nil {
		return time.Time{}, false
	}
	return l.CommitTime, true
}

// The JSONL sink's files of shard s1 are restored from an old backup
// while the worker is down: s1 is Failed (SINK_BEHIND), s2 streams on.
// A resync of s1 makes it exact again: replaying its file, the records
// the backup held and then, from resync-begin on, the copy and the
// changes, gives the shard's tables; positions increase across it.
func TestPostgresResyncRecoversASinkRestoredFromAnOldBackup(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 2, Standbys: 1})
	worker := p.startWorker()
	out := filepath.Join(p.dir, "out")
	const stream = "pgbehind"
	// Short runs: the tablet's checkpoint in its workflow moves past the
	// backup soon.
	p.startStream(stream, p.config(out, map[string]any{"batch": map[string]any{"maxRecords": 100}, "run": map[string]any{"duration": "3s"}}))
	p.waitStatus(stream, "both shards streaming", 2*time.Minute, allStreaming(2))
	load := p.bed.StartWorkload(pgbed.WorkloadOptions{Rate: 40, Seed: 23, KeepGoing: true})
	s1Records := func() int { return len(tabletLines(t, out, "s1")) }
	p.eventually("s1's records reach the sink", time.Minute, func() (bool, string) {
		return s1Records() >= 100, fmt.Sprintf("%d records", s1Records())
	})
	backup := t.TempDir()
	// The manifest before the data, as a backup must take them: the data
	// then holds at least what the manifest says is committed.
	for _, name := range []string{"s1.manifest.json", "s1.jsonl"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(backup, name), b, 0o644))
	}
	atBackup := s1Records()
	p.waitStatus(stream, "s1's workflow past the backup", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		n := tabletStatus(st, "s1").Records
		return n >= int64(atBackup)+100, fmt.Sprintf("%d records, %d in the backup", n, atBackup)
	})
	worker.Kill()
	for _, name := range []string{"s1.manifest.json", "s1.jsonl"} {
		b, err := os.ReadFile(filepath.Join(backup, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(out, name), b, 0o644))
	}
	p.startWorker()
	st := p.waitStatus(stream, "s1 Failed behind its checkpoint, s2 streaming", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return tabletStatus(st, "s1").State == workflows.Failed && tabletStatus(st, "s2").State == workflows.Streaming, summary(st)
	})
	require.Contains(t, tabletStatus(st, "s1").Reason, "behind")

	p.signal(stream, workflows.CmdResync, `{"tablets": ["s1"], "reason": "e2e: sink restored from a backup"}`)
	p.eventually("the resync's copy is complete", 3*time.Minute, func() (bool, string) {
		return hasOp(t, out, "s1", source.ResyncEnd), fmt.Sprintf("%d rows copied", readsAfterBegin(t, out, "s1"))
	})
	require.NoError(t, load.Stop())
	st = p.waitStatus(stream, "both shards streaming", time.Minute, allStreaming(2))
	require.Equal(t, 1, tabletStatus(st, "s1").Resyncs)
	p.requireShardsExact(out, 3*time.Minute)
}
