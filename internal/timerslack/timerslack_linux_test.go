package timerslack

// Plain testing, not testify: testify's assert imports net/http, which
// links cgo into the test binary when cgo is on, and Set cannot run a
// system call on every thread of a binary with cgo.

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// current is Current, failing t on an error.
func current(t *testing.T) time.Duration {
	t.Helper()
	d, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// held is a thread held by a goroutine locked to it: its id, and its
// slack when asked (-1 on an error).
type held struct {
	tid   int
	slack time.Duration
}

// hold locks a new goroutine to a thread, sends the thread's id on ids,
// waits for ask to close, sends the thread's slack on got, and holds the
// thread until release closes.
func hold(ids chan<- int, ask <-chan struct{}, got chan<- held, release <-chan struct{}) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := syscall.Gettid()
	ids <- tid
	<-ask
	d, err := Current()
	if err != nil {
		d = -1
	}
	got <- held{tid, d}
	<-release
}

// threadIDs are the ids of the process's threads now.
func threadIDs(t *testing.T) map[int]bool {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[int]bool{}
	for _, e := range entries {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	return ids
}

// TestSetReachesThreadsThatAlreadyRun: threads that ran before Set (each
// held by a goroutine locked to it) report the new slack, as does a
// thread the process started after Set (one whose id was not there
// before) and the calling thread.
func TestSetReachesThreadsThatAlreadyRun(t *testing.T) {
	const want = 3 * time.Millisecond
	before := current(t)
	if before == want {
		t.Fatalf("the test needs a slack other than the %v it sets", want)
	}
	release := make(chan struct{})
	defer close(release)
	const threads = 4
	ids, ask, got := make(chan int), make(chan struct{}), make(chan held)
	for range threads {
		go hold(ids, ask, got, release)
		<-ids
	}
	existed := threadIDs(t)
	if err := Set(want); err != nil {
		close(ask)
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Set(before) })
	close(ask)
	for range threads {
		if h := <-got; h.slack != want {
			t.Errorf("thread %d, which ran before Set: slack %v, want %v", h.tid, h.slack, want)
		}
	}
	// Hold more threads until one is new: each goroutine keeps its
	// thread, so the runtime runs out of idle ones and starts one.
	var fresh *held
	for i := 0; fresh == nil && i < 256; i++ {
		ask := make(chan struct{})
		go hold(ids, ask, got, release)
		tid := <-ids
		close(ask)
		h := <-got
		if !existed[tid] {
			fresh = &h
		}
	}
	if fresh == nil {
		t.Fatal("no thread started after Set within 256 held threads")
	}
	if fresh.slack != want {
		t.Errorf("thread %d, started after Set: slack %v, want %v", fresh.tid, fresh.slack, want)
	}
	if d := current(t); d != want {
		t.Errorf("the calling thread: slack %v, want %v", d, want)
	}
}

// TestSetRejectsOutOfRange: zero, negative and beyond Max are
// ErrOutOfRange, and leave the slack as it was.
func TestSetRejectsOutOfRange(t *testing.T) {
	before := current(t)
	for _, d := range []time.Duration{0, -time.Millisecond, Max + 1} {
		if err := Set(d); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Set(%v): %v, want ErrOutOfRange", d, err)
		}
	}
	if after := current(t); after != before {
		t.Errorf("slack %v after rejected Sets, was %v", after, before)
	}
}
