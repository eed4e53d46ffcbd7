package workflows

import (
	"slices"

	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/config"
)

// The operator's intents (changeOperatorIntents). The stream keeps what
// the operator asked of each tablet in its state (StreamState.Stop, and
// StreamState.Paused per tablet), not only in the signals it sends: a
// tablet is told once its workflow exists, a tablet restarted or retried
// starts with the intent already applied, and a report that contradicts
// an intent has the stream tell the tablet again. So a command sent
// while hundreds of tablets are still starting reaches every one as it
// starts, and a resume sent to a paused tablet whose workflow had closed
// is not lost.

// intent is what the operator asks of one tablet: to stop (the stream's
// stop), or to hold still (pause, until a resume).
type intent struct{ stop, pause bool }

// command is the tablet command that carries i out.
func (i intent) command() string {
	switch {
	case i.stop:
		return CmdStop
	case i.pause:
		return CmdPause
	}
	return CmdResume
}

// contradictedBy reports whether a tablet that reports state st has not
// carried i out: it still runs after a stop, runs after a pause, or is
// paused after a resume. A terminal state contradicts nothing (the
// workflow has ended); nor does Starting (a started tablet reports the
// state it was given before it has taken its commands) or Stuck (the
// stream's word, never a tablet's).
func (i intent) contradictedBy(st State) bool {
	switch {
	case terminal(st) || st == Starting || st == Stuck:
		return false
	case i.stop:
		return true
	case i.pause:
		return st != Paused
	}
	return st == Paused
}

// intentOf is what the operator asks of tablet id now.
func (s *stream) intentOf(id string) intent {
	_, paused := slices.BinarySearch(s.st.Paused, id)
	return intent{stop: s.st.Stop != nil, pause: paused}
}

// setPaused records a pause (on) or a resume of the tablets ids.
func (s *stream) setPaused(on bool, ids ...string) {
	for _, id := range ids {
		i, found := slices.BinarySearch(s.st.Paused, id)
		switch {
		case on && !found:
			s.st.Paused = slices.Insert(s.st.Paused, i, id)
		case !on && found:
			s.st.Paused = slices.Delete(s.st.Paused, i, i+1)
		}
	}
}

// deriveIntents fills the pause intents of a state carried from before
// they were kept: a tablet whose row says Paused was paused by the
// operator.
func (s *stream) deriveIntents() {
	if s.st.Intents {
		return
	}
	for _, id := range s.tabletIDs() {
		if s.st.Tablets[id].State == Paused {
			s.setPaused(true, id)
		}
	}
	s.st.Intents = true
}

// keepsIntents reports whether this run tells tablets their intents as
// they start and again after a contradicting report, and starts no
// tablet workflow while stopping (changeOperatorIntents). Asked for at
// the first of those moments: a tablet start, a contradicting report, a
// closed tablet found while stopping.
func (s *stream) keepsIntents(ctx workflow.Context) bool {
	if s.intents == nil {
		v := s.durable() && workflow.GetVersion(ctx, changeOperatorIntents, workflow.DefaultVersion, 1) >= 1
		s.intents = &v
	}
	return *s.intents
}

// launches reports whether tablet workflows are started without waiting
// for their starts (changeOperatorIntents): only from the main loop.
func (s *stream) launches(ctx workflow.Context) bool {
	return s.loopCtx != nil && s.keepsIntents(ctx)
}

// pendingStart is a tablet workflow the stream asked to start and has not
// heard of yet: what its input carried of the operator's intents and
// tunables, to tell it what changed since once it runs.
type pendingStart struct {
	childStart
	carried  intent
	tunables *config.Tunables
}

// startResult is how one tablet workflow's start went.
type startResult struct {
	id  string
	err error
}

// launch asks for the children's starts and returns: a workflow goroutine
// sends how each went to s.starts, which the loop takes (onStarted), so
// commands and reports are taken meanwhile (a fan-out of hundreds of
// tablets takes a minute on a busy server).
func (s *stream) launch(children []childStart) {
	ctx := s.loopCtx
	total := len(s.st.Tablets)
	s.started += len(children)
	futs := make([]workflow.ChildWorkflowFuture, 0, len(children))
	ids := make([]string, 0, len(children))
	for _, c := range children {
		var carried intent
		if c.state != nil {
			carried = intent{stop: c.state.Stop, pause: c.state.Pause}
		}
		s.pending[c.id] = &pendingStart{childStart: c, carried: carried, tunables: s.st.Tunables}
		futs = append(futs, s.executeChild(ctx, c, total))
		ids = append(ids, c.id)
	}
	workflow.Go(ctx, func(ctx workflow.Context) {
		for i, f := range futs {
			var exec workflow.Execution
			err := f.GetChildWorkflowExecution().Get(ctx, &exec)
			s.starts.Send(ctx, startResult{id: ids[i], err: err})
		}
	})
}

// onStarted applies a tablet workflow's start: a tablet that runs now is
// owed what the operator asked of it since its input was made.
func (s *stream) onStarted(ctx workflow.Context, r startResult) {
	p := s.pending[r.id]
	if p == nil {
		return
	}
	delete(s.pending, r.id)
	if !s.afterStart(ctx, p.childStart, r.err) {
		return
	}
	if row := s.st.Tablets[r.id]; row == nil || terminal(row.State) {
		return
	}
	now := s.intentOf(r.id)
	if now != p.carried || (r.err != nil && now != (intent{})) { // an adopted workflow: its intents unknown
		s.owe(r.id)
	}
	if s.st.Tunables != p.tunables {
		s.oweTunables(r.id)
	}
}

// awaitStarts waits until the stream has heard of every start it asked
// for; it reports whether there was any.
func (s *stream) awaitStarts(ctx workflow.Context) bool {
	any := false
	for len(s.pending) > 0 {
		var r startResult
		s.starts.Receive(ctx, &r)
		s.onStarted(ctx, r)
		any = true
	}
	return any
}

// owe marks a tablet to be told its intent at the next flush.
func (s *stream) owe(id string) {
	if s.owed == nil {
		s.owed = map[string]bool{}
	}
	s.owed[id] = true
}

// oweTunables marks a tablet to be told the operator's tunables at the
// next flush.
func (s *stream) oweTunables(id string) {
	if s.owedTunables == nil {
		s.owedTunables = map[string]bool{}
	}
	s.owedTunables[id] = true
}

// flushOwed tells the tablets what they are owed, each its intent as it
// is now, in waves; it reports whether it told any. A tablet still
// starting is told once it runs (onStarted); one that has ended, never.
func (s *stream) flushOwed(ctx workflow.Context) bool {
	if len(s.owed) == 0 && len(s.owedTunables) == 0 {
		return false
	}
	owed, tunables := s.owed, s.owedTunables
	s.owed, s.owedTunables = nil, nil
	told := false
	if t := s.st.Tunables; t != nil {
		if ids := s.oweable(tunables); len(ids) > 0 {
			s.tell(ctx, ids, TabletCommand{Kind: CmdConfigure, Tunables: t})
			told = true
		}
	}
	byKind := map[string][]string{}
	for _, id := range s.oweable(owed) {
		kind := s.intentOf(id).command()
		byKind[kind] = append(byKind[kind], id)
	}
	for _, kind := range []string{CmdStop, CmdPause, CmdResume} {
		if ids := byKind[kind]; len(ids) > 0 {
			s.log.Info("telling tablets their operator's intent again", "command", kind, "tablets", len(ids))
			s.tell(ctx, ids, TabletCommand{Kind: kind})
			told = true
		}
	}
	return told
}

// oweable returns, sorted, the tablets of set whose workflows run: not
// still starting, not ended.
func (s *stream) oweable(set map[string]bool) []string {
	var ids []string
	for id := range set {
		if row := s.st.Tablets[id]; row != nil && !terminal(row.State) && s.pending[id] == nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
