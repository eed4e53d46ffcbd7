package activities

import (
	"sync"
	"time"
)

// heartbeater records GetChanges' heartbeat details: when an attempt
// fails or moves (set), and otherwise from a goroutine at a steady
// interval, on the grid the worker's tablets share (onGrid), so that a
// slow poll, a slow commit or slow start-up checks never leave the
// heartbeat timeout without a heartbeat, and an idle worker's tablets
// record together. A commit's progress (committed) waits for the next of
// those recordings: the SDK sends details to the server at most once per
// its throttle interval (0.8 × the heartbeat timeout, at most 60 s)
// anyway, the latest recorded, and recording encodes them, which once per
// commit was a twentieth of a live worker's CPU. Without a heartbeat
// timeout there is no steady interval, and every commit is recorded. (An
// attempt that times out while it still holds the sink's writer lock
// makes the next attempt find the tablet locked.) The details are only
// ever what set, committed or update was last given: the latest committed
// progress, never ahead of the sink.
type heartbeater struct {
	record func(Heartbeat)
	every  time.Duration

	mu     sync.Mutex // held while recording, so details never go back
	latest Heartbeat

	quit chan struct{}
	done chan struct{}
}

// startHeartbeats returns a heartbeater holding first, which it does not
// record yet. With every > 0 it records the latest details at least every
// interval (on onGrid's grid) until stop; with every <= 0 (no heartbeat
// timeout) only set and committed record.
func startHeartbeats(record func(Heartbeat), first Heartbeat, every time.Duration) *heartbeater {
	h := &heartbeater{record: record, every: every, latest: first, quit: make(chan struct{}), done: make(chan struct{})}
	if every <= 0 {
		close(h.done)
		return h
	}
	go h.loop(every)
	return h
}

func (h *heartbeater) loop(every time.Duration) {
	defer close(h.done)
	tick := time.NewTimer(onGrid(time.Now(), every))
	defer tick.Stop()
	for {
		select {
		case <-h.quit:
			return
		case <-tick.C:
			// The next one is set from now, not from when this one is
			// done: a recording that waits on the SDK (its send to the
			// server) does not push the next one further out.
			now := time.Now()
			next := now.Add(onGrid(now, every))
			h.mu.Lock()
			h.recordLocked()
			h.mu.Unlock()
			tick.Reset(time.Until(next))
		}
	}
}

// set makes hb the latest details and records them now.
func (h *heartbeater) set(hb Heartbeat) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latest = hb
	h.recordLocked()
}

// committed makes hb, a commit's progress, the latest details: recorded
// at the next steady heartbeat, or now if there is none.
func (h *heartbeater) committed(hb Heartbeat) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latest = hb
	if h.every <= 0 {
		h.recordLocked()
	}
}

func (h *heartbeater) recordLocked() {
	h.record(h.latest)
}

// update makes hb the latest details, for the next heartbeat.
func (h *heartbeater) update(hb Heartbeat) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latest = hb
}

// stop ends the background heartbeats; none is recorded after it returns.
func (h *heartbeater) stop() {
	close(h.quit)
	<-h.done
}
