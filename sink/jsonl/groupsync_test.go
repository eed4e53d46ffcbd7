package jsonl

import (
	"encoding/json"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
)

// fakeGroup is a syncGroup over a temporary directory whose syncfs and
// reading of unwritten bytes the test controls.
type fakeGroup struct {
	*syncGroup
	mu      sync.Mutex
	calls   int
	fail    int           // fail this many calls from now
	release chan struct{} // non-nil: the next call waits for it
	dirty   int64
}

func newFakeGroup(t *testing.T) *fakeGroup {
	dir := t.TempDir()
	d, err := os.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	f := &fakeGroup{}
	f.syncGroup = &syncGroup{dir: d,
		syncfs: func(*os.File) error {
			f.mu.Lock()
			f.calls++
			wait := f.release
			f.release = nil
			failNow := f.fail > 0
			if failNow {
				f.fail--
			}
			f.mu.Unlock()
			if wait != nil {
				<-wait
			}
			if failNow {
				return errors.New("EIO")
			}
			return nil
		},
		unwritten: func() (int64, bool) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.dirty, f.dirty >= 0
		}}
	return f
}

func (f *fakeGroup) syncfsCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// waiting is how many writers wait for the round after the running one.
func (f *fakeGroup) waiting() int64 {
	f.syncGroup.mu.Lock()
	defer f.syncGroup.mu.Unlock()
	if f.next == nil {
		return 0
	}
	return f.next.written
}

func tempFile(t *testing.T) *os.File {
	f, err := os.Create(filepath.Join(t.TempDir(), "data"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// syncAll has each syncer sync a file of its own at once (1 byte written
// each) and returns the errors.
func syncAll(t *testing.T, ss []*syncer) []error {
	errs := make([]error, len(ss))
	var wg sync.WaitGroup
	for i, s := range ss {
		f := tempFile(t)
		wg.Go(func() { errs[i] = s.sync(f, 1) })
	}
	wg.Wait()
	return errs
}

func syncers(g *syncGroup, n int) []*syncer {
	out := make([]*syncer, n)
	for i := range out {
		s := newSyncer(g)
		out[i] = &s
	}
	return out
}

// The writers that ask while a round is under way share the next one: 1
// writer and then 8 more cost 2 syncfs calls and not one fdatasync.
func TestWritersCommittingTogetherShareOneSyncfs(t *testing.T) {
	g := newFakeGroup(t)
	release := make(chan struct{})
	g.release = release
	_, before := Syncs()

	first := syncers(g.syncGroup, 1)
	done := make(chan []error, 1)
	go func() { done <- syncAll(t, first) }()
	require.Eventually(t, func() bool { return g.syncfsCalls() == 1 }, 5*time.Second, time.Millisecond)
	rest := syncers(g.syncGroup, 8)
	restDone := make(chan []error, 1)
	go func() { restDone <- syncAll(t, rest) }()
	require.Eventually(t, func() bool { return g.waiting() == 8 }, 5*time.Second, time.Millisecond,
		"the 8 writers wait for the round after the running one")
	close(release)
	for _, err := range append(<-done, <-restDone...) {
		require.NoError(t, err)
	}
	require.Equal(t, 2, g.syncfsCalls())
	_, after := Syncs()
	require.Equal(t, before, after, "no writer synced its own file")
}

// The first round of a run that starts a burst waits its gather window,
// and the writers that ask meanwhile share it with the first: 4 writers,
// one syncfs. The writers that ask while that round syncs get the next
// round of the same run, which does not wait.
func TestTheFirstRoundOfABurstWaitsForTheWritersThatFollow(t *testing.T) {
	g := newFakeGroup(t)
	g.gather = time.Hour
	gathering, release := make(chan time.Duration, 2), make(chan struct{})
	g.await = func(d time.Duration, _ <-chan struct{}) {
		gathering <- d
		<-release
	}
	syncing := make(chan struct{})
	g.release = syncing
	first := syncers(g.syncGroup, 1)
	done := make(chan []error, 1)
	go func() { done <- syncAll(t, first) }()
	select {
	case d := <-gathering:
		require.Equal(t, time.Hour, d)
	case <-time.After(5 * time.Second):
		t.Fatal("the first round of a burst did not wait its window")
	}
	rest := syncers(g.syncGroup, 3)
	restDone := make(chan []error, 1)
	go func() { restDone <- syncAll(t, rest) }()
	require.Eventually(t, func() bool { return g.waiting() == 4 }, 5*time.Second, time.Millisecond,
		"the 3 writers that ask during the window join the first one's round")
	require.Zero(t, g.syncfsCalls(), "nothing is synced before the window ends")
	close(release)
	require.Eventually(t, func() bool { return g.syncfsCalls() == 1 }, 5*time.Second, time.Millisecond)

	late := syncers(g.syncGroup, 2)
	lateDone := make(chan []error, 1)
	go func() { lateDone <- syncAll(t, late) }()
	require.Eventually(t, func() bool { return g.waiting() == 2 }, 5*time.Second, time.Millisecond,
		"the writers that ask during the syncfs wait for the next round")
	close(syncing)
	for _, err := range append(append(<-done, <-restDone...), <-lateDone...) {
		require.NoError(t, err)
	}
	require.Equal(t, 2, g.syncfsCalls())
	require.Len(t, gathering, 0, "the second round of the run did not wait")
}

// awaits records a group's waits for writers: the first one that expects
// nobody (the whole window) waits for release; any later such wait is only
// counted; a wait that expects writers returns when they have all joined
// (byArrival) or after 5 s.
type awaits struct {
	mu        sync.Mutex
	whole     int // waits that expected nobody
	byArrival int // waits ended by the writers expected
	expecting int // waits that expected writers
	started   chan struct{}
}

func (a *awaits) hook(release <-chan struct{}) func(time.Duration, <-chan struct{}) {
	a.started = make(chan struct{}, 16)
	return func(_ time.Duration, arrived <-chan struct{}) {
		a.mu.Lock()
		first := arrived == nil && a.whole == 0
		if arrived == nil {
			a.whole++
		} else {
			a.expecting++
		}
		a.mu.Unlock()
		a.started <- struct{}{}
		switch {
		case first:
			<-release
		case arrived != nil:
			select {
			case <-arrived:
				a.mu.Lock()
				a.byArrival++
				a.mu.Unlock()
			case <-time.After(5 * time.Second):
			}
		}
	}
}

func (a *awaits) counts() (whole, expecting, byArrival int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.whole, a.expecting, a.byArrival
}

// A commit syncs its data, then its manifest slot. The round after the
// data's waits for the same writers' slots and syncs once they have all
// asked, in the same run: not a new run waiting its whole window (which
// woke a live worker once more per linger). 3 writers, 2 syncfs calls.
func TestTheRoundAfterACommitsDataWaitsForItsSlots(t *testing.T) {
	g := newFakeGroup(t)
	g.gather = time.Hour
	release := make(chan struct{})
	var a awaits
	g.await = a.hook(release)
	ss := syncers(g.syncGroup, 3)
	errs := make(chan error, 2*len(ss))
	for _, s := range ss {
		f := tempFile(t)
		go func() {
			errs <- s.syncThen(f, 1)
			errs <- s.sync(f, 1)
		}()
	}
	<-a.started
	require.Eventually(t, func() bool { return g.waiting() == 3 }, 5*time.Second, time.Millisecond)
	close(release)
	for range 2 * len(ss) {
		require.NoError(t, <-errs)
	}
	require.Equal(t, 2, g.syncfsCalls(), "one round for the data, one for the slots")
	whole, expecting, byArrival := a.counts()
	require.Equal(t, 1, whole, "only the burst's first round waited its whole window")
	require.Equal(t, expecting, byArrival, "a round waiting for the slots synced once they had all asked")
}

// Runs that start within burstSpan of a burst's start wait; a run later
// in a burst that goes on (a bulk drain: runs less than idleGap apart)
// does not; after idleGap without a run a new burst starts, and waits.
func TestOnlyRunsEarlyInABurstWait(t *testing.T) {
	g := newFakeGroup(t)
	g.gather = time.Millisecond
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	g.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = time.Unix(1000, 0).Add(d) }
	waits := 0
	g.await = func(time.Duration, <-chan struct{}) { waits++ }
	s := syncers(g.syncGroup, 1)[0]
	for _, step := range []struct {
		at   time.Duration
		wait bool
		why  string
	}{
		{0, true, "the first run starts a burst"},
		{burstSpan / 2, true, "early in the burst"},
		{burstSpan/2 + idleGap*9/10, false, "later in a burst that goes on"},
		{burstSpan/2 + idleGap*18/10, false, "still later in it"},
		{burstSpan/2 + idleGap*29/10, true, "after idleGap without a run: a new burst"},
	} {
		set(step.at)
		before := waits
		require.NoError(t, s.sync(tempFile(t), 1))
		require.Equal(t, step.wait, waits > before, "at %v: %s", step.at, step.why)
	}
}

// A failed syncfs does not say whose write failed: every writer of that
// round syncs its own file (which reports its own failure), and so does,
// at its next round, a writer that was not in it; after that, rounds are
// shared again.
func TestAFailedSyncfsMakesEveryWriterLookAtItsOwnFile(t *testing.T) {
	g := newFakeGroup(t)
	absent := syncers(g.syncGroup, 1)[0]
	in := syncers(g.syncGroup, 3)
	g.fail = 1
	_, before := Syncs()
	for _, err := range syncAll(t, in) {
		require.NoError(t, err, "each file's own fdatasync succeeds")
	}
	_, after := Syncs()
	require.Equal(t, uint64(3), after-before, "each writer of the failed round synced its file")

	require.NoError(t, syncAll(t, []*syncer{absent})[0])
	_, again := Syncs()
	require.Equal(t, uint64(1), again-after, "the writer absent from the failed round synced its file at its next")

	for _, err := range syncAll(t, append(in, absent)) {
		require.NoError(t, err)
	}
	_, last := Syncs()
	require.Equal(t, again, last, "everyone has looked since the failure: rounds are shared again")
}

// A round never flushes much of other programs' data, nor runs when the
// system's unwritten bytes cannot be read: its writers sync their own
// files.
func TestMuchOtherUnwrittenDataSyncsFileByFile(t *testing.T) {
	for name, dirty := range map[string]int64{"much": maxOtherDirty + 1<<20, "unknown": -1} {
		t.Run(name, func(t *testing.T) {
			g := newFakeGroup(t)
			g.dirty = dirty
			_, before := Syncs()
			for _, err := range syncAll(t, syncers(g.syncGroup, 4)) {
				require.NoError(t, err)
			}
			_, after := Syncs()
			require.Zero(t, g.syncfsCalls())
			require.Equal(t, uint64(4), after-before)
		})
	}
	g := newFakeGroup(t)
	g.dirty = maxOtherDirty
	require.NoError(t, syncAll(t, syncers(g.syncGroup, 1))[0])
	require.Equal(t, 1, g.syncfsCalls(), "up to maxOtherDirty, the round uses syncfs")
}

// The group sync is trusted from Linux 5.8, where syncfs reports failed
// writes.
func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.18.44-fc-v1045": true, "5.8.0": true, "5.10": true, "5.7.19-amd64": false,
		"4.19.0-18-amd64": false, "6": true, "5": false, "": false, "x.y": false,
	} {
		require.Equal(t, want, kernelAtLeast(release, 5, 8), release)
	}
}

func TestUnwrittenInReadsDirtyAndWriteback(t *testing.T) {
	meminfo := "MemTotal:       24589412 kB\nDirty:              1024 kB\nWriteback:            16 kB\nAnonPages:  1 kB\n"
	n, ok := unwrittenIn([]byte(meminfo))
	require.True(t, ok)
	require.Equal(t, int64(1040<<10), n)
	for _, bad := range []string{"Dirty: 1 kB\n", "Dirty: x kB\nWriteback: 0 kB\n", "Dirty: 1 MB\nWriteback: 0 kB\n", ""} {
		_, ok := unwrittenIn([]byte(bad))
		require.False(t, ok, bad)
	}
}

// encodeSlot builds the slot by hand; its bytes are json.Marshal's.
func TestEncodeSlotIsJSONMarshalsBytes(t *testing.T) {
	for _, m := range []manifest{
		{Seq: 1, Stream: "orders", Tablet: "t-1", Updated: time.Unix(1, 5).UTC()},
		{Seq: 1<<64 - 1, Stream: `a<b>&"c"`, Tablet: "t\u2028é", Checkpoint: source.Checkpoint{Term: 7, Index: 42}, Offset: 1 << 40,
			Updated: time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)},
	} {
		got, err := encodeSlot(m)
		require.NoError(t, err)
		inner, err := json.Marshal(m)
		require.NoError(t, err)
		want, err := json.Marshal(slot{CRC32C: crc32.Checksum(inner, castagnoli), Manifest: inner})
		require.NoError(t, err)
		require.Len(t, got, slotSize)
		require.Equal(t, string(want), string(got[:len(want)]))
		back, ok := decodeSlot(got)
		require.True(t, ok)
		require.Equal(t, m, back)
	}
}

// A Sink's writers make their commits durable through their filesystem's
// group: each commit with records waits for two rounds (the data, then
// the manifest slot), and no file is synced on its own. Without a group,
// each commit syncs its two files.
func TestSinkCommitsGoThroughTheGroupSync(t *testing.T) {
	for _, grouped := range []bool{true, false} {
		t.Run(map[bool]string{true: "grouped", false: "file by file"}[grouped], func(t *testing.T) {
			dir := t.TempDir()
			s := newSink(t, dir)
			g := newFakeGroup(t)
			s.group = nil
			if grouped {
				s.group = g.syncGroup
			}
			_, before := Syncs()
			for _, tablet := range []string{"t-0001", "t-0002"} {
				w, err := s.Open(ctx, tablet)
				require.NoError(t, err)
				require.NoError(t, w.Write(ctx, sinktest.Records(tablet, 1, 3)))
				require.NoError(t, w.Commit(ctx, source.Checkpoint{Term: 1, Index: 3}))
			}
			_, after := Syncs()
			if grouped {
				require.Equal(t, 4, g.syncfsCalls(), "two rounds per commit")
				require.Equal(t, before, after, "no file synced on its own")
			} else {
				require.Zero(t, g.syncfsCalls())
				require.Equal(t, uint64(4), after-before, "two fdatasyncs per commit")
			}
			got := readRecords(t, dir)
			require.Len(t, got["t-0001"], 3)
			require.Len(t, got["t-0002"], 3)
		})
	}
}

// TestUnwrittenReadsTheSystemAgain: the system's reading comes from
// /proc/meminfo, kept open, and follows it: a second reading sees data
// written since the first (unless the system wrote it back meanwhile, so
// the test retries).
func TestUnwrittenReadsTheSystemAgain(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skip("no /proc/meminfo")
	}
	if _, ok := unwritten(); !ok {
		t.Fatal("unwritten: cannot tell")
	}
	dir := t.TempDir()
	const size = 64 << 20
	for try := 0; try < 5; try++ {
		before, _ := unwritten()
		if err := os.WriteFile(filepath.Join(dir, "dirty"), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
		after, ok := unwritten()
		if !ok {
			t.Fatal("unwritten: cannot tell after a write")
		}
		if after-before >= size/2 {
			return
		}
	}
	t.Fatal("five readings after writing 64 MiB each saw no more unwritten bytes than before")
}
