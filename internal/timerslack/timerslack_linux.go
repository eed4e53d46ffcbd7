package timerslack

import (
	"fmt"
	"syscall"
	"time"
)

// prSetTimerSlack and prGetTimerSlack are prctl(2)'s options.
const (
	prSetTimerSlack = 29
	prGetTimerSlack = 30
)

// Set sets every thread's timer slack to d, and with it the slack of the
// threads the runtime starts later (a thread inherits its creator's). It
// fails on a binary built with cgo (the runtime cannot then run a system
// call on every thread), and with ErrOutOfRange when d is not in
// (0, Max].
func Set(d time.Duration) error {
	if err := check(d); err != nil {
		return err
	}
	_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, prSetTimerSlack, uintptr(d.Nanoseconds()), 0)
	if errno == 0 {
		return nil
	}
	err := fmt.Errorf("prctl(PR_SET_TIMERSLACK) on every thread: %w", errno)
	if errno == syscall.ENOTSUP {
		err = fmt.Errorf("%w (a binary built with cgo; build with CGO_ENABLED=0)", err)
	}
	return err
}

// Current is the calling thread's timer slack.
func Current() (time.Duration, error) {
	ns, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prGetTimerSlack, 0, 0)
	if errno != 0 {
		return 0, fmt.Errorf("prctl(PR_GET_TIMERSLACK): %w", errno)
	}
	return time.Duration(ns), nil
}
