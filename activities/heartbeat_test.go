package activities

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recordings is what a heartbeater recorded, in order.
type recordings struct {
	mu  sync.Mutex
	got []int64
}

func (r *recordings) record(hb Heartbeat) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, hb.Batches)
}

func (r *recordings) list() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.got...)
}

// A commit is recorded at once unless one was recorded less than
// recordGap ago; then the steady heartbeat carries it. A failure is
// recorded at once, always.
func TestCommitsAreRecordedAtMostOncePerRecordGap(t *testing.T) {
	var r recordings
	every := 2 * recordGap
	h := startHeartbeats(r.record, Heartbeat{}, every)
	defer h.stop()
	h.committed(Heartbeat{Batches: 1})
	h.committed(Heartbeat{Batches: 2})
	h.committed(Heartbeat{Batches: 3})
	require.Equal(t, []int64{1}, r.list(), "commits within recordGap of a recording wait")
	require.Eventually(t, func() bool { return len(r.list()) == 2 }, every+time.Second, 10*time.Millisecond)
	require.Equal(t, []int64{1, 3}, r.list(), "the steady heartbeat records the latest commit")
	h.set(Heartbeat{Batches: 4})
	require.Equal(t, []int64{1, 3, 4}, r.list(), "set records at once")
}

// Without a heartbeat timeout there is no steady heartbeat: every commit
// is recorded.
func TestWithoutSteadyHeartbeatsEveryCommitIsRecorded(t *testing.T) {
	var r recordings
	h := startHeartbeats(r.record, Heartbeat{}, 0)
	defer h.stop()
	h.committed(Heartbeat{Batches: 1})
	h.committed(Heartbeat{Batches: 2})
	require.Equal(t, []int64{1, 2}, r.list())
}
