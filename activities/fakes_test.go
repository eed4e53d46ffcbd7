package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/interceptor"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
)

// Fakes for GetChanges' tests: a scripted source, an in-memory sink that
// fences like a real one, a clock, and a heartbeat spy. The source, the
// sink and the spy write to one callLog, so a test sees the order of
// commits, acks and heartbeats.

const (
	testStream = "orders"
	testTablet = "t-0001"
	testAlias  = "zone1-0000000101"
)

// callLog records calls across the fakes, in order.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, fmt.Sprintf(format, args...))
}

func (l *callLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.calls...)
}

// errSourceDown is a source error the fake classifies RetrySame.
var errSourceDown = errors.New("replica unavailable")

// errMismatch is a source error the fake classifies RetryElsewhere
// (POSITION_MISMATCH: the replica lost the history the tablet needs).
var errMismatch = errors.New("position mismatch")

// errHistoryGone: the source no longer holds the history a request asks
// for (every slot past it).
var errHistoryGone = errors.New("history gone")

// pollFunc answers the n-th GetChanges of a run (from 0).
type pollFunc func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error)

// fakeSource is a Source whose every replica answers with poll.
type fakeSource struct {
	log  *callLog
	poll pollFunc
	// replicas are the test tablet's (nil: testAlias alone).
	replicas []source.Replica
	// copyOf, if set, makes the readers CopyReporters: their copy after
	// n GetChanges calls of the run.
	copyOf func(n int) *source.CopyProgress

	mu      sync.Mutex
	reqs    []source.ChangesRequest
	sent    []time.Time // when each of reqs came in (the real clock)
	readers []string    // the replica each of reqs went to
}

var _ source.Source = (*fakeSource)(nil)

func (s *fakeSource) EnsureStream(context.Context, source.StreamSpec) (source.Stream, error) {
	return source.Stream{}, nil
}
func (s *fakeSource) DeleteStream(context.Context, string) error { return nil }
func (s *fakeSource) ListTablets(context.Context) ([]source.Tablet, error) {
	replicas := s.replicas
	if replicas == nil {
		replicas = []source.Replica{{Tablet: testTablet, Alias: testAlias, Serving: true, Healthy: true}}
	}
	return []source.Tablet{{ID: testTablet, Replicas: replicas}}, nil
}
func (s *fakeSource) OpenReplica(_ context.Context, r source.Replica) (source.ReplicaReader, error) {
	if s.copyOf != nil {
		return copyReader{fakeReader{s, r.Alias}}, nil
	}
	return fakeReader{s, r.Alias}, nil
}

// copyReader is a fakeReader that reports a copy of rows (copyOf).
type copyReader struct{ fakeReader }

func (r copyReader) Copy() *source.CopyProgress {
	r.s.mu.Lock()
	n := len(r.s.reqs)
	r.s.mu.Unlock()
	return r.s.copyOf(n)
}
func (s *fakeSource) Close() error { return nil }

func (s *fakeSource) Classify(err error) source.Classification {
	if errors.Is(err, errSourceDown) {
		return source.Classification{Action: source.RetrySame, Reason: "UNAVAILABLE"}
	}
	if errors.Is(err, errMismatch) {
		return source.Classification{Action: source.RetryElsewhere, Reason: "POSITION_MISMATCH"}
	}
	if errors.Is(err, errHistoryGone) {
		return source.Classification{Action: source.Expired, Reason: "EXPIRED"}
	}
	return source.Classification{Action: source.Fatal, Reason: "UNKNOWN"}
}

// readersOf returns the replica each GetChanges request so far went to.
func (s *fakeSource) readersOf() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.readers...)
}

// requests returns the GetChanges requests so far.
func (s *fakeSource) requests() []source.ChangesRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]source.ChangesRequest(nil), s.reqs...)
}

// sentAt returns when the GetChanges requests so far came in.
func (s *fakeSource) sentAt() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.sent...)
}

type fakeReader struct {
	s     *fakeSource
	alias string
}

func (r fakeReader) GetChanges(ctx context.Context, req source.ChangesRequest) (source.Batch, error) {
	r.s.mu.Lock()
	n := len(r.s.reqs)
	r.s.reqs = append(r.s.reqs, req)
	r.s.sent = append(r.s.sent, time.Now())
	r.s.readers = append(r.s.readers, r.alias)
	r.s.mu.Unlock()
	return r.s.poll(ctx, n, req)
}

func (r fakeReader) Ack(_ context.Context, _, _ string, cp source.Checkpoint) error {
	r.s.log.add("ack %s", cp)
	return nil
}

// memSink is an in-memory sink with the contract's fencing
// (compare-and-set on the stored checkpoint) and context checks, and hooks
// to make Open or a Commit slow or fail.
type memSink struct {
	log *callLog
	// onOpen, if set, runs first in Open; its error is Open's.
	onOpen func(ctx context.Context) error
	// onCommit, if set, runs first in the n-th Commit (from 0), before the
	// compare-and-set; its error is Commit's.
	onCommit func(n int, cp source.Checkpoint) error

	mu      sync.Mutex
	stored  map[string]source.Checkpoint
	recs    map[string][]source.Record
	commits int
}

var _ sink.Sink = (*memSink)(nil)

func newMemSink(log *callLog) *memSink {
	return &memSink{log: log, stored: map[string]source.Checkpoint{}, recs: map[string][]source.Record{}}
}

// set stores cp as the tablet's checkpoint, as an earlier run or another
// writer would have.
func (s *memSink) set(tablet string, cp source.Checkpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored[tablet] = cp
}

func (s *memSink) checkpoint(tablet string) source.Checkpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stored[tablet]
}

func (s *memSink) records(tablet string) []source.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]source.Record(nil), s.recs[tablet]...)
}

func (s *memSink) Open(ctx context.Context, tablet string) (sink.TabletWriter, error) {
	if s.onOpen != nil {
		if err := s.onOpen(ctx); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log.add("open %s", tablet)
	cp := s.stored[tablet]
	return &memWriter{s: s, tablet: tablet, cp: cp, last: cp}, nil
}

func (s *memSink) Close() error { return nil }

type memWriter struct {
	s        *memSink
	tablet   string
	cp, last source.Checkpoint
	staged   []source.Record
}

func (w *memWriter) Checkpoint() source.Checkpoint { return w.cp }

func (w *memWriter) Write(ctx context.Context, recs []source.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, r := range recs {
		if r.Position.Compare(w.last) > 0 {
			w.staged = append(w.staged, r)
			w.last = r.Position
		}
	}
	return nil
}

func (w *memWriter) Commit(ctx context.Context, cp source.Checkpoint) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.s.mu.Lock()
	n := w.s.commits
	w.s.commits++
	w.s.mu.Unlock()
	if w.s.onCommit != nil {
		if err := w.s.onCommit(n, cp); err != nil {
			return err
		}
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if w.s.stored[w.tablet] != w.cp {
		return fmt.Errorf("commit %s: %w", cp, sink.ErrFenced)
	}
	w.s.recs[w.tablet] = append(w.s.recs[w.tablet], w.staged...)
	w.s.stored[w.tablet], w.cp, w.last, w.staged = cp, cp, cp, nil
	w.s.log.add("commit %s", cp)
	return nil
}

func (w *memWriter) Close() error { return nil }

// fakeClock is the activities' clock; end moves it past any run's end.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (c *fakeClock) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(1000 * time.Hour)
}

// heartbeatSpy is a worker interceptor that sees every heartbeat the
// activity records (the SDK batches what it sends to the server, so the
// environment's heartbeat listener sees only some).
type heartbeatSpy struct {
	interceptor.WorkerInterceptorBase
	log *callLog

	mu    sync.Mutex
	beats []recordedBeat
}

type recordedBeat struct {
	at time.Time
	hb Heartbeat
}

func (s *heartbeatSpy) heartbeats() []recordedBeat {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]recordedBeat(nil), s.beats...)
}

func (s *heartbeatSpy) InterceptActivity(_ context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	in := &spyInbound{spy: s}
	in.Next = next
	return in
}

type spyInbound struct {
	interceptor.ActivityInboundInterceptorBase
	spy *heartbeatSpy
}

func (i *spyInbound) Init(outbound interceptor.ActivityOutboundInterceptor) error {
	out := &spyOutbound{spy: i.spy}
	out.Next = outbound
	return i.Next.Init(out)
}

type spyOutbound struct {
	interceptor.ActivityOutboundInterceptorBase
	spy *heartbeatSpy
}

func (o *spyOutbound) RecordHeartbeat(ctx context.Context, details ...any) {
	if len(details) == 1 {
		if hb, ok := details[0].(Heartbeat); ok {
			o.spy.mu.Lock()
			o.spy.beats = append(o.spy.beats, recordedBeat{at: time.Now(), hb: hb})
			o.spy.mu.Unlock()
			o.spy.log.add("heartbeat %s", hb.Checkpoint)
		}
	}
	o.Next.RecordHeartbeat(ctx, details...)
}

// rig is one GetChanges under test: its fakes and its Activities.
type rig struct {
	t     *testing.T
	log   *callLog
	src   *fakeSource
	snk   sink.Sink // what the activity writes to; mem unless a test swaps it
	mem   *memSink
	clock *fakeClock
	spy   *heartbeatSpy
	a     *Activities
}

func newRig(t *testing.T) *rig {
	log := &callLog{}
	r := &rig{t: t, log: log, src: &fakeSource{log: log}, mem: newMemSink(log),
		clock: &fakeClock{t: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}, spy: &heartbeatSpy{log: log}}
	r.snk = r.mem
	r.src.poll = func(_ context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
		t.Errorf("unexpected poll %d from %s", n, req.From)
		return source.Batch{}, errSourceDown
	}
	res := &Resources{
		NewSource: func(config.Source) (source.Source, error) { return r.src, nil },
		NewSink:   func(config.Sink, string) (sink.Sink, error) { return r.snk, nil },
	}
	// The fake clock ends runs without waking anything: look often.
	r.a = &Activities{Resources: res, Now: r.clock.now, RecheckEvery: 10 * time.Millisecond}
	return r
}

// outcome is what a GetChanges run returned.
type outcome struct {
	res GetChangesResult
	err error
}

// start runs GetChanges like run, in the background; its outcome comes
// on the channel.
func (r *rig) start(in GetChangesInput) <-chan outcome {
	done := make(chan outcome, 1)
	go func() {
		res, err := r.run(r.activityEnv(context.Background()), in)
		done <- outcome{res, err}
	}()
	return done
}

// runWithin runs GetChanges like run, failing the test with why if it
// does not return within 30 s.
func (r *rig) runWithin(t *testing.T, in GetChangesInput, why string) (GetChangesResult, error) {
	t.Helper()
	done := r.start(in)
	select {
	case o := <-done:
		return o.res, o.err
	case <-time.After(30 * time.Second):
		t.Fatal(why)
		return GetChangesResult{}, nil
	}
}

// script makes the source hand out batches in turn; the poll after the
// last one (the poller reads a batch ahead of the commits) ends the run —
// it moves the clock past the run's end — and waits, as a long poll on a
// quiet tablet would, until the activity stops it.
func (r *rig) script(batches ...source.Batch) {
	r.src.poll = func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
		if n >= len(batches) {
			r.clock.end()
			<-ctx.Done()
			return source.Batch{}, ctx.Err()
		}
		return batches[n], nil
	}
}

// batch is the test tablet's records 1.from to 1.to, checkpoint 1.to,
// caught up.
func batch(from, to uint64) source.Batch {
	return source.Batch{Records: sinktest.Records(testTablet, from, to), Checkpoint: cp(to), CaughtUp: true}
}

// cp is the checkpoint 1.i.
func cp(i uint64) source.Checkpoint { return source.Checkpoint{Term: 1, Index: i} }

// input is a run of the test tablet from in.Checkpoint zero.
func input() GetChangesInput {
	return GetChangesInput{
		Stream: testStream, Tablet: testTablet,
		Source:  config.Source{Kind: "fake"},
		Sink:    config.Sink{Kind: "fake"},
		Replica: source.Replica{Tablet: testTablet, Alias: testAlias, Serving: true, Healthy: true},
		// Three records a read, as batch() makes them in the tests: each
		// read full, so none lingers or joins another in a commit.
		Batch:  config.Batch{MaxRecords: 3, MaxWait: config.Duration(10 * time.Millisecond)},
		RunFor: config.Duration(time.Hour),
	}
}
