package sinktest_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
)

// TestSuiteOnLockFreeSink runs the suite on memSink, a reference sink with
// no lock and only the compare-and-set, so the suite's lock-free branches
// (a second writer that opens and is fenced at Commit, crash by Close) are
// exercised too; the JSONL adapter takes the locked branches.
func TestSuiteOnLockFreeSink(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		st := &memStore{tablets: map[string]*memTablet{}}
		return sinktest.Harness{
			Open: func(t *testing.T) sink.Sink { return &memSink{st: st} },
			Read: func(t *testing.T) map[string][]source.Record {
				st.mu.Lock()
				defer st.mu.Unlock()
				out := map[string][]source.Record{}
				for id, tb := range st.tablets {
					out[id] = slices.Clone(tb.recs)
				}
				return out
			},
			Tamper: func(t *testing.T, tablet string, cp source.Checkpoint) {
				st.mu.Lock()
				defer st.mu.Unlock()
				st.tablet(tablet).cp = cp
			},
			Corrupt: func(t *testing.T, tablet string) {
				st.mu.Lock()
				defer st.mu.Unlock()
				st.tablet(tablet).corrupt = true
			},
		}
	})
}

// memStore is the storage memSinks share, like a database.
type memStore struct {
	mu      sync.Mutex
	tablets map[string]*memTablet
}

type memTablet struct {
	cp      source.Checkpoint
	recs    []source.Record
	corrupt bool
}

func (st *memStore) tablet(id string) *memTablet {
	if st.tablets[id] == nil {
		st.tablets[id] = &memTablet{}
	}
	return st.tablets[id]
}

type memSink struct {
	st     *memStore
	mu     sync.Mutex
	closed bool
}

func (s *memSink) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *memSink) Open(_ context.Context, tablet string) (sink.TabletWriter, error) {
	if s.isClosed() {
		return nil, sink.ErrClosed
	}
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	tb := s.st.tablet(tablet)
	if tb.corrupt {
		return nil, sink.ErrCorrupt
	}
	return &memWriter{s: s, tablet: tablet, cp: tb.cp, last: tb.cp}, nil
}

func (s *memSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

type memWriter struct {
	s        *memSink
	tablet   string
	cp, last source.Checkpoint
	staged   []source.Record
	err      error
}

func (w *memWriter) Checkpoint() source.Checkpoint { return w.cp }

func (w *memWriter) check() error {
	if w.s.isClosed() {
		return sink.ErrClosed
	}
	return w.err
}

func (w *memWriter) Write(_ context.Context, recs []source.Record) error {
	if err := w.check(); err != nil {
		return err
	}
	staged, last := len(w.staged), w.last
	for _, r := range recs {
		if r.Position.Compare(w.last) <= 0 {
			continue
		}
		if r.Tablet != w.tablet {
			w.staged, w.last = w.staged[:staged], last
			return sink.ErrBadRecord
		}
		w.staged = append(w.staged, r)
		w.last = r.Position
	}
	return nil
}

func (w *memWriter) Commit(_ context.Context, cp source.Checkpoint) error {
	if err := w.check(); err != nil {
		return err
	}
	if cp.Compare(w.last) < 0 {
		return sink.ErrBadCommit
	}
	w.s.st.mu.Lock()
	defer w.s.st.mu.Unlock()
	tb := w.s.st.tablet(w.tablet)
	if tb.cp != w.cp {
		w.err = sink.ErrFenced
		return w.err
	}
	tb.recs = append(tb.recs, w.staged...)
	tb.cp, w.cp, w.last, w.staged = cp, cp, cp, nil
	return nil
}

func (w *memWriter) Close() error {
	w.err, w.staged = sink.ErrClosed, nil
	return nil
}
