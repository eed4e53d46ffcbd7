package workflows

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
)

// A running stream changes the tables it reads with the configure
// command's source.tables (a source kind with TableChange). The change is
// made at the source first (the SetTables activity, beside the loop: for
// PostgreSQL the publication and the stream's record on every shard's
// primary, in one transaction each), so that no reader ever checks its
// publication against a list it does not publish yet; only then does the
// stream read the new list (s.cfg.Source, which the snapshot command and
// new tablets use). Tables added are then backfilled by an ad-hoc
// snapshot of them on every running tablet (their changes flow from the
// source's change on; the snapshot brings the rows from before). Tables
// removed flow no more from the source's change on; what the sink holds
// of them stays. StreamState.TablesChange records the last change, and
// the status shows it.

// SourceChange is the source part of a configure: the tables the stream
// reads from then on.
type SourceChange struct {
	Tables []string `json:"tables"`
}

// ConfigureRequest is the configure update's payload: the tunables'
// fields (a field left out keeps its value) and, optionally, "source"
// with the tables the stream reads and "reason", recorded with a change
// of tables.
type ConfigureRequest struct {
	Tunables config.Tunables `json:"-"`
	Source   *SourceChange   `json:"source,omitempty"`
	Reason   string          `json:"reason,omitempty"`
}

// Tables change states.
const (
	TablesPublishing = "Publishing"
	TablesDone       = "Done"
	TablesFailed     = "Failed"
)

// TablesChange is a change of the tables a stream reads.
type TablesChange struct {
	ID string `json:"id"`
	// From are the tables read before; Tables the ones asked for.
	From    []string `json:"from"`
	Tables  []string `json:"tables"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	// State: Publishing while the source is being changed (retried until
	// it is), Done once it is, Failed when the source refused the list
	// (nothing changed; Error says why).
	State string    `json:"state"`
	Error string    `json:"error,omitempty"`
	Asked time.Time `json:"asked"`
	Ended time.Time `json:"ended,omitzero"`
	// Backfill is the ad-hoc snapshot that copies the added tables' rows
	// (empty when none was added, or no tablet ran to copy them).
	Backfill string `json:"backfill,omitempty"`
}

// published is what a SetTables activity came back with.
type published struct {
	ID    string `json:"id"`
	Err   string `json:"err,omitempty"`
	Fatal bool   `json:"fatal,omitempty"`
}

// tablesNow are the tables the stream reads: the last change's when it is
// done, else the ones it changed from (s.cfg's before any change).
func (s *stream) tablesNow() []string {
	switch tc := s.st.TablesChange; {
	case tc == nil:
		return s.cfg.Source.Tables
	case tc.State == TablesDone:
		return tc.Tables
	default:
		return tc.From
	}
}

// applyTables makes s.cfg's source read tablesNow (the config a run
// starts with is the stream's first).
func (s *stream) applyTables() {
	if s.st.TablesChange == nil {
		return
	}
	src, err := s.cfg.Source.WithTables(s.tablesNow())
	if err != nil {
		s.log.Error("the source's tables could not be applied", "error", err)
		return
	}
	s.cfg.Source = src
}

// checkTablesChange validates the source part of a configure: nil when
// there is none or it names the tables read now; else the change's added
// and removed tables.
func (s *stream) checkTablesChange(req ConfigureRequest) (added, removed []string, err error) {
	if req.Source == nil {
		if req.Reason != "" {
			return nil, nil, fmt.Errorf("reason: it is recorded with a change of tables (source.tables); the tunables take none")
		}
		return nil, nil, nil
	}
	now := s.tablesNow()
	tables := req.Source.Tables
	kind := config.SourceKinds()[s.cfg.Source.Kind]
	switch {
	case !kind.TableChange:
		return nil, nil, fmt.Errorf("source.tables: source kind %q cannot change the tables of a running stream", s.cfg.Source.Kind)
	case s.st.Stop != nil:
		return nil, nil, fmt.Errorf("source.tables: the stream is stopping")
	case !s.durable():
		return nil, nil, fmt.Errorf("source.tables: this stream's run predates changing tables: it takes one after its next continue-as-new")
	case len(req.Reason) > maxReasonBytes:
		return nil, nil, fmt.Errorf("reason: %d bytes, at most %d", len(req.Reason), maxReasonBytes)
	}
	sec, err := s.cfg.Source.WithTables(tables)
	if err != nil {
		return nil, nil, err
	}
	if kind.Parse != nil {
		if _, err := kind.Parse(sec.Spec); err != nil {
			return nil, nil, config.InSection("source", err)
		}
	}
	for _, t := range tables {
		if !slices.Contains(now, t) {
			added = append(added, t)
		}
	}
	for _, t := range now {
		if !slices.Contains(tables, t) {
			removed = append(removed, t)
		}
	}
	sn := s.st.Snapshot
	switch {
	case len(added) > 0 && sn != nil && sn.State == SnapshotRunning:
		return nil, nil, fmt.Errorf("source.tables: snapshot %s of %v is running, and the tables added are copied by a snapshot; wait for it or cancel it (snapshot-cancel)", sn.ID, sn.Tables)
	case len(added) > 0 && sn != nil && len(sn.Todo) > 0:
		return nil, nil, fmt.Errorf("source.tables: snapshot %s is being cancelled at the source; ask again once it is", sn.ID)
	case sn != nil && sn.State == SnapshotRunning && slices.ContainsFunc(removed, func(t string) bool { return slices.Contains(sn.Tables, t) }):
		return nil, nil, fmt.Errorf("source.tables: snapshot %s copies %v, and this removes one of them; wait for it or cancel it (snapshot-cancel)", sn.ID, sn.Tables)
	}
	return added, removed, nil
}

// tablesChanging reports whether a change of tables is being made at the
// source: a new list then replaces it, even one equal to the tables it
// changed from (which puts back the shards it changed already).
func (s *stream) tablesChanging() bool {
	tc := s.st.TablesChange
	return tc != nil && tc.State == TablesPublishing
}

// changeTables applies an accepted configure's source part: the change is
// recorded Publishing and made at the source beside the loop. One being
// made is replaced: its activity is cancelled, and its state kept no more
// (the new change is made at every shard, and the source takes the newer
// change whichever attempt comes last).
func (s *stream) changeTables(ctx workflow.Context, req ConfigureRequest, added, removed []string) error {
	if workflow.GetVersion(ctx, changeSourceTables, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return fmt.Errorf("this stream's run predates changing tables: ask again")
	}
	if s.tablesChanging() {
		s.log.Info("a change of tables replaces the one being made", "replaced", s.st.TablesChange.ID)
		if s.publishCancel != nil {
			s.publishCancel()
		}
	}
	s.st.TablesSeq++
	s.st.TablesChange = &TablesChange{
		ID: fmt.Sprintf("tables-%d", s.st.TablesSeq), From: slices.Clone(s.tablesNow()), Tables: slices.Clone(req.Source.Tables),
		Added: added, Removed: removed, Reason: req.Reason, State: TablesPublishing, Asked: workflow.Now(ctx),
	}
	s.log.Info("changing the tables the stream reads", "change", s.st.TablesChange.ID, "tables", req.Source.Tables, "added", added, "removed", removed)
	s.drivePublish(false)
	return nil
}

// drivePublish runs the SetTables activity for a change being published,
// beside the loop; later, after snapshotRetry, after one that failed
// short of a verdict.
func (s *stream) drivePublish(later bool) {
	tc := s.st.TablesChange
	if s.published == nil || s.publishBusy || tc == nil || tc.State != TablesPublishing {
		return // the loop's start drives it (or nothing to make)
	}
	s.publishBusy = true
	in := activities.SetTablesInput{Stream: s.id, Source: s.cfg.Source, Tables: slices.Clone(tc.Tables), At: tc.Asked}
	id := tc.ID
	var actCtx workflow.Context
	actCtx, s.publishCancel = workflow.WithCancel(s.loopCtx) // cancelled when a newer change replaces this one
	var a *activities.Activities
	s.besideLoop(actCtx, retryWait(later), workflow.ActivityOptions{
		StartToCloseTimeout: 5 * time.Minute, Summary: "publish the tables of " + id + " at the source",
		RetryPolicy: &temporal.RetryPolicy{MaximumInterval: 30 * time.Second, MaximumAttempts: 20, NonRetryableErrorTypes: activities.NonRetryable},
	}, a.SetTables, in, nil, func(ctx workflow.Context, err error) {
		r := published{ID: id}
		if err != nil {
			// A verdict's whole message: its cause is a bare sentinel ("a
			// table of source.tables cannot be streamed") without the
			// table it names.
			r.Err = rootMessage(err)
			if app := verdict(err); app != nil {
				r.Err, r.Fatal = app.Message(), true
			}
		}
		s.published.Send(ctx, r)
	})
}

// onPublished takes a SetTables activity's answer: the stream reads the
// new tables from then on, and backfills the ones added; a verdict
// against the list fails the change (the stream reads what it read);
// anything else is tried again later.
func (s *stream) onPublished(ctx workflow.Context, r published) {
	s.publishBusy, s.publishCancel = false, nil
	tc := s.st.TablesChange
	if tc == nil || tc.ID != r.ID || tc.State != TablesPublishing {
		s.drivePublish(false) // a change that replaced it
		return
	}
	switch {
	case r.Err != "" && !r.Fatal:
		s.log.Warn("tables: the source could not be changed yet; trying again later", "change", tc.ID, "error", r.Err)
		s.drivePublish(true)
		return
	case r.Err != "":
		s.log.Warn("tables: the source refused the change", "change", tc.ID, "error", r.Err)
		tc.State, tc.Error, tc.Ended = TablesFailed, clip(r.Err), workflow.Now(ctx)
		return
	}
	tc.State, tc.Ended = TablesDone, workflow.Now(ctx)
	s.applyTables()
	s.log.Info("the stream reads its new tables", "change", tc.ID, "tables", tc.Tables)
	if len(tc.Added) == 0 {
		return
	}
	if s.st.Stop != nil {
		s.log.Info("tables: the stream is stopping; the tables added are not backfilled", "change", tc.ID)
		return
	}
	tablets := s.live()
	if len(tablets) == 0 {
		s.log.Warn("tables: no tablet runs to copy the tables added; a resync copies every table", "change", tc.ID)
		return
	}
	tc.Backfill = s.beginSnapshot(ctx, tc.Added, tablets, "backfill of the tables added by "+tc.ID).ID
}

// decodeConfigure decodes a configure's payload: "source" and "reason"
// strictly onto theirs, the rest strictly onto the tunables t (so that
// errors name the fields as the config does).
func decodeConfigure(raw json.RawMessage, t config.Tunables) (ConfigureRequest, error) {
	req := ConfigureRequest{Tunables: t}
	if len(raw) == 0 {
		return req, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return req, decodeCommand(raw, &req.Tunables) // its error
	}
	if src, ok := fields["source"]; ok {
		delete(fields, "source")
		req.Source = &SourceChange{}
		if err := decodeCommand(src, req.Source); err != nil {
			return req, config.InSection("source", err)
		}
	}
	if reason, ok := fields["reason"]; ok {
		delete(fields, "reason")
		if err := json.Unmarshal(reason, &req.Reason); err != nil {
			return req, fmt.Errorf("reason: want a string")
		}
	}
	rest, err := json.Marshal(fields)
	if err != nil {
		return req, err
	}
	return req, decodeCommand(rest, &req.Tunables)
}
