package gomaxprocs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPolicy(t *testing.T) {
	for _, c := range []struct {
		name             string
		cur, quiet       int
		load             float64
		procs, quietNext int
	}{
		{"busy puts every P back", 1, 5, BusyLoad, 4, 0},
		{"busy on every P stays", 4, 0, 1.7, 4, 0},
		{"one quiet interval is not enough", 4, 0, 0.01, 4, 1},
		{"two quiet intervals in a row: one P", 4, 1, QuietLoad - 0.001, 1, 2},
		{"quiet on one P stays", 1, 7, 0, 1, 8},
		{"between the bounds keeps the Ps", 4, 1, 0.3, 4, 0},
		{"between the bounds on one P stays", 1, 3, 0.3, 1, 0},
		{"between the bounds breaks a quiet spell", 4, 1, QuietLoad, 4, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			procs, quiet := next(c.cur, 4, c.load, c.quiet)
			require.Equal(t, c.procs, procs, "procs")
			require.Equal(t, c.quietNext, quiet, "quiet intervals")
		})
	}
}

// fakeRuntime is a governor's set and cpu under the test's control.
type fakeRuntime struct {
	mu      sync.Mutex
	procs   int
	sets    int
	looks   int
	cpu     time.Duration
	perLook time.Duration // added to cpu at every look
}

func newGoverned(max int) (*Governor, *fakeRuntime) {
	f := &fakeRuntime{procs: max}
	g := &Governor{max: max, interval: 20 * time.Millisecond,
		set: func(n int) int {
			f.mu.Lock()
			defer f.mu.Unlock()
			old := f.procs
			f.procs, f.sets = n, f.sets+1
			return old
		},
		cpu: func() time.Duration {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.cpu += f.perLook
			f.looks++
			return f.cpu
		}}
	g.cur.Store(int32(max))
	return g, f
}

func (f *fakeRuntime) get() (procs, sets int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs, f.sets
}

func (f *fakeRuntime) looked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.looks
}

func (f *fakeRuntime) use(perLook time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.perLook = perLook
}

// A quiet process goes to one P; Busy puts it back on every P at once;
// a busy process stays there; when Run ends, every P is back.
func TestGovernorFollowsTheLoad(t *testing.T) {
	g, f := newGoverned(4)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { g.Run(ctx); close(ran) }()

	require.Eventually(t, func() bool { p, _ := f.get(); return p == 1 }, 5*time.Second, time.Millisecond,
		"a process using no CPU goes to one P")
	require.Equal(t, 1, g.Procs())
	g.Busy()
	p, _ := f.get()
	require.Equal(t, 4, p, "Busy puts every P back at once")
	require.Equal(t, 4, g.Procs())

	// Far more than BusyLoad cores over any interval: it stays on every P.
	f.use(time.Hour)
	_, sets := f.get()
	looks := f.looked()
	require.Eventually(t, func() bool { return f.looked() >= looks+5 }, 5*time.Second, time.Millisecond)
	p, after := f.get()
	require.Equal(t, 4, p)
	require.Equal(t, sets, after, "a busy process is not moved")

	f.use(0)
	require.Eventually(t, func() bool { p, _ := f.get(); return p == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	<-ran
	p, _ = f.get()
	require.Equal(t, 4, p, "every P is back when Run ends")
}

func TestBusyOnANilGovernorOrOnEveryPDoesNothing(t *testing.T) {
	var nilGov *Governor
	nilGov.Busy()
	g, f := newGoverned(2)
	g.Busy()
	_, sets := f.get()
	require.Zero(t, sets)
}

func TestUntilMultiple(t *testing.T) {
	step := 1500 * time.Millisecond
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	require.Equal(t, 1000*time.Millisecond, untilMultiple(at(3000+500), step))
	require.Equal(t, step, untilMultiple(at(3000), step), "on a multiple: the next one")
	require.Equal(t, step+100*time.Millisecond, untilMultiple(at(3000+1400), step),
		"closer than a tenth of the step: the one after")
}
