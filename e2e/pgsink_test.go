package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/tabletd/digest"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// The PostgreSQL sink in changelog mode, from tabletd, with two workers on
// the task queue and one of them killed (kill -9) three times at random
// moments: after the drain, the change table holds exactly tabletd's
// digest of the stream (count and hash), each (tablet, position) once.
func TestTabletdIntoPostgresChangelogIsExactAcrossWorkerKills(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	e := newEnv(t, "--tablets", "6", "--rate", "300")
	t.Setenv("TF_E2E_SINK_DSN", db.DSN())
	victim := e.startWorker()
	e.startWorker()
	const stream = "pgsink"
	e.startStream(stream, e.config("", map[string]any{"sink": map[string]any{"kind": "postgres", "dsnEnv": "TF_E2E_SINK_DSN"}}))
	e.waitStatus(stream, "every tablet streaming", 2*time.Minute, allStreaming(6))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := db.Connect(ctx)
	require.NoError(t, err)
	defer conn.Close(ctx)
	stored := func() digest.Digest {
		d, err := pgsink.Digest(ctx, conn, "tabletflow", stream)
		require.NoError(t, err)
		return d
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
	st, err := e.status(stream)
	require.NoError(t, err)
	ok, why := inState(6, workflows.Streaming)(st)
	require.True(t, ok, why)
}
