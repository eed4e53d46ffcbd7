package activities

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.temporal.io/sdk/converter"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/config"
)

// Watcher is a worker's exclusion watcher. Cancellation reaches an
// activity only through a heartbeat, and fast heartbeats for thousands of
// tablets overload the server; so while a stream has a GetChanges running
// on this worker, the watcher reads the stream's exclude list once per
// interval (one describe or query per stream, however many tablets; see
// read; more often for a stream with many tablets here, see intervalFor),
// and each GetChanges checks it at every batch boundary.
type Watcher struct {
	Client   WorkflowClient
	Interval time.Duration
	// QueryTimeout bounds one query (default DefaultQueryTimeout). It is
	// longer than the interval: a stream busy with its tablets' reports
	// may take seconds to answer, and an answer late is still an answer
	// for the pickers waiting on it; the next query follows at once.
	QueryTimeout time.Duration
	Logger       *zap.Logger
	// DataConverter decodes the stream's memo as the client does (with
	// payload encryption, its codec); nil: the default.
	DataConverter converter.DataConverter

	mu      sync.Mutex
	streams map[string]*watched
	// last keeps the list as last read of a stream no longer watched
	// here (all its tablets paused, say), for LastRead.
	last map[string]config.ExcludeList
}

type watched struct {
	refs    int
	list    config.ExcludeList
	read    time.Time     // when list was last read
	changed chan struct{} // closed (and replaced) when a read finds list changed
	tried   chan struct{} // closed (and replaced) after each query, answered or not
	lastErr error         // the last query's error (nil: answered)
	stop    context.CancelFunc
	stopped chan struct{}
}

// Watch starts watching a stream's exclude list (if this worker is not
// already) and returns the function that ends this caller's interest.
func (w *Watcher) Watch(stream string) (release func()) {
	if w == nil || w.Client == nil {
		return func() {}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.streams == nil {
		w.streams = map[string]*watched{}
	}
	s := w.streams[stream]
	if s == nil {
		ctx, cancel := context.WithCancel(context.Background())
		s = &watched{stop: cancel, stopped: make(chan struct{}), changed: make(chan struct{}), tried: make(chan struct{})}
		w.streams[stream] = s
		go w.poll(ctx, stream, s)
	}
	s.refs++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if s.refs--; s.refs == 0 {
			s.stop()
			delete(w.streams, stream)
			if !s.read.IsZero() {
				if w.last == nil {
					w.last = map[string]config.ExcludeList{}
				}
				w.last[stream] = s.list
			}
		}
	}
}

// Excluded reports whether the stream's operator list, as last read,
// excludes alias on tablet now.
func (w *Watcher) Excluded(stream, tablet, alias string, now time.Time) (config.Exclusion, bool) {
	if w == nil {
		return config.Exclusion{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.streams[stream]
	if s == nil {
		return config.Exclusion{}, false
	}
	return s.list.Excludes(alias, tablet, now)
}

// Changed returns a channel closed when the stream's list, as read, next
// changes (nil, which never fires, when the stream is not watched here):
// a GetChanges waiting for a read wakes to check Excluded at once.
func (w *Watcher) Changed(stream string) <-chan struct{} {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.streams[stream]; s != nil {
		return s.changed
	}
	return nil
}

// DefaultQueryTimeout is the Watcher's QueryTimeout when unset: under the
// tablet picker's 10 s local-activity timeout, with room for a retry.
const DefaultQueryTimeout = 5 * time.Second

func (w *Watcher) queryTimeout() time.Duration {
	if w.QueryTimeout <= 0 {
		return max(DefaultQueryTimeout, w.interval())
	}
	return w.QueryTimeout
}

func (w *Watcher) interval() time.Duration {
	if w.Interval <= 0 {
		return time.Second
	}
	return w.Interval
}

// Watched returns the stream's operator exclude list as last read if this
// worker is watching the stream now (a GetChanges of it runs here) and has
// read the list: whatever changes next, the watcher's next read wakes the
// GetChanges it concerns.
func (w *Watcher) Watched(stream string) (config.ExcludeList, bool) {
	if w == nil {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.streams[stream]
	if s == nil || s.read.IsZero() {
		return nil, false
	}
	return slices.Clone(s.list), true
}

// LastRead returns the stream's operator exclude list as this worker last
// read it, however long ago (ok false: never read here).
func (w *Watcher) LastRead(stream string) (list config.ExcludeList, ok bool) {
	if w == nil {
		return nil, false
	}
	if list, ok := w.Watched(stream); ok {
		return list, true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	list, ok = w.last[stream]
	return slices.Clone(list), ok
}

// Exclusions waits for the watcher's next query of the stream's operator
// exclude list (watching the stream meanwhile) and returns its answer or
// its error. Every caller waiting meanwhile shares that one query: when a
// stream's tablets all pick a replica at once (a resume, a worker start),
// they do not send one each, which would pile up on the stream workflow
// (and time the pickers out). A caller that can use the list as already
// read asks Watched first.
func (w *Watcher) Exclusions(ctx context.Context, stream string) (config.ExcludeList, error) {
	release := w.Watch(stream)
	defer release()
	w.mu.Lock()
	s := w.streams[stream]
	tried := s.tried
	w.mu.Unlock()
	select {
	case <-tried:
	case <-ctx.Done():
		return nil, fmt.Errorf("query the stream's exclude list: %w", ctx.Err())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if s.lastErr != nil {
		return nil, fmt.Errorf("query the stream's exclude list: %w", s.lastErr)
	}
	return slices.Clone(s.list), nil
}

// MemoExclusions is the stream workflow's memo field that holds its
// operator exclude list (a config.ExcludeList), from
// changeExclusionsMemo on.
const MemoExclusions = "exclusions"

func (w *Watcher) dataConverter() converter.DataConverter {
	if w.DataConverter != nil {
		return w.DataConverter
	}
	return converter.GetDefaultDataConverter()
}

// read reads a stream's operator exclude list: from the stream's memo
// when it has one there (a describe is served by the server alone, so a
// stream too busy with its tablets' reports to answer a query — "workflow
// is busy" — is still read at once), else with the QueryExclusions query.
func (w *Watcher) read(ctx context.Context, stream string) (config.ExcludeList, error) {
	if d, ok := w.Client.(WorkflowDescriber); ok {
		desc, err := d.DescribeWorkflow(ctx, stream, "")
		if err == nil && desc.Memo != nil {
			if p, ok := desc.Memo.GetFields()[MemoExclusions]; ok {
				var list config.ExcludeList
				if err := w.dataConverter().FromPayload(p, &list); err == nil {
					return list, nil
				}
			}
		}
	}
	v, err := w.Client.QueryWorkflow(ctx, stream, "", QueryExclusions)
	if err != nil {
		return nil, err
	}
	var list config.ExcludeList
	return list, v.Get(&list)
}

// ManyTablets is the number of a stream's GetChanges on one worker from
// which its watcher reads the stream more often than once an Interval.
const ManyTablets = 16

// intervalFor is the time between the starts of two reads of a stream
// with refs GetChanges on this worker: Interval up to ManyTablets, then
// shorter in proportion down to a quarter of it (a quarter second at 64
// tablets and more). A read costs one describe however many tablets it
// serves, while an exclusion's reaction waits for it on top of the
// stream taking the signal and the tablets' moves, which take longer the
// more tablets there are: at 256 tablets the three made 2.6 s in the
// worst of 20 trials (the stream 0.66 s of it).
func (w *Watcher) intervalFor(refs int) time.Duration {
	every := w.interval()
	if refs <= ManyTablets {
		return every
	}
	return max(every/4, every*ManyTablets/time.Duration(refs))
}

func (w *Watcher) poll(ctx context.Context, stream string, s *watched) {
	defer close(s.stopped)
	for {
		began := time.Now()
		qctx, cancel := context.WithTimeout(ctx, w.queryTimeout())
		list, err := w.read(qctx, stream)
		cancel()
		w.mu.Lock()
		if err == nil {
			if !slices.Equal(s.list, list) {
				close(s.changed)
				s.changed = make(chan struct{})
			}
			s.list, s.read = list, time.Now()
		}
		s.lastErr = err
		close(s.tried)
		s.tried = make(chan struct{})
		// A read that took longer than the interval is followed at once.
		next := time.NewTimer(time.Until(began.Add(w.intervalFor(s.refs))))
		w.mu.Unlock()
		if err != nil && ctx.Err() == nil && w.Logger != nil {
			w.Logger.Debug("exclusion watcher: query failed", zap.String("stream", stream), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			next.Stop()
			return
		case <-next.C:
		}
	}
}
