// Package timerslack sets how late the kernel may wake the process's
// threads from a timed sleep (Linux's per-thread timer slack).
//
// A quiet worker's threads sleep in epoll_wait until the Go runtime's next
// timer. epoll_wait takes its timeout in whole milliseconds and the
// runtime rounds the wait down, so with the kernel's default slack of
// 50 µs a thread wakes up to a millisecond before the timer is due, finds
// nothing to do, and sleeps once more for a millisecond: two wakes for
// each timer. A slack of a millisecond lets the kernel end the rounded-down
// wait at or after the timer, so it costs one wake; a timer may fire up to
// that much later, which nothing in a worker notices. make bench's live
// case (bench/throughput) measures the worker's CPU per record live and
// idle with this slack (the worker's --timer-slack=0 keeps the kernel's
// default, to compare); see docs/benchmarks.md.
package timerslack

import (
	"errors"
	"fmt"
	"time"
)

// Default is the worker's timer slack: the millisecond epoll_wait rounds
// to.
const Default = time.Millisecond

// Max bounds what Set accepts: beyond a second a late timer starts to show
// in heartbeats and lingers.
const Max = time.Second

// ErrOutOfRange: Set was asked for a slack of 0 or less, or beyond Max.
var ErrOutOfRange = errors.New("timer slack out of range")

// check is Set's bound, on every system.
func check(d time.Duration) error {
	if d <= 0 || d > Max {
		return fmt.Errorf("%w: %v (more than 0, at most %v)", ErrOutOfRange, d, Max)
	}
	return nil
}
