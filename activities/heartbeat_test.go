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

// timedRecordings is when a heartbeater recorded.
type timedRecordings struct {
	mu sync.Mutex
	at []time.Time
}

func (r *timedRecordings) record(Heartbeat) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at = append(r.at, time.Now())
}

func (r *timedRecordings) list() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.at...)
}

// With a steady heartbeat a commit waits for the next recording, which
// carries the latest commit; a failure is recorded at once, always.
func TestCommitsWaitForTheSteadyHeartbeat(t *testing.T) {
	var r recordings
	every := 200 * time.Millisecond
	h := startHeartbeats(r.record, Heartbeat{}, every)
	defer h.stop()
	h.committed(Heartbeat{Batches: 1})
	h.committed(Heartbeat{Batches: 2})
	h.committed(Heartbeat{Batches: 3})
	h.set(Heartbeat{Batches: 4})
	got := r.list()
	require.NotEmpty(t, got, "set records at once")
	require.Equal(t, int64(4), got[len(got)-1], "set records at once")
	require.NotContains(t, got, int64(1), "a commit is not recorded at once")
	require.NotContains(t, got, int64(2), "a commit is not recorded at once")
	h.committed(Heartbeat{Batches: 5})
	require.Eventually(t, func() bool { l := r.list(); return l[len(l)-1] == 5 }, 5*every, 10*time.Millisecond,
		"the steady heartbeat records the latest commit")
}

// The steady heartbeats of tablets started at different times come at the
// same instants, multiples of half the interval on the clock (onGrid), and
// never more than an interval apart.
func TestSteadyHeartbeatsOfTabletsComeTogether(t *testing.T) {
	const every = 800 * time.Millisecond
	var a, b timedRecordings
	ha := startHeartbeats(a.record, Heartbeat{}, every)
	defer ha.stop()
	time.Sleep(every / 4) // the second starts half a grid step later: with plain tickers one would be off the grid
	hb := startHeartbeats(b.record, Heartbeat{}, every)
	defer hb.stop()
	require.Eventually(t, func() bool { return len(a.list()) >= 4 && len(b.list()) >= 4 }, 20*every, 10*time.Millisecond)
	const slack = 150 * time.Millisecond // a timer may fire late on a busy machine
	for name, at := range map[string][]time.Time{"first": a.list(), "second": b.list()} {
		for i, t0 := range at {
			off := time.Duration(t0.UnixNano() % int64(every/2))
			require.Less(t, off, slack, "%s tablet's recording %d is %v past a multiple of half the interval", name, i, off)
			if i > 0 {
				require.LessOrEqual(t, t0.Sub(at[i-1]), every+slack, "%s tablet: recordings %d and %d too far apart", name, i-1, i)
			}
		}
	}
}

// onGrid waits between half a period and a whole one, to a multiple of
// half the period on the clock.
func TestOnGridEndsOnAMultipleOfHalfThePeriod(t *testing.T) {
	const period = time.Second
	grid := time.Unix(1_800_000_000, 0) // a multiple of the period
	for _, c := range []struct {
		after, want time.Duration
	}{
		{0, period}, // in step: one period
		{10 * time.Millisecond, 990 * time.Millisecond},
		{499 * time.Millisecond, 501 * time.Millisecond}, // never less than half
		{500 * time.Millisecond, period},
		{750 * time.Millisecond, 750 * time.Millisecond},
	} {
		got := onGrid(grid.Add(c.after), period)
		require.Equal(t, c.want, got, "%v after a multiple", c.after)
		require.Zero(t, grid.Add(c.after+got).UnixNano()%int64(period/2), "lands on a multiple of half the period")
	}
	require.Equal(t, time.Duration(1), onGrid(grid, 1), "a period too short to halve is waited whole")
	require.Equal(t, 750*time.Millisecond, onGrid(time.Unix(-1, 750_000_000), period), "a clock before 1970: the same grid")
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
