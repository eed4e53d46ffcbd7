//go:build !linux

package timerslack

import (
	"errors"
	"time"
)

// errUnsupported: only Linux has a per-thread timer slack.
var errUnsupported = errors.New("timer slack: only on Linux")

// Set fails: only Linux has a per-thread timer slack (with ErrOutOfRange
// first when d is not in (0, Max], as on Linux).
func Set(d time.Duration) error {
	if err := check(d); err != nil {
		return err
	}
	return errUnsupported
}

// Current fails: only Linux has a per-thread timer slack.
func Current() (time.Duration, error) { return 0, errUnsupported }
