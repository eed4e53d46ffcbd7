package timerslack

// Plain testing, not testify: testify's assert imports net/http, which
// links cgo into the test binary when cgo is on, and Set cannot run a
// system call on every thread of a binary with cgo.

import (
	"runtime"
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

// TestSetReachesThreadsThatAlreadyRun: threads started before Set (each
// held by a goroutine locked to it) report the new slack, as do threads
// started after it and the calling thread.
func TestSetReachesThreadsThatAlreadyRun(t *testing.T) {
	const want = 3 * time.Millisecond
	before := current(t)
	if before == want {
		t.Fatalf("the test needs a slack other than the %v it sets", want)
	}
	// report holds a thread of its own until ask closes, then sends that
	// thread's slack (-1 on an error).
	report := func(ready chan<- struct{}, ask <-chan struct{}, got chan<- time.Duration) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if ready != nil {
			ready <- struct{}{}
		}
		<-ask
		d, err := Current()
		if err != nil {
			d = -1
		}
		got <- d
	}
	const threads = 4
	ready, ask, got := make(chan struct{}), make(chan struct{}), make(chan time.Duration)
	for range threads {
		go report(ready, ask, got)
		<-ready
	}
	if err := Set(want); err != nil {
		close(ask)
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Set(before) })
	close(ask)
	for range threads {
		if d := <-got; d != want {
			t.Errorf("a thread that ran before Set: slack %v, want %v", d, want)
		}
	}
	for range threads {
		ask := make(chan struct{})
		go report(nil, ask, got)
		close(ask)
		if d := <-got; d != want {
			t.Errorf("a thread started after Set: slack %v, want %v", d, want)
		}
	}
	if d := current(t); d != want {
		t.Errorf("the calling thread: slack %v, want %v", d, want)
	}
}

// TestSetRejectsOutOfRange: zero, negative and beyond Max are errors, and
// leave the slack as it was.
func TestSetRejectsOutOfRange(t *testing.T) {
	before := current(t)
	for _, d := range []time.Duration{0, -time.Millisecond, Max + 1} {
		if err := Set(d); err == nil {
			t.Errorf("Set(%v): no error", d)
		}
	}
	if after := current(t); after != before {
		t.Errorf("slack %v after rejected Sets, was %v", after, before)
	}
}
