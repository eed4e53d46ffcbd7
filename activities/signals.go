package activities

import (
	"context"

	"go.temporal.io/sdk/activity"
	"go.uber.org/zap"
)

// signals sends a GetChanges run's progress signals to its tablet
// workflow, in order, off the read path: a signal is a round trip through
// the server that takes seconds when an exclusion moves hundreds of
// tablets at once, and the run reads and commits meanwhile. The run closes
// it before it returns, so its signals still reach the workflow before its
// result does.
type signals struct {
	ch   chan Progress
	done chan struct{}
	log  *zap.Logger
}

// signalQueue bounds the signals waiting to be sent: a run sends a handful
// (retrying, streaming, each move in place).
const signalQueue = 16

func (a *Activities) startSignals(ctx context.Context, info activity.Info) *signals {
	s := &signals{ch: make(chan Progress, signalQueue), done: make(chan struct{}), log: a.logger()}
	go func() {
		defer close(s.done)
		for p := range s.ch {
			a.signal(ctx, info, p)
		}
	}()
	return s
}

// send queues p; if the queue is full (the server has not taken the last
// signalQueue signals), p is dropped with a warning: progress signals are
// best effort, and the heartbeat and the result carry the same facts.
func (s *signals) send(p Progress) {
	select {
	case s.ch <- p:
	default:
		s.log.Warn("progress signal dropped: the queue is full", zap.String("state", p.State))
	}
}

// close waits until the queued signals are sent (each bounded by its
// timeout).
func (s *signals) close() {
	close(s.ch)
	<-s.done
}
