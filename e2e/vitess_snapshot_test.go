package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

// bulkLoad writes n customers, each with an order, through vtgate in
// statements of many rows, ids from first.
func bulkLoad(t *testing.T, bed *vitessbed.Cluster, first, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const perStatement = 500
	for lo := first; lo < first+n; lo += perStatement {
		var customers, orders []string
		for id := lo; id < min(lo+perStatement, first+n); id++ {
			customers = append(customers, fmt.Sprintf("(%d, 'bulk%d@example.com')", id, id))
			orders = append(orders, fmt.Sprintf("(%d, %d, 'sku-%d', %d)", id, id, id%97, id%1000))
		}
		_, err := bed.Exec(ctx, "INSERT INTO customer (customer_id, email) VALUES "+strings.Join(customers, ","))
		require.NoError(t, err)
		_, err = bed.Exec(ctx, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES "+strings.Join(orders, ","))
		require.NoError(t, err)
	}
}

// A stream that starts from a snapshot of tables that already hold rows:
// each shard's rows are copied (read records) from a replica, with the
// changes made meanwhile woven in, and the worker is killed while the
// copy is under way. The copy goes on from the last checkpoint, and the
// sink ends holding exactly the source's rows.
func TestVitessSnapshotStartCopiesTheRowsThroughAWorkerKillDuringTheCopy(t *testing.T) {
	v := newVTEnv(t)
	const rows = 20000
	bulkLoad(t, v.bed, 1_000_000, rows)
	load := v.bed.StartWorkload(vitessbed.WorkloadOptions{Rate: 30, Seed: 5, KeepGoing: true})
	defer func() { _ = load.Stop() }()

	worker := v.startWorker()
	out := filepath.Join(v.dir, "out")
	const stream = "vtsnap"
	// Small batches: the copy takes many commits, so that the kill
	// lands inside it.
	v.startStream(stream, v.config(out, map[string]any{"startFrom": "snapshot", "batch": map[string]any{"maxRecords": 100}}))

	// The kill comes as soon as a shard's sink holds a checkpoint taken
	// inside the copy.
	deadline := time.Now().Add(3 * time.Minute)
	var during source.Checkpoint
	for during.IsZero() {
		require.True(t, time.Now().Before(deadline), "no checkpoint inside a copy within 3m")
		for _, shard := range vitessbed.Shards {
			if cp := sinkCheckpoint(out, shard); strings.Contains(cp.Opaque, ";copy=") {
				during = cp
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	worker.Kill()
	atKill := sinkRecords(out)
	t.Logf("worker killed at %d records, a shard at %s", atKill, during)
	v.startWorker()

	// Every shard's copy ends: its checkpoint is a plain GTID position.
	v.eventually("every shard's copy ends", 5*time.Minute, func() (bool, string) {
		for _, shard := range vitessbed.Shards {
			if cp := sinkCheckpoint(out, shard); !strings.HasPrefix(cp.Opaque, "MariaDB/") || strings.Contains(cp.Opaque, ";") {
				return false, fmt.Sprintf("%s at %s", shard, cp)
			}
		}
		return true, ""
	})
	require.NoError(t, load.Stop())
	v.requireShardsExact(out, 3*time.Minute)

	recs, err := sinkRecordsByTablet(out)
	require.NoError(t, err)
	reads := 0
	for _, shard := range vitessbed.Shards {
		n := 0
		for _, r := range recs[shard] {
			if r.Op == source.Read {
				n++
			}
		}
		require.Positive(t, n, "%s: its rows were copied as reads", shard)
		reads += n
	}
	require.GreaterOrEqual(t, reads, 2*rows, "every bulk row of both tables was copied")
	require.Greater(t, sinkRecords(out), atKill, "the stream went on after the kill")
	t.Logf("%d reads, %d records in all; workload %+v", reads, sinkRecords(out), load.Stats())
}
