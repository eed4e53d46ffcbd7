package workflows

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
)

// Live status (docs/operating.md#live-status). A tablet's row moves when
// its GetChanges run ends and reports; while a run goes on, its progress
// is in its heartbeat on the server. The stream reads those heartbeats
// every statusRefresh (the ReadLiveFigures activity: one describe per
// running tablet, no event per batch) and shows them in its status query
// and memo; starter status reads them again on each refresh.

// MayRun reports whether a tablet in state st may have a GetChanges run
// pending (Streaming, Retrying): the tablets whose live figures are read.
func MayRun(st State) bool { return st == Streaming || st == Retrying }

// StallAfter: a Streaming tablet whose running attempt has not committed
// for longer than this is stalled. A run commits after every read, one
// that found nothing too (a read waits batch.maxWait at most: 1 m at the
// most, 5 s by default), so two minutes without a commit mean a read or
// the sink hangs, while the tablet's state still says Streaming. Not
// flagged: an attempt waiting for its retry or a worker, or a retry that
// has not committed yet (its LastError says why its predecessor failed).
const StallAfter = 2 * time.Minute

// Stalled reports how long f's run had gone without a commit when the
// server got its heartbeat, and whether that makes it stalled: an attempt
// a worker runs that has committed since it began, its last commit over
// StallAfter before that heartbeat. (Judged at the heartbeat, not at the
// query: figures read long ago, or a worker that stopped heartbeating,
// stall nothing.)
func Stalled(f activities.LiveFigures) (time.Duration, bool) {
	since := f.At.Sub(f.LastCommit)
	return since, f.Running && !f.Failing && !f.LastCommit.IsZero() && since > StallAfter
}

// stalledBegin and stalledEnd begin and end StalledReason's words.
const (
	stalledBegin = "stalled: no commit for "
	stalledEnd   = "(a read or the sink hangs)"
)

// StalledReason is the reason a stalled tablet's row gives, before the
// tablet's own reason if it has one.
func StalledReason(since time.Duration, own string) string {
	r := fmt.Sprintf("%s%s %s", stalledBegin, since.Round(time.Second), stalledEnd)
	if own != "" {
		r += "; " + own
	}
	return r
}

// isStalled reports whether reason begins with StalledReason's words.
func isStalled(reason string) bool { return strings.HasPrefix(reason, stalledBegin) }

// withoutStalled is reason without a StalledReason before it.
func withoutStalled(reason string) string {
	if !isStalled(reason) {
		return reason
	}
	_, own, _ := strings.Cut(reason, stalledEnd)
	return strings.TrimPrefix(own, "; ")
}

// LiveTotals are a stream's figures as of its last read of the live
// figures, in its status and its memo (MemoLive).
type LiveTotals struct {
	// At is when the stream read them.
	At time.Time `json:"at"`
	// Records is every tablet's records, live where a run is past its
	// report; RecordsPerSecond, the sum of the tablets' rates, each
	// between its last two heartbeats read.
	Records          int64   `json:"records"`
	RecordsPerSecond float64 `json:"recordsPerSecond"`
	// MaxLagSeconds is the largest lag of a Streaming tablet.
	MaxLagSeconds float64 `json:"maxLagSeconds"`
	// Stalled counts the Streaming tablets whose runs were stalled
	// (Stalled) as of the read.
	Stalled int `json:"stalled"`
}

// MemoLive is the stream's memo field that holds its LiveTotals.
const MemoLive = "live"

// WithLive shows in st each tablet's pending run where its figures are
// past the row's, on a Streaming or Retrying row: its checkpoint, the
// tablet's records and batches with the run's, and its lag (the row's
// Live says so). A row that is live
// already (a status query's answer) is counted from what its tablet
// reported, and keeps its rate. A Streaming tablet whose run is stalled
// (Stalled) gets StalledReason before its reason; one that is not, none.
// st is left alone.
func WithLive(st StreamStatus, figures []activities.LiveFigures) StreamStatus {
	byTablet := make(map[string]activities.LiveFigures, len(figures))
	for _, f := range figures {
		byTablet[f.Tablet] = f
	}
	st.Tablets = slices.Clone(st.Tablets)
	for i := range st.Tablets {
		t := &st.Tablets[i]
		f, ok := byTablet[t.ID]
		if !ok || !MayRun(t.State) {
			continue // no figures, or a tablet whose runs have ended (its report holds their last commit)
		}
		past := f.Checkpoint.Compare(t.Checkpoint)
		if past < 0 {
			continue // a read older than the row (a run that has reported since)
		}
		t.Reason = withoutStalled(t.Reason)
		if since, stalled := Stalled(f); stalled && t.State == Streaming {
			t.Reason = StalledReason(since, t.Reason)
		}
		if past == 0 {
			continue // not past the row (a run that just reported, or one that has not committed since)
		}
		live := &LiveRow{At: f.At, Records: f.Records, Batches: f.Batches}
		if f.Totals != nil {
			t.Records, t.Batches = f.Totals.Records, f.Totals.Batches
		} else {
			reported := *t
			if t.Live != nil {
				reported.Records, reported.Batches = t.Records-t.Live.Records, t.Batches-t.Live.Batches
			}
			t.Records, t.Batches = reported.Records+f.Records, reported.Batches+f.Batches
		}
		if t.Live != nil {
			live.RecordsPerSecond = t.Live.RecordsPerSecond
		}
		t.Checkpoint = f.Checkpoint
		t.LagSeconds = f.LagSeconds
		t.Live = live
	}
	return st
}

// liveView is what the stream's last reads of the live figures found.
type liveView struct {
	figures []activities.LiveFigures
	totals  *LiveTotals
	// rates are each tablet's last rate, taken between two heartbeats.
	rates map[string]liveRate
	// next is the timer to the next read; busy, a read runs.
	next workflow.Future
	busy bool
	in   workflow.Channel
	memo LiveTotals
}

// liveRate is a tablet's records at a heartbeat, and its rate up to it.
type liveRate struct {
	records int64
	at      time.Time
	perSec  float64
}

// liveRead is what one read of the live figures came back with.
type liveRead struct {
	Figures []activities.LiveFigures
	Err     string
}

// liveEvery is how long the stream waits between two reads of its
// running tablets' figures: statusRefresh, or 30 ms per running tablet
// where that is longer (the describes on the server, and the figures in
// the stream's history, about 200 bytes a tablet a read, grow with the
// tablets: 30 s at 1,000).
func liveEvery(refresh time.Duration, running int) time.Duration {
	return max(refresh, time.Duration(running)*30*time.Millisecond)
}

// liveChunk is the most tablets one ReadLiveFigures reads (its input and
// result stay well under the server's payload limits).
const liveChunk = 500

// runningTablets returns the tablets whose runs may be pending.
func (s *stream) runningTablets() []string {
	var ids []string
	for _, id := range s.tabletIDs() {
		if MayRun(s.st.Tablets[id].State) {
			ids = append(ids, id)
		}
	}
	return ids
}

// scheduleLive starts the timer to the next read of the live figures when
// none waits or runs, the stream runs and has tablets that do
// (changeLiveStatus).
func (s *stream) scheduleLive(ctx workflow.Context) {
	if s.lv == nil || s.lv.next != nil || s.lv.busy || s.st.Stop != nil {
		return
	}
	running := len(s.runningTablets())
	if running == 0 {
		return
	}
	s.lv.next = workflow.NewTimer(ctx, liveEvery(s.cfg.StatusRefresh.D(), running))
}

// readLive reads the running tablets' live figures beside the loop, in
// activities of liveChunk tablets at most.
func (s *stream) readLive(ctx, actx workflow.Context) {
	s.lv.next, s.lv.busy = nil, true
	ids := s.runningTablets()
	workflow.Go(ctx, func(gctx workflow.Context) {
		var a *activities.Activities
		var futures []workflow.Future
		for chunk := range slices.Chunk(ids, liveChunk) {
			lctx := workflow.WithActivityOptions(actx, workflow.ActivityOptions{
				StartToCloseTimeout: 30 * time.Second, ScheduleToCloseTimeout: time.Minute,
				Summary:     fmt.Sprintf("read the live figures of %d tablets", len(chunk)),
				RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 5 * time.Second, MaximumAttempts: 3},
			})
			futures = append(futures, workflow.ExecuteActivity(lctx, a.ReadLiveFigures, activities.ReadLiveInput{
				WorkflowPrefix: TabletWorkflowID(s.id, ""), Tablets: chunk,
			}))
		}
		var r liveRead
		failed := 0
		for _, f := range futures {
			var figures []activities.LiveFigures
			if err := f.Get(gctx, &figures); err != nil {
				failed++
				r.Err = err.Error()
				continue
			}
			r.Figures = append(r.Figures, figures...)
		}
		if failed < len(futures) {
			r.Err = "" // a chunk that failed keeps its figures (onLive)
		}
		s.lv.in.Send(gctx, r)
	})
}

// onLive takes a read of the live figures: the status shows them (a
// running tablet the read missed keeps the figures it had), each
// tablet's rate is taken between its last two heartbeats, and the memo
// gets the totals when they changed. A read that failed leaves the
// figures as they were (their Live.At says how old).
func (s *stream) onLive(ctx workflow.Context, r liveRead) {
	s.lv.busy = false
	if r.Err != "" {
		s.log.Info("live figures not read", "error", r.Err)
		return
	}
	now := workflow.Now(ctx)
	read := map[string]bool{}
	for _, f := range r.Figures {
		read[f.Tablet] = true
	}
	figures := r.Figures
	for _, f := range s.lv.figures {
		if t := s.st.Tablets[f.Tablet]; !read[f.Tablet] && t != nil && MayRun(t.State) {
			figures = append(figures, f)
		}
	}
	s.lv.figures = figures
	st := WithLive(s.status(time.Time{}), figures)
	totals := &LiveTotals{At: now}
	rates := map[string]liveRate{}
	for _, t := range st.Tablets {
		totals.Records += t.Records
		if t.State == Streaming {
			totals.MaxLagSeconds = max(totals.MaxLagSeconds, t.LagSeconds)
			if isStalled(t.Reason) {
				totals.Stalled++
			}
		}
		if t.Live == nil {
			continue
		}
		rate := liveRate{records: t.Records, at: t.Live.At}
		if p, ok := s.lv.rates[t.ID]; ok {
			switch {
			case rate.at.Equal(p.at):
				rate.perSec = p.perSec // the same heartbeat
			case rate.at.After(p.at) && rate.records >= p.records:
				rate.perSec = float64(rate.records-p.records) / rate.at.Sub(p.at).Seconds()
			}
		}
		rates[t.ID] = rate
		totals.RecordsPerSecond += rate.perSec
	}
	s.lv.totals, s.lv.rates = totals, rates
	memo := *totals
	memo.At = time.Time{}
	memo.RecordsPerSecond = float64(int64(memo.RecordsPerSecond*10)) / 10
	if memo != s.lv.memo {
		if err := workflow.UpsertMemo(ctx, map[string]any{MemoLive: totals}); err != nil {
			s.log.Warn("memo not updated", "error", err)
		}
		s.lv.memo = memo
	}
}

// liveStatus is the stream's status at now with its last live figures.
func (s *stream) liveStatus(now time.Time) StreamStatus {
	st := s.status(now)
	if s.lv == nil {
		return st
	}
	st = WithLive(st, s.lv.figures)
	for i := range st.Tablets {
		if l := st.Tablets[i].Live; l != nil {
			l.RecordsPerSecond = s.lv.rates[st.Tablets[i].ID].perSec
		}
	}
	if s.lv.totals != nil {
		t := *s.lv.totals
		st.Live = &t
	}
	return st
}
