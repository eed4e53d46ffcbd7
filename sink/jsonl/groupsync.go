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

	mu       sync.Mutex
	running  bool
	next     *syncRound // the round the next caller joins
	failures uint64     // rounds whose syncfs failed
}

// syncRound is one round: the writers that asked before it began.
type syncRound struct {
	done    chan struct{}
	written int64 // bytes its writers wrote since they last synced
	perFile bool  // it did not use syncfs, or syncfs failed: each writer syncs its own file
}

// maxOtherDirty is how many unwritten bytes beyond the round's own the
// system may hold for a round to use syncfs. Written back at a hundred
// megabytes a second, it is a twelfth of a second.
const maxOtherDirty = 8 << 20

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
	g := &syncGroup{dir: d, syncfs: syncFilesystem, unwritten: unwritten}
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
func (s *syncer) sync(f *os.File, written int64) error {
	if s.g == nil {
		return countedDatasync(f)
	}
	r, failures := s.g.wait(written)
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
// returns it once it is done, with the group's failures then.
func (g *syncGroup) wait(written int64) (*syncRound, uint64) {
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &syncRound{done: make(chan struct{})}
		g.next = r
	}
	r.written += written
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

// run runs rounds until no writer waits.
func (g *syncGroup) run() {
	for {
		g.mu.Lock()
		r := g.next
		if r == nil {
			g.running = false
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
		g.mu.Unlock()
		close(r.done)
	}
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
