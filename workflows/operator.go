package workflows

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/config"
)

// operatorCommand decodes, validates and (when apply is set) carries out
// one operator command. Validation never changes state, so the same
// function serves an update's validator, its handler, and the signal.
type operatorCommand func(s *stream, ctx workflow.Context, raw json.RawMessage, apply bool) error

var operatorCommands = map[string]operatorCommand{
	CmdExclude:        (*stream).exclude,
	CmdInclude:        (*stream).include,
	CmdPause:          pauseResume(CmdPause),
	CmdResume:         pauseResume(CmdResume),
	CmdRetry:          (*stream).retry,
	CmdStop:           (*stream).stopStream,
	CmdConfigure:      (*stream).configure,
	CmdResync:         (*stream).resync,
	CmdSnapshot:       (*stream).snapshot,
	CmdSnapshotCancel: (*stream).snapshotCancel,
}

// registerOperatorCommands sets an update handler (with its validator) for
// every command, and returns the signal channels of the signal commands.
func (s *stream) registerOperatorCommands(ctx workflow.Context) (map[string]workflow.ReceiveChannel, error) {
	signals := map[string]workflow.ReceiveChannel{}
	for _, name := range append(slices.Clone(SignalCommands), CmdConfigure) {
		cmd := operatorCommands[name]
		err := workflow.SetUpdateHandlerWithOptions(ctx, name,
			func(ctx workflow.Context, raw json.RawMessage) error { return cmd(s, ctx, raw, true) },
			workflow.UpdateHandlerOptions{
				Validator: func(ctx workflow.Context, raw json.RawMessage) error {
					if err := checkUpdateBounds(name, raw); err != nil {
						return err
					}
					return cmd(s, ctx, raw, false)
				},
				Description: "operator command " + name + " (also a signal, except configure)",
			})
		if err != nil {
			return nil, err
		}
		if name != CmdConfigure {
			signals[name] = workflow.GetSignalChannel(ctx, name)
		}
	}
	return signals, nil
}

// Bounds on what an operator sends, so that no command can grow the
// stream's state (its memo, its continue-as-new input) toward the server's
// 2 MB payload limit. An update over a bound is refused with the error; a
// signal's reason is cut to maxReasonBytes (refusing it would change which
// commands a recorded history issues), and a rejection's reason, which can
// quote the payload, to maxRejectedReasonBytes.
const (
	maxUpdateBytes         = 16 << 10
	maxReasonBytes         = 1 << 10
	maxRejectedReasonBytes = 512
)

// checkUpdateBounds refuses an update over the bounds.
func checkUpdateBounds(name string, raw json.RawMessage) error {
	if len(raw) > maxUpdateBytes {
		return fmt.Errorf("payload: %d bytes, at most %d", len(raw), maxUpdateBytes)
	}
	if name == CmdExclude {
		var req ExcludeRequest
		if decodeCommand(raw, &req) == nil && len(req.Reason) > maxReasonBytes {
			return fmt.Errorf("reason: %d bytes, at most %d", len(req.Reason), maxReasonBytes)
		}
	}
	return nil
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// onSignal carries out a signalled command; a bad payload is rejected:
// logged and shown in the status, never a failed workflow. A payload over
// maxUpdateBytes is rejected as an update's is (changeBoundedCommands).
func (s *stream) onSignal(ctx workflow.Context, name string, raw json.RawMessage) {
	if len(raw) > maxUpdateBytes && s.boundedCommands(ctx) {
		s.reject(ctx, name, fmt.Sprintf("payload: %d bytes, at most %d", len(raw), maxUpdateBytes))
		return
	}
	if err := operatorCommands[name](s, ctx, raw, false); err != nil {
		s.reject(ctx, name, err.Error())
		return
	}
	if err := operatorCommands[name](s, ctx, raw, true); err != nil {
		s.reject(ctx, name, err.Error())
	}
}

func decodeCommand(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		raw = json.RawMessage("{}") // the CLI's signal without --input
	}
	return config.DecodeStrict(raw, v)
}

func (s *stream) exclude(ctx workflow.Context, raw json.RawMessage, apply bool) error {
	var req ExcludeRequest
	if err := decodeCommand(raw, &req); err != nil {
		return err
	}
	if err := validateAliases(req.Aliases, s.st.Aliases); err != nil {
		return err
	}
	if req.Tablet != "" && s.st.Tablets[req.Tablet] == nil {
		return fmt.Errorf("tablet: unknown tablet %q", req.Tablet)
	}
	if req.TTL < 0 {
		return fmt.Errorf("ttl: must not be negative")
	}
	if !apply {
		return nil
	}
	reason := truncate(req.Reason, maxReasonBytes)
	if reason == "" {
		reason = "excluded by the operator"
	}
	req.Aliases = unique(req.Aliases)
	expires := expiry(workflow.Now(ctx), req.TTL)
	for _, alias := range req.Aliases {
		s.st.Exclude = s.st.Exclude.Add(config.Exclusion{Alias: alias, Tablet: req.Tablet, Reason: reason, TTL: req.TTL, Expires: expires})
	}
	s.log.Info("replicas excluded", "aliases", req.Aliases, "tablet", req.Tablet, "reason", reason)
	s.publishExclusions(ctx)
	// No fan-out: the picker reads the list, and each worker's exclusion
	// watcher moves running reads off these replicas.
	return nil
}

func (s *stream) include(ctx workflow.Context, raw json.RawMessage, apply bool) error {
	var req IncludeRequest
	if err := decodeCommand(raw, &req); err != nil {
		return err
	}
	if err := validateAliases(req.Aliases, s.st.Aliases); err != nil {
		return err
	}
	if !apply {
		return nil
	}
	aliases := unique(req.Aliases)
	lifted := slices.DeleteFunc(slices.Clone(s.st.Exclude), func(e config.Exclusion) bool { return !slices.Contains(aliases, e.Alias) })
	s.st.Exclude = s.st.Exclude.Remove(aliases...)
	s.publishExclusions(ctx)
	// Tablets holding automatic entries for the aliases drop them; tablets
	// waiting for an eligible replica look again. Each is told only the
	// aliases that concern it: its own entries, and the operator's it
	// lifts that applied to it (which the tablet's start-time copy of the
	// operator list may hold), not the request's whole list once per
	// tablet.
	var ids []string
	concern := map[string][]string{}
	for _, id := range s.tabletIDs() {
		t := s.st.Tablets[id]
		var mine []string
		for _, e := range t.Excluded {
			if slices.Contains(aliases, e.Alias) {
				mine = append(mine, e.Alias)
			}
		}
		if t.State != NoEligibleReplica && len(mine) == 0 {
			continue
		}
		for _, e := range lifted {
			if e.Tablet == "" || e.Tablet == id {
				mine = append(mine, e.Alias)
			}
		}
		slices.Sort(mine)
		ids, concern[id] = append(ids, id), slices.Compact(mine)
	}
	s.tellEach(ctx, ids, func(id string) TabletCommand { return TabletCommand{Kind: CmdInclude, Aliases: concern[id]} })
	return nil
}

func pauseResume(kind string) operatorCommand {
	return func(s *stream, ctx workflow.Context, raw json.RawMessage, apply bool) error {
		var req TabletsRequest
		if err := decodeCommand(raw, &req); err != nil {
			return err
		}
		if err := validateTablets(req.Tablets, s.st.Tablets); err != nil {
			return err
		}
		if !apply {
			return nil
		}
		ids := s.named(ctx, req.Tablets)
		if len(ids) == 0 {
			ids = s.live()
		}
		// The intent is kept (changeOperatorIntents): a tablet that
		// starts or restarts later gets it with its start, and one whose
		// report contradicts it is told again.
		switch {
		case kind == CmdPause:
			s.setPaused(true, ids...)
		case len(req.Tablets) == 0:
			s.st.Paused = nil
		default:
			s.setPaused(false, ids...)
		}
		s.tell(ctx, ids, TabletCommand{Kind: kind})
		return nil
	}
}

func (s *stream) retry(ctx workflow.Context, raw json.RawMessage, apply bool) error {
	var req TabletsRequest
	if err := decodeCommand(raw, &req); err != nil {
		return err
	}
	if err := validateTablets(req.Tablets, s.st.Tablets); err != nil {
		return err
	}
	if s.st.Stop != nil {
		return fmt.Errorf("the stream is stopping; retry restarts tablets of a running stream")
	}
	for _, id := range req.Tablets {
		if st := s.st.Tablets[id].State; st != Failed {
			return fmt.Errorf("tablets: %s is %s; retry restarts Failed tablets", id, st)
		}
	}
	if !apply {
		return nil
	}
	ids := s.named(ctx, req.Tablets)
	if len(ids) == 0 {
		for _, id := range s.tabletIDs() {
			if s.st.Tablets[id].State == Failed {
				ids = append(ids, id)
			}
		}
	}
	// A Failed tablet's workflow has ended; a new one resumes from its
	// checkpoint (and the sink's, whichever is later), keeping its
	// counters and its own start (so a sink that lost data is still
	// caught, not read on from the checkpoint).
	for _, id := range ids {
		old := s.st.Tablets[id]
		row := &TabletStatus{ID: id, State: Starting, Checkpoint: old.Checkpoint, Start: old.Start,
			Records: old.Records, Batches: old.Batches, Restarts: old.Restarts, Seq: old.Seq, Reason: "retried by the operator"}
		s.st.Tablets[id] = row
		s.startChildren(ctx, []childStart{{id: id, start: old.Start, retry: true,
			state: &TabletState{Status: *row, Checkpoint: old.Checkpoint, Intents: true, Pause: s.intentOf(id).pause}}})
	}
	return nil
}

func (s *stream) stopStream(ctx workflow.Context, raw json.RawMessage, apply bool) error {
	var req StopRequest
	if err := decodeCommand(raw, &req); err != nil {
		return err
	}
	if s.st.Stop != nil {
		return fmt.Errorf("the stream is already stopping")
	}
	if !apply {
		return nil
	}
	s.st.Stop = &req
	s.tell(ctx, s.live(), TabletCommand{Kind: CmdStop})
	return nil
}

func (s *stream) configure(ctx workflow.Context, raw json.RawMessage, apply bool) error {
	// Decoded onto a deep copy of the live tunables: decoding straight onto
	// them would write through their shared slices, so even a rejected
	// update would change the stream.
	cur, err := cloneTunables(s.cfg.Tunables())
	if err != nil {
		return err
	}
	req, err := decodeConfigure(raw, cur)
	if err != nil {
		return err
	}
	t := req.Tunables
	added, removed, err := s.checkTablesChange(req)
	if err != nil {
		return err
	}
	if !apply {
		// The validator: a new update is checked with today's rules. The
		// handler below runs only for accepted ones, also on replay, where
		// an update accepted by an older rule must apply as it did.
		return t.ValidateChange()
	}
	if err := t.Validate(); err != nil {
		return err
	}
	if req.Source != nil {
		if len(added)+len(removed) > 0 || s.tablesChanging() {
			if err := s.changeTables(ctx, req, added, removed); err != nil {
				return err
			}
		}
		if sameTunables(t, s.cfg.Tunables()) {
			return nil // the tablets have these already
		}
	}
	s.st.Tunables = &t
	s.applyTunables()
	s.tell(ctx, s.live(), TabletCommand{Kind: CmdConfigure, Tunables: &t})
	return nil
}

// cloneTunables returns a copy of t that shares no memory with it.
func cloneTunables(t config.Tunables) (config.Tunables, error) {
	var out config.Tunables
	b, err := json.Marshal(t)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	return out, err
}

// sameTunables reports whether a and b are the same tunables.
func sameTunables(a, b config.Tunables) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// applyTunables puts the operator's configure on top of the config.
func (s *stream) applyTunables() {
	if t := s.st.Tunables; t != nil {
		s.cfg.Selection, s.cfg.Retry, s.cfg.AutoExcludeTTL, s.cfg.Batch, s.cfg.Run = t.Selection, t.Retry, t.AutoExcludeTTL, t.Batch, t.Run
	}
}

// terminal states: the tablet's workflow has ended.
func terminal(st State) bool {
	return st == Split || st == Expired || st == Failed || st == Stopped || st == Resyncing
}

// live returns the tablets whose workflows run, sorted.
func (s *stream) live() []string {
	var ids []string
	for _, id := range s.tabletIDs() {
		if !terminal(s.st.Tablets[id].State) {
			ids = append(ids, id)
		}
	}
	return ids
}

func (s *stream) tabletIDs() []string {
	ids := make([]string, 0, len(s.st.Tablets))
	for id := range s.st.Tablets {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// fanOutWave is how many signals tell has in flight at once: well under
// the server's limit of pending signals per workflow (2000 by default).
const fanOutWave = 500

// tell signals a command to tablets, in waves; a tablet whose workflow has
// closed is skipped (its last report says why, or the stream's reconcile
// restarts it with the operator's intents), and so is one whose start the
// stream has not heard of yet (changeOperatorIntents: it is told what it
// is owed once it runs, see onStarted).
func (s *stream) tell(ctx workflow.Context, ids []string, cmd TabletCommand) {
	s.tellEach(ctx, ids, func(string) TabletCommand { return cmd })
}

// tellEach is tell with each tablet's own command, cmdOf(id).
func (s *stream) tellEach(ctx workflow.Context, ids []string, cmdOf func(id string) TabletCommand) {
	wave := len(ids)
	if s.durable() {
		wave = fanOutWave
	}
	if len(s.pending) > 0 {
		ids = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return s.pending[id] != nil })
	}
	for len(ids) > 0 {
		n := min(wave, len(ids))
		futs := make([]workflow.Future, 0, n)
		for _, id := range ids[:n] {
			futs = append(futs, workflow.SignalExternalWorkflow(ctx, TabletWorkflowID(s.id, id), "", SignalTabletCommand, cmdOf(id)))
		}
		for i, f := range futs {
			if err := f.Get(ctx, nil); err != nil {
				s.log.Warn("tablet command not delivered", "tablet", ids[i], "command", cmdOf(ids[i]).Kind, "error", err)
			}
		}
		ids = ids[n:]
	}
}

// publishExclusions puts a changed operator exclude list in the memo at
// once (changeExclusionsMemo), not after the main loop's next wake-up:
// an update handler does not wake it.
func (s *stream) publishExclusions(ctx workflow.Context) {
	if s.exclusionsMemo {
		s.details(ctx)
	}
}

// nextExpiry is when the next operator exclusion ends (zero: none). An
// entry already past its expiry counts until onExpiry prunes it, so its
// timer (of zero length) still fires.
func (s *stream) nextExpiry() time.Time { return s.st.Exclude.NextExpiry() }

// onExpiry drops ended exclusions and lets waiting tablets look again.
func (s *stream) onExpiry(ctx workflow.Context) {
	now := workflow.Now(ctx)
	s.st.Exclude = s.st.Exclude.Live(now)
	s.publishExclusions(ctx)
	var waiting []string
	for _, id := range s.tabletIDs() {
		if s.st.Tablets[id].State == NoEligibleReplica {
			waiting = append(waiting, id)
		}
	}
	s.tell(ctx, waiting, TabletCommand{Kind: CmdRecheck})
}

// unique returns list without its repeats, in the order of their first
// appearance.
func unique(list []string) []string {
	seen := make(map[string]bool, len(list))
	out := make([]string, 0, len(list))
	for _, v := range list {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// named is a command's list of tablets without its repeats
// (changeBoundedCommands): a tablet named twice is told, or restarted,
// once. Before that change each name was carried out: a pause naming one
// tablet 30,000 times signalled it 30,000 times.
func (s *stream) named(ctx workflow.Context, ids []string) []string {
	if u := unique(ids); len(u) < len(ids) && s.boundedCommands(ctx) {
		return u
	}
	return ids
}

// boundedCommands reports whether the stream bounds what one command can
// cost it (changeBoundedCommands). Asked for only by a command that the
// change treats otherwise: one naming a tablet twice, or a signal over
// maxUpdateBytes.
func (s *stream) boundedCommands(ctx workflow.Context) bool {
	if s.bounded == nil {
		v := workflow.GetVersion(ctx, changeBoundedCommands, workflow.DefaultVersion, 1) >= 1
		s.bounded = &v
	}
	return *s.bounded
}
