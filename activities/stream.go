package activities

import (
	"context"
	"errors"
	"fmt"
	"go.temporal.io/sdk/activity"
	"math/rand/v2"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/picker"
	"github.com/tabletflow/tabletflow/source"
)

// EnsureStreamInput creates a stream's source-side stream.
type EnsureStreamInput struct {
	Stream    string        `json:"stream"`
	Source    config.Source `json:"source"`
	StartFrom string        `json:"startFrom"`
}

// EnsureStream creates the source-side stream if it does not exist; it is
// idempotent.
func (a *Activities) EnsureStream(ctx context.Context, in EnsureStreamInput) (source.Stream, error) {
	src, err := a.Resources.Source(in.Source)
	if err != nil {
		return source.Stream{}, fatalf("%v", err)
	}
	s, err := src.EnsureStream(ctx, source.StreamSpec{ID: in.Stream, Tables: in.Source.Tables, StartFrom: source.StartFrom(in.StartFrom)})
	if err != nil {
		return source.Stream{}, classified(src, err)
	}
	return s, nil
}

// DeleteStreamInput drops a stream's source-side stream.
type DeleteStreamInput struct {
	Stream string        `json:"stream"`
	Source config.Source `json:"source"`
}

// DeleteStream drops the source-side stream; deleting an absent one is not
// an error.
func (a *Activities) DeleteStream(ctx context.Context, in DeleteStreamInput) error {
	src, err := a.Resources.Source(in.Source)
	if err != nil {
		return fatalf("%v", err)
	}
	return classified(src, src.DeleteStream(ctx, in.Stream))
}

// ListTablets returns the keyspace's tablets with their replicas' health.
func (a *Activities) ListTablets(ctx context.Context, cfg config.Source) ([]source.Tablet, error) {
	src, err := a.Resources.Source(cfg)
	if err != nil {
		return nil, fatalf("%v", err)
	}
	tablets, err := src.ListTablets(ctx)
	return tablets, classified(src, err)
}

// Topology is what a stream keeps of a listing: its tablets (with their
// parents) and the aliases of their replicas. It stays small at any scale,
// where the full listing (every replica's health) passes the server's
// 2 MB payload limit at a few thousand tablets.
type Topology struct {
	Tablets []TopologyTablet `json:"tablets"`
	Aliases []string         `json:"aliases"`
	// Picks are the tablet picker's first choices by tablet ID
	// (ReadTopologyAndPick only).
	Picks map[string]Selection `json:"picks,omitempty"`
}

// TopologyTablet is a tablet in a Topology.
type TopologyTablet struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"`
}

// TopologyOf reduces a full listing to a Topology (aliases sorted, once
// each).
func TopologyOf(tablets []source.Tablet) Topology {
	t := Topology{Tablets: make([]TopologyTablet, 0, len(tablets)), Aliases: []string{}}
	for _, tab := range tablets {
		t.Tablets = append(t.Tablets, TopologyTablet{ID: tab.ID, Parent: tab.Parent})
		for _, r := range tab.Replicas {
			t.Aliases = append(t.Aliases, r.Alias)
		}
	}
	slices.Sort(t.Aliases)
	t.Aliases = slices.Compact(t.Aliases)
	return t
}

// ReadTopology is ListTablets reduced to what the stream keeps (Topology).
func (a *Activities) ReadTopology(ctx context.Context, cfg config.Source) (Topology, error) {
	tablets, err := a.ListTablets(ctx, cfg)
	if err != nil {
		return Topology{}, err
	}
	return TopologyOf(tablets), nil
}

// PickInput asks ReadTopologyAndPick for the topology and the tablet
// picker's first choice for the stream's tablets.
type PickInput struct {
	Stream    string           `json:"stream"`
	Source    config.Source    `json:"source"`
	Selection config.Selection `json:"selection"`
	// Operator is the stream's operator exclude list.
	Operator config.ExcludeList `json:"operator,omitempty"`
	// Max bounds the picks: the tablets one stream run starts.
	Max int `json:"max"`
}

// ReadTopologyAndPick is ReadTopology for a stream about to start its
// tablets: with the listing, it runs the tablet picker (as SelectReplica
// does, over the same listing, skipping in.Operator) for each listed
// tablet whose log has not ended in a split, up to in.Max in listing
// order, so that the stream starts each with its first replica chosen
// (TabletInput.First), its row Streaming once the tablet's workflow has
// started: a tablet then sends no report and runs no picker of its own
// at its start. A tablet with no
// eligible replica gets no pick: it selects, and says why, itself.
func (a *Activities) ReadTopologyAndPick(ctx context.Context, in PickInput) (Topology, error) {
	tablets, err := a.ListTablets(ctx, in.Source)
	if err != nil {
		return Topology{}, err
	}
	topo := TopologyOf(tablets)
	topo.Picks = map[string]Selection{}
	for _, t := range tablets {
		if len(topo.Picks) >= in.Max {
			break
		}
		if t.Split {
			continue
		}
		if sel, err := a.pickOf(t, in.Stream, in.Selection, in.Operator); err == nil {
			topo.Picks[t.ID] = sel
		}
	}
	return topo, nil
}

// QueryExclusions is the stream workflow's query for its operator exclude
// list, which the picker reads at selection time.
const QueryExclusions = "exclusions"

// SelectReplicaInput asks the tablet picker for a replica.
type SelectReplicaInput struct {
	Stream    string           `json:"stream"`
	Tablet    string           `json:"tablet"`
	Source    config.Source    `json:"source"`
	Selection config.Selection `json:"selection"`
	// Exclude is the tablet's own (automatic) exclude list; the stream's
	// operator list is read with the QueryExclusions query (or this
	// worker's watcher's copy of it)...
	Exclude config.ExcludeList `json:"exclude"`
	// ...unless OperatorKnown: then Operator is that list, as the stream
	// passed it when it started the tablet. With OperatorFallback instead,
	// Operator is that list as the tablet last heard it, used when the
	// stream does not answer within PickerQueryWait and this worker has
	// never read the list itself.
	Operator         config.ExcludeList `json:"operator,omitempty"`
	OperatorKnown    bool               `json:"operatorKnown,omitempty"`
	OperatorFallback bool               `json:"operatorFallback,omitempty"`
	// Sections, when set, names the stream's config, whose source section
	// is read instead of Source's (see ConfigRef).
	Sections *ConfigRef `json:"sections,omitempty"`
}

// PickerQueryWait (Activities.PickerWait when set) bounds how long the
// tablet picker waits for the stream to answer its exclude-list query. A
// stream busy with hundreds of tablets reporting at once (a resume of
// every tablet) can take seconds; the picker then picks with the list as
// last read, and GetChanges, which checks the watcher's list at every
// batch boundary, leaves a replica excluded meanwhile as soon as the
// watcher reads the list.
const PickerQueryWait = 2 * time.Second

// Selection is the picker's choice.
type Selection struct {
	Replica source.Replica `json:"replica"`
	// Candidates is how many replicas were eligible: an automatic exclusion
	// never removes the last one.
	Candidates int `json:"candidates"`
	// Fallback: a better-ranked replica exists but is down, lagging or
	// excluded; the tablet selects again after each run to return to it.
	Fallback bool `json:"fallback,omitempty"`
}

// SelectReplica is the tablet picker: it reads the tablet's replicas from
// the topology and picks one (package picker). With no eligible replica it
// returns a NoEligibleReplica error saying why each was skipped.
func (a *Activities) SelectReplica(ctx context.Context, in SelectReplicaInput) (Selection, error) {
	section, _, err := a.sections(ctx, in.Source, config.Sink{}, in.Sections)
	if err != nil {
		return Selection{}, configUnavailable(err, "", source.Checkpoint{})
	}
	src, err := a.Resources.Source(section)
	if err != nil {
		return Selection{}, fatalf("%v", err)
	}
	operator := in.Operator
	if !in.OperatorKnown {
		var err error
		if operator, err = a.operatorExclusions(ctx, in); err != nil {
			return Selection{}, err
		}
	}
	return a.pick(ctx, src, in.Stream, in.Tablet, in.Selection, append(slices.Clone(in.Exclude), operator...))
}

// pick is the tablet picker's choice among the tablet's replicas as the
// topology lists them now, skipping those on exclude (package picker).
func (a *Activities) pick(ctx context.Context, src source.Source, stream, tablet string, selection config.Selection,
	exclude config.ExcludeList) (Selection, error) {
	tablets, err := a.Resources.Tablets(ctx, src)
	if err != nil {
		return Selection{}, classified(src, err)
	}
	for _, t := range tablets {
		if t.ID == tablet {
			return a.pickOf(t, stream, selection, exclude)
		}
	}
	return Selection{}, fatalf("tablet %s: %v", tablet, source.ErrUnknownTablet)
}

// pickOf is the tablet picker's choice among t's replicas as listed,
// skipping those on exclude.
func (a *Activities) pickOf(t source.Tablet, stream string, selection config.Selection, exclude config.ExcludeList) (Selection, error) {
	opts := picker.FromConfig(selection)
	now := a.now()
	cands, _ := picker.Candidates(t, opts, exclude, now)
	r, err := picker.Pick(t, opts, exclude, now, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	if errors.Is(err, picker.ErrNoEligibleReplica) {
		return Selection{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrNoEligibleReplica, err)
	}
	if err == nil {
		a.Metrics.Selected(stream, r.Cell)
	}
	return Selection{Replica: r, Candidates: len(cands), Fallback: err == nil && !picker.Preferred(t, opts, r)}, err
}

func (a *Activities) pickerWait() time.Duration {
	if a.PickerWait > 0 {
		return a.PickerWait
	}
	return PickerQueryWait
}

// operatorExclusions returns the stream's operator exclude list: this
// worker's watcher's copy while it watches the stream (however slowly the
// stream answers: the watcher's next read corrects a pick made from it, as
// it stops any GetChanges whose replica it finds excluded), else the
// watcher's next query (shared by the tablets asking meanwhile), waited
// for up to PickerQueryWait, else the list as last read here or as the
// tablet last heard it; without a watcher, a query of its own.
func (a *Activities) operatorExclusions(ctx context.Context, in SelectReplicaInput) (config.ExcludeList, error) {
	stream := in.Stream
	if a.Client == nil || stream == "" {
		return nil, nil
	}
	if w := a.Watcher; w != nil && w.Client != nil {
		if list, ok := w.Watched(stream); ok {
			return list, nil
		}
		qctx, cancel := context.WithTimeout(ctx, a.pickerWait())
		list, err := w.Exclusions(qctx, stream)
		cancel()
		if err == nil || ctx.Err() != nil {
			return list, err
		}
		last, ok := w.LastRead(stream)
		if !ok && in.OperatorFallback {
			last, ok = in.Operator, true
		}
		if !ok {
			return nil, err
		}
		a.logger().Info("picking with the exclude list as last known: the stream did not answer in time",
			zap.String("stream", stream), zap.String("tablet", in.Tablet), zap.Error(err))
		return last, nil
	}
	v, err := a.Client.QueryWorkflow(ctx, stream, "", QueryExclusions)
	if err != nil {
		return nil, fmt.Errorf("query the stream's exclude list: %w", err)
	}
	var list config.ExcludeList
	if err := v.Get(&list); err != nil {
		return nil, fmt.Errorf("decode the stream's exclude list: %w", err)
	}
	return list, nil
}

// classified turns a source error into a retryable one (RetrySame) or a
// typed non-retryable one.
func classified(src source.Source, err error) error {
	if err == nil {
		return nil
	}
	c := src.Classify(err)
	if c.Action == source.RetrySame {
		return err
	}
	return typed(c, fmt.Errorf("%w", err), "", source.Checkpoint{})
}

// sourceAs is the stream's source as the capability T (source.Resyncer,
// source.Snapshotter); a fatal error if it cannot be opened or lacks it
// (what it cannot do).
func sourceAs[T any](a *Activities, cfg config.Source, what string) (source.Source, T, error) {
	var none T
	src, err := a.Resources.Source(cfg)
	if err != nil {
		return nil, none, fatalf("%v", err)
	}
	c, ok := src.(T)
	if !ok {
		return nil, none, fatalf("source kind %q cannot %s", cfg.Kind, what)
	}
	return src, c, nil
}

// ResyncInput gives one tablet of a stream a fresh source-side start.
type ResyncInput struct {
	Stream string        `json:"stream"`
	Source config.Source `json:"source"`
	Tablet string        `json:"tablet"`
	// ID names the resync: the source answers the same id with the same
	// start.
	ID string `json:"id"`
	// After is the tablet's last checkpoint, which a source that keeps
	// nothing of a stream (vitess) starts after.
	After source.Checkpoint `json:"after,omitzero"`
}

// Resync makes a tablet's fresh start (source.Resyncer) and returns its
// checkpoint.
func (a *Activities) Resync(ctx context.Context, in ResyncInput) (source.Checkpoint, error) {
	src, r, err := sourceAs[source.Resyncer](a, in.Source, "resync a tablet")
	if err != nil {
		return source.Checkpoint{}, err
	}
	cp, err := r.Resync(ctx, in.Stream, in.Tablet, in.ID, in.After)
	if err != nil {
		return source.Checkpoint{}, classified(src, err)
	}
	return cp, nil
}

// SnapshotInput records (or, with Cancel, cancels) an ad-hoc snapshot on
// tablets of a stream (source.Snapshotter).
type SnapshotInput struct {
	Stream  string             `json:"stream"`
	Source  config.Source      `json:"source"`
	Tablets []string           `json:"tablets"`
	Job     source.SnapshotJob `json:"job"`
	Cancel  bool               `json:"cancel,omitempty"`
}

// SnapshotResult says, per tablet of SnapshotInput, what the source
// answered: Done lists the tablets that took the job (or its cancel),
// Failed those it refused for good, Later those it could not take now
// (RetrySame errors: a server down), each with the source's error.
type SnapshotResult struct {
	Done   []string          `json:"done,omitempty"`
	Failed map[string]string `json:"failed,omitempty"`
	Later  map[string]string `json:"later,omitempty"`
}

// Snapshot records an ad-hoc snapshot's job (or its cancel) at the source
// for each tablet, in order, and says for each how it went: one tablet's
// server down delays only that tablet (the stream tells the source of it
// again later; the source answers a job's id idempotently).
func (a *Activities) Snapshot(ctx context.Context, in SnapshotInput) (SnapshotResult, error) {
	src, sn, err := sourceAs[source.Snapshotter](a, in.Source, "snapshot tables of a running stream")
	if err != nil {
		return SnapshotResult{}, err
	}
	var res SnapshotResult
	for _, t := range in.Tablets {
		if in.Cancel {
			err = sn.CancelSnapshot(ctx, in.Stream, t, in.Job.ID)
		} else {
			err = sn.Snapshot(ctx, in.Stream, t, in.Job)
		}
		switch {
		case err == nil:
			res.Done = append(res.Done, t)
		case ctx.Err() != nil:
			return SnapshotResult{}, ctx.Err()
		case src.Classify(err).Action == source.RetrySame:
			res.Later = addTo(res.Later, t, err)
		default:
			res.Failed = addTo(res.Failed, t, err)
		}
		activity.RecordHeartbeat(ctx, len(res.Done)+len(res.Failed))
	}
	return res, nil
}

// addTo adds tablet's error to m, made if nil.
func addTo(m map[string]string, tablet string, err error) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[tablet] = err.Error()
	return m
}

// SetTablesInput makes a stream read exactly Tables
// (source.TableChanger).
type SetTablesInput struct {
	Stream string        `json:"stream"`
	Source config.Source `json:"source"`
	Tables []string      `json:"tables"`
	// At is when the change was asked: it orders a stream's changes at
	// the source.
	At time.Time `json:"at"`
}

// SetTables changes the tables a stream reads at the source. An error the
// source classifies as Fatal (a table not there, a kind that cannot) is
// non-retryable; any other is retried.
func (a *Activities) SetTables(ctx context.Context, in SetTablesInput) error {
	src, tc, err := sourceAs[source.TableChanger](a, in.Source, "change the tables of a running stream")
	if err != nil {
		return err
	}
	if err := tc.SetTables(ctx, in.Stream, in.Tables, in.At); err != nil {
		return classified(src, err)
	}
	return nil
}
