package jsonl

import (
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// The group sync. A commit makes its bytes durable twice (the data, then
// the manifest slot), and a live stream's tablets commit together: the
// group commit's linger puts their reads on one clock. Synced file by
// file, 16 tablets cost 32 fdatasync(2)s per linger, each with its own
// cache flush, and that was a third of a live worker's CPU. The tablets
// of one filesystem therefore share a syncGroup, and a commit waits for
// one round of it instead: the first writer to ask starts a round of one
// syncfs(2), which makes everything written on the filesystem durable,
// and the writers that ask while a round is under way share the next one.
//
// Live, the tablets commit in bursts, once a linger: their reads of one
// linger are answered one after another over some milliseconds, so their
// commits reach the group spread over that time. A run of rounds (rounds
// follow one another while writers wait; a run starts when a writer asks
// and none is under way) that starts within burstSpan of the start of a
// burst (the first run after idleGap without one) waits gatherFor before
// its first round syncs, for the commits that follow. Without the wait,
// 16 live tablets at 2,000 records/s cost about 20 syncfs rounds a
// second, each a blocking system call and a thread's sleep and wake
// (tens of microseconds of CPU on a virtual machine), with it about 3. A
// bulk drain is one long burst whose runs, after its first burstSpan,
// never wait: there a commit's sync is what a tablet waits for between
// batches (a wait at every run slowed a bulk drain; make bench's bulk
// case measures it, docs/benchmarks.md).
//
// A round whose writers sync again right away (a commit's data, then its
// manifest slot: syncThen) is followed, early in a burst, by one that
// waits for those writers rather than the whole gatherFor: it syncs as
// soon as they have all asked (gatherFor at the latest), in the same run.
// Before, their slots started a run of their own, which waited the whole
// window, and a linger's commits woke an idle worker three times (the
// reads, then the end of each window) instead of twice; a wake from idle
// costs a virtual machine's worker far more CPU than the few system calls
// it makes.
//
// syncfs flushes what other processes wrote on the filesystem too. A
// round uses it only when the system holds little other unwritten data
// (maxOtherDirty, from /proc/meminfo), so that a commit never waits for
// another program's gigabytes; otherwise, and wherever syncfs cannot be
// trusted to report a failed write (before Linux 5.8, or another OS),
// every writer of the round syncs its own file, as before.
//
// syncfs reports a failed write anywhere on the filesystem, once, and not
// whose it was. A round whose syncfs fails has each of its writers sync
// its own file, which reports that file's failure if it was one of them,
// and counts a failure in the group: every writer that has not looked
// since then syncs its own file at its next round too (a write of it may
// have failed before it asked). A writer is fine when one such
// fdatasync succeeds.
type syncGroup struct {
	dir *os.File // an open directory of the filesystem: syncfs's handle

	// syncfs and unwritten are the system's (tests replace them).
	syncfs    func(dir *os.File) error
	unwritten func() (int64, bool) // bytes the system holds unwritten; false: cannot tell

	// The last reading of unwritten, kept for unwrittenFor (run's alone).
	dirty   int64
	dirtyOK bool
	dirtyAt time.Time

	// gather is how long a round early in a burst waits at most before it
	// syncs (gatherFor), await how it waits (until arrived is closed or d
	// has passed; tests replace it) and now the clock (time.Now when nil).
	gather time.Duration
	await  func(d time.Duration, arrived <-chan struct{})
	now    func() time.Time

	mu       sync.Mutex
	running  bool
	next     *syncRound // the round the next caller joins
	failures uint64     // rounds whose syncfs failed
	burst    time.Time  // when the current burst began
	lastEnd  time.Time  // when the last run ended
	// want and arrived: while a round waits for writers, it is closed
	// (and nil) once want writers have joined the next round.
	want    int
	arrived chan struct{}
}

// syncRound is one round: the writers that asked before it began.
type syncRound struct {
	done      chan struct{}
	written   int64 // bytes its writers wrote since they last synced
	joined    int   // writers that joined it
	followers int   // of them, those that sync again right after (syncThen)
	perFile   bool  // it did not use syncfs, or syncfs failed: each writer syncs its own file
}

// maxOtherDirty is how many unwritten bytes beyond the round's own the
// system may hold for a round to use syncfs. Written back at a hundred
// megabytes a second, it is a twelfth of a second.
const maxOtherDirty = 8 << 20

// gatherFor, idleGap and burstSpan: see the bursts above. 20 ms covers
// most of a linger's commits of 16 tablets on 2 cores; it adds at most
// that to a commit's lag (the group commit's linger is 750 ms by
// default, so a live group is idle most of each).
const (
	gatherFor = 20 * time.Millisecond
	idleGap   = 100 * time.Millisecond
	burstSpan = 100 * time.Millisecond
)

// Calls made to make commits durable, for the worker's metrics.
var (
	syncfsCalls    atomic.Uint64
	datasyncCalls  atomic.Uint64
	groups         = map[uint64]*syncGroup{}
	groupsMu       sync.Mutex
	groupSyncAvail = groupSyncSupported()
)

// Syncs returns how many syncfs(2) and fdatasync(2) calls the sink has
// made for commits in this process.
func Syncs() (syncfs, datasync uint64) {
	return syncfsCalls.Load(), datasyncCalls.Load()
}

// groupFor returns the sync group of dir's filesystem, made at its first
// use and kept for the life of the process (one open directory per
// filesystem), or nil where syncs go file by file.
func groupFor(dir string) *syncGroup {
	if !groupSyncAvail {
		return nil
	}
	dev, ok := deviceOf(dir)
	if !ok {
		return nil
	}
	groupsMu.Lock()
	defer groupsMu.Unlock()
	if g := groups[dev]; g != nil {
		return g
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	g := &syncGroup{dir: d, syncfs: syncFilesystem, unwritten: unwritten, gather: gatherFor}
	groups[dev] = g
	return g
}

// syncer is one writer's way to make its writes durable.
type syncer struct {
	g    *syncGroup // nil: file by file
	seen uint64     // the group's failures when this writer last synced a file of its own
}

func newSyncer(g *syncGroup) syncer {
	s := syncer{g: g}
	if g != nil {
		g.mu.Lock()
		s.seen = g.failures
		g.mu.Unlock()
	}
	return s
}

// sync makes what this writer wrote to f (written bytes since its last
// sync) durable.
func (s *syncer) sync(f *os.File, written int64) error { return s.syncing(f, written, false) }

// syncThen is sync for a writer that syncs again right after (a commit's
// data, before its manifest slot): the group's next round waits for it.
func (s *syncer) syncThen(f *os.File, written int64) error { return s.syncing(f, written, true) }

func (s *syncer) syncing(f *os.File, written int64, then bool) error {
	if s.g == nil {
		return countedDatasync(f)
	}
	r, failures := s.g.wait(written, then)
	if !r.perFile && failures == s.seen {
		return nil
	}
	if err := countedDatasync(f); err != nil {
		return err
	}
	s.seen = failures
	return nil
}

// wait joins the next round, starting it if none is under way, and
// returns it once it is done, with the group's failures then. then: the
// writer syncs again right after this round.
func (g *syncGroup) wait(written int64, then bool) (*syncRound, uint64) {
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &syncRound{done: make(chan struct{})}
		g.next = r
	}
	r.written += written
	r.joined++
	if then {
		r.followers++
	}
	if g.arrived != nil && r.joined >= g.want {
		close(g.arrived)
		g.arrived = nil
	}
	if !g.running {
		g.running = true
		go g.run()
	}
	g.mu.Unlock()
	<-r.done
	g.mu.Lock()
	defer g.mu.Unlock()
	return r, g.failures
}

// run runs rounds until no writer waits. Early in a burst its first
// round waits the whole of g.gather, and a round after one with followers
// for them.
func (g *syncGroup) run() {
	early := g.gatherNow()
	want := 0 // writers to wait for; 0: the whole window
	for {
		if early {
			g.gatherUntil(want)
		}
		g.mu.Lock()
		r := g.next
		if r == nil {
			g.running, g.lastEnd = false, g.clock()
			g.mu.Unlock()
			return
		}
		g.next = nil // who asks from now on waits for the next round
		g.mu.Unlock()

		failed := false
		if dirty, ok := g.unwrittenNow(); !ok || dirty-r.written > maxOtherDirty {
			r.perFile = true
		} else {
			syncfsCalls.Add(1)
			if g.syncfs(g.dir) != nil {
				r.perFile, failed = true, true
			}
		}
		g.mu.Lock()
		if failed {
			g.failures++
		}
		// Its followers come back for the next round: early in a burst,
		// that round waits for them and for the writers already waiting.
		early = early && r.followers > 0
		if early {
			want = r.followers
			if g.next != nil {
				want += g.next.joined
			}
		}
		g.mu.Unlock()
		close(r.done)
	}
}

// gatherNow says whether a run starting now waits g.gather: it starts a
// burst (the group was idle for idleGap) or comes within burstSpan of the
// start of one.
func (g *syncGroup) gatherNow() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock()
	if now.Sub(g.lastEnd) >= idleGap {
		g.burst = now
	}
	return g.gather > 0 && now.Sub(g.burst) < burstSpan
}

// gatherUntil waits until want writers (those already waiting included)
// have joined the next round, g.gather at most; want 0: the whole of it.
func (g *syncGroup) gatherUntil(want int) {
	var arrived chan struct{}
	if want > 0 {
		g.mu.Lock()
		if g.next != nil && g.next.joined >= want {
			g.mu.Unlock()
			return
		}
		arrived = make(chan struct{})
		g.want, g.arrived = want, arrived
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			g.want, g.arrived = 0, nil
			g.mu.Unlock()
		}()
	}
	if g.await != nil {
		g.await(g.gather, arrived)
		return
	}
	t := time.NewTimer(g.gather)
	defer t.Stop()
	select {
	case <-arrived: // nil when want is 0: never
	case <-t.C:
	}
}

func (g *syncGroup) clock() time.Time {
	if g.now != nil {
		return g.now()
	}
	return time.Now()
}

// unwrittenFor: a reading of unwritten is used for this long. Reading
// /proc/meminfo costs about as much CPU as a syncfs; the rounds of one
// linger come within milliseconds of each other.
const unwrittenFor = 100 * time.Millisecond

// unwrittenNow returns unwritten, read again if the last reading is older
// than unwrittenFor.
func (g *syncGroup) unwrittenNow() (int64, bool) {
	if now := time.Now(); now.Sub(g.dirtyAt) >= unwrittenFor {
		g.dirty, g.dirtyOK = g.unwritten()
		g.dirtyAt = now
	}
	return g.dirty, g.dirtyOK
}

// countedDatasync is datasync, counted.
func countedDatasync(f *os.File) error {
	datasyncCalls.Add(1)
	return datasync(f)
}
