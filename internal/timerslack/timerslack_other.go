//go:build !linux

package timerslack

import (
	"errors"
	"time"
)

// errUnsupported: only Linux has a per-thread timer slack.
var errUnsupported = errors.New("timer slack: only on Linux")

// Set fails: only Linux has a per-thread timer slack.
func Set(time.Duration) error { return errUnsupported }

// Current fails: only Linux has a per-thread timer slack.
func Current() (time.Duration, error) { return 0, errUnsupported }
