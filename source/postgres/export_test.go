package postgres

import "time"

// SetAdvanceEvery sets how often readers advance the other replicas'
// slots, until the returned function restores it.
func SetAdvanceEvery(d time.Duration) (restore func()) {
	old := advanceEvery
	advanceEvery = d
	return func() { advanceEvery = old }
}

// SetSnapshotHook calls f at each step of a snapshot chunk ("watermark":
// right after its watermark is written, before its rows are selected;
// "waiting": its select waits for a commit; "selected": after) and before
// EnsureStream records a new stream ("meta"), until the returned function
// removes it.
func SetSnapshotHook(f func(step string)) (restore func()) {
	snapshotHook = f
	return func() { snapshotHook = nil }
}

// SetStatusEvery sets how long a reader goes without telling the server
// its committed position while it reads (0: at every read), until the
// returned function restores it.
func SetStatusEvery(d time.Duration) (restore func()) {
	old := statusEvery
	statusEvery = d
	return func() { statusEvery = old }
}

// BreakConnection closes the reader's replication connection under it, as
// a network failure would: its next use fails.
func BreakConnection(r *Reader) {
	if r.conn != nil {
		_ = r.conn.Conn().Close()
	}
}

// SetWalSenderTimeout sets the wal_sender_timeout readers ask for on
// their replication connections, until the returned function restores it.
func SetWalSenderTimeout(d time.Duration) (restore func()) {
	old := walSenderTimeout
	walSenderTimeout = d
	return func() { walSenderTimeout = old }
}
