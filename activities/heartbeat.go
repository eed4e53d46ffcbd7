package activities

import (
	"sync"
	"time"
)

// heartbeater records GetChanges' heartbeat details: when a batch is
// committed (committed: at once, or within recordGap of the last
// recording), when an attempt fails (set), and in between from a
// goroutine at a steady interval,
// so that a slow poll, a slow commit or slow start-up checks never leave
// the heartbeat timeout without a heartbeat. (An attempt that times out
// while it still holds the sink's writer lock makes the next attempt find
// the tablet locked.) The details are only ever what set, committed or
// update was last given: the latest committed progress, never ahead of the sink.
type heartbeater struct {
	record func(Heartbeat)
	every  time.Duration

	mu       sync.Mutex // held while recording, so details never go back
	latest   Heartbeat
	recorded time.Time // when details were last recorded

	quit chan struct{}
	done chan struct{}
}

// startHeartbeats returns a heartbeater holding first, which it does not
// record yet. With every > 0 it records the latest details every interval
// until stop; with every <= 0 (no heartbeat timeout) only set records.
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
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-h.quit:
			return
		case <-tick.C:
			h.mu.Lock()
			h.recordLocked()
			h.mu.Unlock()
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

// recordGap: committed records at most this often. Recording encodes the
// details (the SDK sends them to the server at most once per its own
// throttle interval, the latest recorded), and a live tablet commits
// every linger: once per commit was a twentieth of a live worker's CPU.
const recordGap = time.Second

// committed makes hb, a commit's progress, the latest details, and
// records them now if the last recording is recordGap old; otherwise the
// next recording (a later commit's or the steady interval's) carries them.
func (h *heartbeater) committed(hb Heartbeat) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latest = hb
	if h.every <= 0 || time.Since(h.recorded) >= recordGap {
		h.recordLocked()
	}
}

func (h *heartbeater) recordLocked() {
	h.record(h.latest)
	h.recorded = time.Now()
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
