package activities

import (
	"sync"
	"time"
)

// heartbeater records GetChanges' heartbeat details: at once when a batch
// is committed (set), and in between from a goroutine at a steady interval,
// so that a slow poll, a slow commit or slow start-up checks never leave
// the heartbeat timeout without a heartbeat. (An attempt that times out
// while it still holds the sink's writer lock makes the next attempt find
// the tablet locked.) The details are only ever what set or update was
// last given: the latest committed progress, never ahead of the sink.
type heartbeater struct {
	record func(Heartbeat)

	mu     sync.Mutex // held while recording, so details never go back
	latest Heartbeat

	quit chan struct{}
	done chan struct{}
}

// startHeartbeats returns a heartbeater holding first, which it does not
// record yet. With every > 0 it records the latest details every interval
// until stop; with every <= 0 (no heartbeat timeout) only set records.
func startHeartbeats(record func(Heartbeat), first Heartbeat, every time.Duration) *heartbeater {
	h := &heartbeater{record: record, latest: first, quit: make(chan struct{}), done: make(chan struct{})}
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
			h.record(h.latest)
			h.mu.Unlock()
		}
	}
}

// set makes hb the latest details and records them now.
func (h *heartbeater) set(hb Heartbeat) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latest = hb
	h.record(hb)
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
