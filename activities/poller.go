package activities

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/metrics"
	"github.com/tabletflow/tabletflow/source"
)

// poller reads a replica one batch ahead of the commits: while GetChanges
// commits a batch, the next one is already being read. It owns the reader
// until stop returns — a PostgreSQL reader holds one connection and is not
// safe for concurrent use — so acknowledgements are handed to it (ack)
// and sent between two polls, the latest one only.
type poller struct {
	out    chan polled // at most one batch waits here while the next is read
	cancel context.CancelFunc
	done   chan struct{}
	rd     source.ReplicaReader
	req    source.ChangesRequest
	log    *zap.Logger
	m      *metrics.Metrics
	linger time.Duration
	busy   func() // told when a read finds a backlog; nil: nobody

	// lost is the watch of the reader's connection (source.LossWatcher)
	// that lingerOn selects on: one for the poller's life, renewed only
	// after it fired (a watch per linger was a goroutine, a context and a
	// gRPC state subscription each time, a twentieth of a live worker's
	// CPU). The loop's goroutine alone uses it.
	lost <-chan struct{}

	acks    chan struct{} // a checkpoint to acknowledge came in (wakes a lingering poller)
	mu      sync.Mutex
	pending source.Checkpoint // to acknowledge at the next chance
	acked   source.Checkpoint // acknowledged
	ackedAt time.Time         // when (the real clock)
}

// polled is one poll's outcome.
type polled struct {
	batch source.Batch
	err   error
	began time.Time // when the poll was sent (the activity's clock)
	// copy is the reader's copy of rows right after the poll, on
	// sources whose readers report one (source.CopyReporter).
	copy *source.CopyProgress
}

// startPoller starts reading rd from req.From. The polls run on a child
// of ctx, each bounded by req.MaxWait plus pollSlack. After a read that
// brought records but fewer than req.MaxRecords and says it is caught up
// (records trickle in; a read that stopped short of a whole transaction
// that would not fit is not), the next read waits about linger after that
// one was handed over (lingerFor: on a grid shared by the worker's
// tablets), so that it brings what arrived meanwhile in one batch — the
// group commit — instead of a record or two per read, each then costing a
// commit and its syncs (lingerOn). A read that finds a backlog calls
// busy (when not nil): the worker has work that will keep it busy.
func startPoller(ctx context.Context, rd source.ReplicaReader, req source.ChangesRequest, linger time.Duration,
	now func() time.Time, log *zap.Logger, m *metrics.Metrics, busy func()) *poller {
	ctx, cancel := context.WithCancel(ctx)
	p := &poller{out: make(chan polled, 1), cancel: cancel, done: make(chan struct{}), rd: rd, req: req, log: log, m: m,
		linger: linger, busy: busy, acked: req.From, acks: make(chan struct{}, 1)}
	go p.loop(ctx, now)
	return p
}

// pollSlack is how much longer than its MaxWait a poll may take.
const pollSlack = commitTimeout

func (p *poller) loop(ctx context.Context, now func() time.Time) {
	defer close(p.done)
	req := p.req
	// drained is where the last backlog ended (zero before the first): the
	// acknowledgement that reaches it goes out at once, not up to ackEvery
	// later, so the source hears without delay that the tablet caught up.
	// A trickle never fills a read, so its acknowledgements keep the pace.
	var drained source.Checkpoint
	backlog := false
	for {
		p.sendAck(ctx, p.reached(drained))
		began := now()
		// Acknowledgements go out between reads: while one is owed, a read
		// that finds nothing returns when it is due (ackWait); once the
		// source has heard of everything, an idle read waits up to
		// maxWait, ending on the grid the worker's tablets share (onGrid).
		r := req
		if wait, owed := p.ackWait(req.From, drained, backlog); owed {
			r.MaxWait = min(r.MaxWait, wait)
		} else {
			r.MaxWait = onGrid(time.Now(), r.MaxWait)
		}
		pctx, cancel := context.WithTimeout(ctx, r.MaxWait+pollSlack)
		b, err := p.rd.GetChanges(pctx, r)
		cancel()
		if ctx.Err() != nil { // stopped: what was read is not delivered
			return
		}
		var c *source.CopyProgress
		if cr, ok := p.rd.(source.CopyReporter); ok {
			c = cr.Copy() // on the goroutine that reads, as the reader asks
		}
		select {
		case p.out <- polled{batch: b, err: err, began: began, copy: c}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
		if b.Checkpoint.Compare(req.From) > 0 {
			req.From = b.Checkpoint
		}
		n := len(b.Records)
		switch {
		case n == req.MaxRecords || !b.CaughtUp:
			backlog = true
			if p.busy != nil {
				p.busy()
			}
		case backlog:
			backlog, drained = false, req.From
		}
		if n > 0 && n < req.MaxRecords && b.CaughtUp && p.linger > 0 && !p.lingerOn(ctx, drained) {
			return
		}
	}
}

// lingerOn waits about the linger before the next read (lingerFor). While
// it lingers, the poller acknowledges a commit that is due (the first of a
// run at once): the source hears of it without waiting for the next read.
// A connection lost meanwhile (the server down; source.LossWatcher) ends
// the wait: the next read fails at once and the tablet moves on. It
// returns false when ctx ended.
func (p *poller) lingerOn(ctx context.Context, drained source.Checkpoint) bool {
	t := time.NewTimer(lingerFor(time.Now(), p.linger))
	defer t.Stop()
	if p.lost == nil {
		if w, ok := p.rd.(source.LossWatcher); ok {
			p.lost = w.Lost(ctx) // watched until the poller stops
		}
	}
	for {
		select {
		case <-t.C:
			return true
		case <-p.lost:
			p.lost = nil // fired: the next linger watches afresh
			return true
		case <-p.acks:
			p.sendAck(ctx, p.reached(drained))
		case <-ctx.Done():
			return false
		}
	}
}

// lingerFor is how long a read that brought a trickle of records waits
// at now: until the first multiple of linger on the clock at least an
// eighth of a linger away. The multiples are shared by every tablet this
// worker reads, so their reads and commits come together, once per
// linger, rather than spread over it: the worker wakes once for all of
// them, and their commits share the sink's syncs (the JSONL sink's group
// sync). A tablet in step reads exactly every linger; one joining waits
// between an eighth of a linger and one and an eighth, so a record waits
// at most about that long to be read.
func lingerFor(now time.Time, linger time.Duration) time.Duration {
	return untilMultiple(now, linger, linger/8)
}

// onGrid is how long a periodic wait of about period starts at now: until
// the first multiple of period/2 on the clock more than period/2 away, so
// between half a period and a whole one, never longer. Waits set this way
// by the worker's tablets (an idle read's batch.maxWait, the heartbeat
// interval) end together, at the same few instants, rather than each at
// its own time: an idle worker wakes once for all its tablets, and a wake
// from idle is most of what an idle read or a heartbeat costs (the Go
// runtime's scheduler and sysmon, cold caches). A tablet in step waits
// exactly period; one joining waits at least half of it.
func onGrid(now time.Time, period time.Duration) time.Duration {
	half := period / 2
	if half <= 0 {
		return period
	}
	return untilMultiple(now, half, half+1)
}

// untilMultiple is how long it is from now to the first multiple of step
// (> 0) on the clock at least atLeast away: the grid lingerFor and onGrid
// share.
func untilMultiple(now time.Time, step, atLeast time.Duration) time.Duration {
	r := now.UnixNano() % int64(step)
	if r < 0 { // a clock before 1970
		r += int64(step)
	}
	d := step - time.Duration(r) // in (0, step]
	for d < atLeast {
		d += step
	}
	return d
}

// ack asks for cp (committed to the sink) to be acknowledged to the source
// before a later poll.
func (p *poller) ack(cp source.Checkpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cp.Compare(p.pending) > 0 {
		p.pending = cp
		select {
		case p.acks <- struct{}{}:
		default:
		}
	}
}

// ackEvery: the poller acknowledges at most this often (and once more
// when it stops, and at once when a backlog is drained). An
// acknowledgement only moves the source's retention barrier (a
// PostgreSQL slot's confirmed position), which is minutes or hours away;
// one per commit was a tenth of a live worker's CPU, and one a second
// still a fifteenth.
const ackEvery = 3 * time.Second

// ackPoll: the shortest wait of a read while an acknowledgement is owed
// (ackWait).
const ackPoll = 200 * time.Millisecond

// ackWait tells whether the source has yet to hear of from (the
// checkpoint of what was handed over) and, if so, how long a read may
// wait for records before the acknowledgement is due: ackPoll during a
// backlog, or while the one reaching its end (drained) is owed — the
// source hears at once that the tablet caught up, where a long
// batch.maxWait would hold that back; otherwise until ackEvery has passed
// since the last one, and at least ackPoll.
func (p *poller) ackWait(from, drained source.Checkpoint, backlog bool) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.acked.Compare(from) >= 0 {
		return 0, false
	}
	if backlog || (!drained.IsZero() && p.acked.Compare(drained) < 0) {
		return ackPoll, true
	}
	return max(ackPoll, ackEvery-time.Since(p.ackedAt)), true
}

// reached tells whether the checkpoint to acknowledge has reached cp and
// the source has not heard of cp yet (never for a zero cp).
func (p *poller) reached(cp source.Checkpoint) bool {
	if cp.IsZero() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending.Compare(cp) >= 0 && p.acked.Compare(cp) < 0
}

// sendAck acknowledges the pending checkpoint, if it is new and ackEvery
// has passed since the last one (always, with force). A failed one is
// repeated with the next.
func (p *poller) sendAck(ctx context.Context, force bool) {
	p.mu.Lock()
	cp := p.pending
	due := cp.Compare(p.acked) > 0 && (force || time.Since(p.ackedAt) >= ackEvery)
	p.mu.Unlock()
	if !due {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := p.rd.Ack(actx, p.req.Stream, p.req.Tablet, cp); err != nil {
		p.log.Warn("ack failed", zap.String("tablet", p.req.Tablet), zap.Error(err))
		return
	}
	p.m.Acked(p.req.Stream)
	p.mu.Lock()
	p.acked, p.ackedAt = cp, time.Now()
	p.mu.Unlock()
}

// stop ends the polls, waits for the goroutine, then sends the last ack
// still pending: the reader is the caller's again.
func (p *poller) stop() {
	p.cancel()
	<-p.done
	p.sendAck(context.Background(), true)
}
