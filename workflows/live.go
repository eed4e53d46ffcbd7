package workflows

import (
	"fmt"
	"slices"
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

// liveStates are the states whose tablet has a run that may be pending.
var liveStates = []State{Streaming, Retrying}

// StallAfter: a Streaming tablet whose running attempt has not committed
// for longer than this is stalled. A run commits after every read, one
// that found nothing too (a read waits batch.maxWait at most: 1 m at the
// most, 5 s by default), so two minutes without a commit mean a read or
// the sink hangs, while the tablet's state still says Streaming. Not
// flagged: an attempt waiting for its retry or a worker, or a retry that
// has not committed yet (its LastError says why its predecessor failed).
const StallAfter = 2 * time.Minute

// Stalled reports how long f's run has gone without a commit at now, and
// whether that makes it stalled: an attempt a worker runs that has
// committed since it began, its last commit over StallAfter ago.
func Stalled(f activities.LiveFigures, now time.Time) (time.Duration, bool) {
	since := now.Sub(f.LastCommit)
	return since, f.Running && !f.Failing && !f.LastCommit.IsZero() && since > StallAfter
}

// StalledReason is the reason a stalled tablet's row gives.
func StalledReason(since time.Duration) string {
	return fmt.Sprintf("stalled: no commit for %s (a read or the sink hangs)", since.Round(time.Second))
}

// LiveTotals are a stream's figures as of its last read of the live
// figures, in its status and its memo (MemoLive).
type LiveTotals struct {
	// At is when the stream read them.
	At time.Time `json:"at"`
	// Records is every tablet's records, live where a run is past its
	// report; RecordsPerSecond, the rate since the read before.
	Records          int64   `json:"records"`
	RecordsPerSecond float64 `json:"recordsPerSecond"`
	// MaxLagSeconds is the largest lag of a Streaming tablet.
	MaxLagSeconds float64 `json:"maxLagSeconds"`
	// Stalled counts the Streaming tablets stalled at At (StallAfter).
	Stalled int `json:"stalled"`
}

// MemoLive is the stream's memo field that holds its LiveTotals.
const MemoLive = "live"

// WithLive shows in st each tablet's pending run where its figures are
// past the row's: its checkpoint, the records and batches of the tablet's
// earlier runs plus the run's, and its lag (the row's Live says so). A
// row that is live already (a status query's answer) is counted from what
// its tablet reported. A Streaming tablet whose run is stalled at now
// gets StalledReason as its reason. st is left alone.
func WithLive(st StreamStatus, figures []activities.LiveFigures, now time.Time) StreamStatus {
	byTablet := make(map[string]activities.LiveFigures, len(figures))
	for _, f := range figures {
		byTablet[f.Tablet] = f
	}
	st.Tablets = slices.Clone(st.Tablets)
	for i := range st.Tablets {
		t := &st.Tablets[i]
		f, ok := byTablet[t.ID]
		if !ok {
			continue
		}
		if since, stalled := Stalled(f, now); stalled && t.State == Streaming {
			t.Reason = StalledReason(since)
		}
		if f.Checkpoint.Compare(t.Checkpoint) <= 0 {
			continue // not past the row (a run that just reported, or a read older than the row's)
		}
		reported := *t
		if t.Live != nil {
			reported.Records, reported.Batches = t.Records-t.Live.Records, t.Batches-t.Live.Batches
		}
		t.Checkpoint = f.Checkpoint
		t.Records, t.Batches = reported.Records+f.Records, reported.Batches+f.Batches
		t.LagSeconds = f.LagSeconds
		t.Live = &LiveRow{At: f.At, Records: f.Records, Batches: f.Batches}
	}
	return st
}

// liveView is what the stream's last reads of the live figures found.
type liveView struct {
	figures []activities.LiveFigures
	totals  *LiveTotals
	// records is each tablet's records at the last read, rates the
	// tablet's rate since the read before.
	records map[string]int64
	rates   map[string]float64
	// next is the timer to the next read; busy, a read runs.
	next workflow.Future
	busy bool
	in   workflow.Channel
	memo LiveTotals
}

// liveRead is what one ReadLiveFigures came back with.
type liveRead struct {
	Figures []activities.LiveFigures
	Err     string
}

// liveEvery is how long the stream waits between two reads of its
// running tablets' figures: statusRefresh, or 10 ms per running tablet
// where that is longer (the describes on the server, and the figures in
// the stream's history, grow with the tablets).
func liveEvery(refresh time.Duration, running int) time.Duration {
	return max(refresh, time.Duration(running)*10*time.Millisecond)
}

// runningTablets returns the tablets whose runs may be pending.
func (s *stream) runningTablets() []string {
	var ids []string
	for _, id := range s.tabletIDs() {
		if slices.Contains(liveStates, s.st.Tablets[id].State) {
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

// readLive reads the running tablets' live figures beside the loop.
func (s *stream) readLive(ctx, actx workflow.Context) {
	s.lv.next, s.lv.busy = nil, true
	ids := s.runningTablets()
	workflow.Go(ctx, func(gctx workflow.Context) {
		var a *activities.Activities
		lctx := workflow.WithActivityOptions(actx, workflow.ActivityOptions{
			StartToCloseTimeout: 30 * time.Second, ScheduleToCloseTimeout: time.Minute,
			Summary:     fmt.Sprintf("read the live figures of %d tablets", len(ids)),
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 5 * time.Second, MaximumAttempts: 3},
		})
		var r liveRead
		if err := workflow.ExecuteActivity(lctx, a.ReadLiveFigures, activities.ReadLiveInput{
			WorkflowPrefix: TabletWorkflowID(s.id, ""), Tablets: ids,
		}).Get(gctx, &r.Figures); err != nil {
			r.Err = err.Error()
		}
		s.lv.in.Send(gctx, r)
	})
}

// onLive takes a read of the live figures: the status shows them, the
// rates are taken since the read before, and the memo gets the totals
// when they changed. A read that failed leaves the figures as they were
// (their Live.At says how old).
func (s *stream) onLive(ctx workflow.Context, r liveRead) {
	s.lv.busy = false
	if r.Err != "" {
		s.log.Info("live figures not read", "error", r.Err)
		return
	}
	now := workflow.Now(ctx)
	s.lv.figures = r.Figures
	st := WithLive(s.status(time.Time{}), r.Figures, now)
	prev := s.lv.totals
	totals := &LiveTotals{At: now}
	records, rates := map[string]int64{}, map[string]float64{}
	for _, t := range st.Tablets {
		records[t.ID] = t.Records
		totals.Records += t.Records
		if prev != nil {
			if p, ok := s.lv.records[t.ID]; ok && t.Records >= p && now.After(prev.At) {
				rates[t.ID] = float64(t.Records-p) / now.Sub(prev.At).Seconds()
				totals.RecordsPerSecond += rates[t.ID]
			}
		}
		if t.State == Streaming {
			totals.MaxLagSeconds = max(totals.MaxLagSeconds, t.LagSeconds)
		}
	}
	for _, f := range r.Figures {
		if _, stalled := Stalled(f, now); stalled && s.st.Tablets[f.Tablet] != nil && s.st.Tablets[f.Tablet].State == Streaming {
			totals.Stalled++
		}
	}
	s.lv.totals, s.lv.records, s.lv.rates = totals, records, rates
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
	st = WithLive(st, s.lv.figures, now)
	for i := range st.Tablets {
		if l := st.Tablets[i].Live; l != nil {
			l.RecordsPerSecond = s.lv.rates[st.Tablets[i].ID]
		}
	}
	if s.lv.totals != nil {
		t := *s.lv.totals
		st.Live = &t
	}
	return st
}
