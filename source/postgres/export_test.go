package postgres

import "time"

// SetAdvanceEvery sets how often readers advance the other replicas'
// slots, until the returned function restores it.
func SetAdvanceEvery(d time.Duration) (restore func()) {
	old := advanceEvery
	advanceEvery = d
	return func() { advanceEvery = old }
}
