package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// recordShard is the shard of shards a record's row lives in, by its
// customer_id (both tables are placed by it), before the change for a
// delete.
func recordShard(r source.Record, shards []string) (string, error) {
	img := r.After
	if img == nil {
		img = r.Before
	}
	row, err := vitessbed.DecodeRow(img)
	if err != nil {
		return "", err
	}
	id, ok := row["customer_id"].(int64)
	if !ok {
		return "", fmt.Errorf("%s %s: no customer_id in %v", r.Position, r.Table, row)
	}
	return vitessbed.ShardAmong(id, shards), nil
}

// A real Reshard of -80 into -40 and 40-80 under a write workload, the
// worker down across the switch: -80's vttablet sends the journal, the
// tablet ends Split, and its two children stream from where the journal
// says, which is before the writes made while the worker was down. Each
// new shard's rows are the replay of -80's records of its key range,
// then of its own records; 80- streams on unaffected.
func TestVitessReshardSplitsTheShardIntoItsNewShardsWithNothingMissed(t *testing.T) {
	v := newVTEnv(t)
	worker := v.startWorker()
	out := filepath.Join(v.dir, "out")
	const stream = "vtreshard"
	v.startStream(stream, v.config(out, map[string]any{"topologyRefresh": "2s"}))
	v.waitStatus(stream, "both shards streaming", 2*time.Minute, allStreaming(len(vitessbed.Shards)))
	v.waitStarted(out)
	load := v.bed.StartWorkload(vitessbed.WorkloadOptions{Rate: 30, Seed: 11, KeepGoing: true})
	defer func() { _ = load.Stop() }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	children := []string{"-40", "40-80"}
	r, err := v.bed.Reshard(ctx, "-80", children)
	require.NoError(t, err)
	st, err := v.status(stream)
	require.NoError(t, err)
	for _, c := range children {
		require.Empty(t, tabletStatus(st, c).ID, "%s is not started before the switch (its parent -80 streams)", c)
	}
	// The worker is down across the switch and while the new shards take
	// writes: they must start from the journal's positions, not from
	// wherever they are when the stream comes back.
	worker.Kill()
	require.NoError(t, r.SwitchTraffic(ctx))
	switched := load.Stats().Txs
	v.eventually("the new shards take writes while the worker is down", time.Minute, func() (bool, string) {
		n := load.Stats().Txs - switched
		return n >= 150, fmt.Sprintf("%d transactions since the switch", n)
	})
	v.startWorker()

	v.waitStatus(stream, "-80 split into its new shards, which stream", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
		p := tabletStatus(st, "-80")
		if p.State != workflows.Split {
			return false, fmt.Sprintf("-80: %+v", p)
		}
		if !reflect.DeepEqual(p.Children, children) {
			return false, fmt.Sprintf("-80's children %v", p.Children)
		}
		for _, c := range children {
			if s := tabletStatus(st, c); s.State != workflows.Streaming {
				return false, fmt.Sprintf("%s: %+v", c, s)
			}
		}
		return true, ""
	})
	// Changes after the switch reach the new shards' files.
	v.eventually("the new shards deliver changes", 2*time.Minute, func() (bool, string) {
		for _, c := range children {
			if sinkRecordsOf(out, c) < 20 {
				return false, fmt.Sprintf("%s: %d records", c, sinkRecordsOf(out, c))
			}
		}
		return true, ""
	})
	require.NoError(t, load.Stop())
	v.requireShardsExact(out, 2*time.Minute, "80-")

	v.eventually("replaying -80's records of each new shard, then its own, gives its rows", 2*time.Minute, func() (bool, string) {
		all, err := sinkRecordsByTablet(out)
		if err != nil {
			return false, err.Error()
		}
		for _, c := range children {
			var recs []source.Record
			for _, rec := range all["-80"] {
				s, err := recordShard(rec, children)
				if err != nil {
					return false, err.Error()
				}
				if s == c {
					recs = append(recs, rec)
				}
			}
			if ok, why := v.replayIsShard(ctx, c, append(recs, all[c]...)); !ok {
				return false, why
			}
		}
		return true, ""
	})
	require.Positive(t, sinkRecordsOf(out, "-80"), "-80 delivered records before the switch")
	t.Logf("workload %+v; records: -80 %d, -40 %d, 40-80 %d, 80- %d", load.Stats(),
		sinkRecordsOf(out, "-80"), sinkRecordsOf(out, "-40"), sinkRecordsOf(out, "40-80"), sinkRecordsOf(out, "80-"))
}
