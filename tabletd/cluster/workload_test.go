package cluster_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

// A workload whose rate is far above what tabletd writes falls behind and
// catches up in steps of hundreds of thousands of records; a pause must cut
// the step it lands in: once PAUSE has answered, the count stays where it
// said. (Preloads ask for the highest rate and pause at their target.)
func TestPauseCutsAWorkloadStepThatFellBehind(t *testing.T) {
	tc := start(t, nil)
	workload := func(action sourcepb.WorkloadRequest_Action, rate float64) *sourcepb.WorkloadResponse {
		t.Helper()
		w, err := tc.admin.Workload(ctx(t), &sourcepb.WorkloadRequest{Action: action, Rate: rate})
		require.NoError(t, err)
		return w
	}
	workload(sourcepb.WorkloadRequest_RATE, 10_000_000)
	workload(sourcepb.WorkloadRequest_RESUME, 0)
	require.Eventually(t, func() bool { return workload(sourcepb.WorkloadRequest_STATUS, 0).Records >= 20_000 },
		30*time.Second, 5*time.Millisecond)
	paused := workload(sourcepb.WorkloadRequest_PAUSE, 0)
	require.Equal(t, "paused", paused.State)
	// Nothing can be awaited for "no more records": look for 300 ms, many
	// of the loop's 10 ms ticks and far less than the step it was in.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		require.Equal(t, paused.Records, workload(sourcepb.WorkloadRequest_STATUS, 0).Records, "records written after PAUSE answered")
		time.Sleep(10 * time.Millisecond)
	}
}
