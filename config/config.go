// Package config is a stream's configuration: the JSON object an operator
// starts a StreamWorkflow with. It decodes strictly (unknown fields and
// wrong types are errors), fills defaults, and validates every field,
// naming the field at fault.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Stream is a stream's configuration (DESIGN.md "Contract examples").
type Stream struct {
	Source          Source    `json:"source"`
	Sink            Sink      `json:"sink"`
	StartFrom       string    `json:"startFrom,omitempty"`
	Selection       Selection `json:"selection"`
	Retry           Retry     `json:"retry"`
	AutoExcludeTTL  Duration  `json:"autoExcludeTTL,omitempty"`
	Batch           Batch     `json:"batch"`
	Run             Run       `json:"run"`
	TopologyRefresh Duration  `json:"topologyRefresh,omitempty"`
	// StatusRefresh is how often the stream reads its running tablets'
	// live figures for its status query and memo (30 ms per running
	// tablet where that is longer).
	StatusRefresh Duration `json:"statusRefresh,omitempty"`
	// ReportRate bounds the tablets' reports to the stream workflow, in
	// signals per second for the whole stream, however many tablets
	// change state at once.
	ReportRate float64     `json:"reportRate,omitempty"`
	Exclude    ExcludeList `json:"exclude,omitempty"`
}

// Selection steers the tablet picker.
type Selection struct {
	Cells []string `json:"cells,omitempty"`
	// CellPreference: "preferLocal" (listed cells first, then the rest) or
	// "onlySpecified".
	CellPreference string `json:"cellPreference,omitempty"`
	// TabletTypes in order of preference.
	TabletTypes []string `json:"tabletTypes,omitempty"`
	MaxLag      Duration `json:"maxLag,omitempty"`
}

// Retry is the GetChanges activity's retry policy. MaximumAttempts counts
// attempts on one replica; 0 means no limit, absent means the default (5),
// hence the pointer.
type Retry struct {
	InitialInterval    Duration `json:"initialInterval,omitempty"`
	BackoffCoefficient float64  `json:"backoffCoefficient,omitempty"`
	MaximumInterval    Duration `json:"maximumInterval,omitempty"`
	MaximumAttempts    *int32   `json:"maximumAttempts,omitempty"`
}

// Attempts returns MaximumAttempts (0, no limit, when unset).
func (r Retry) Attempts() int32 {
	if r.MaximumAttempts == nil {
		return 0
	}
	return *r.MaximumAttempts
}

func ptr[T any](v T) *T { return &v }

// defaultMaxWait is batch.maxWait when the config leaves it out:
// DefaultMaxWait, or what run allows if that is less — half its
// heartbeat timeout (the rule of Validate) and half its duration. A run
// field that is not positive bounds nothing: Validate names it.
func defaultMaxWait(run Run) Duration {
	d := DefaultMaxWait
	for _, bound := range []time.Duration{run.HeartbeatTimeout.D() / 2, run.Duration.D() / 2} {
		if bound > 0 {
			d = min(d, bound)
		}
	}
	return Duration(d)
}

// Batch bounds one read.
type Batch struct {
	MaxRecords int      `json:"maxRecords,omitempty"`
	MaxWait    Duration `json:"maxWait,omitempty"`
	// Linger is the group commit's wait: after a read that brought records
	// but fewer than MaxRecords and found the replica caught up, the next read waits about this long (until
	// a multiple of it on the worker's clock), so what arrives meanwhile is
	// read and committed at once. Absent:
	// DefaultLinger; 0s: read again at once.
	Linger *Duration `json:"linger,omitempty"`
}

// LingerD is Linger as a duration (absent: 0, as for a stream started
// before the group commit existed).
func (b Batch) LingerD() time.Duration {
	if b.Linger == nil {
		return 0
	}
	return b.Linger.D()
}

// Run bounds one GetChanges activity.
type Run struct {
	Duration         Duration `json:"duration,omitempty"`
	HeartbeatTimeout Duration `json:"heartbeatTimeout,omitempty"`
}

// Exclusion is an exclude-list entry: tablet selection must not pick the
// replica (on one tablet, or on every tablet when Tablet is empty).
type Exclusion struct {
	Alias  string `json:"alias"`
	Tablet string `json:"tablet,omitempty"`
	Reason string `json:"reason,omitempty"`
	// TTL, in a config or a signal: how long the entry lasts (0: until
	// lifted). Expires is the resulting instant, in state and status.
	TTL     Duration  `json:"ttl,omitempty"`
	Expires time.Time `json:"expires,omitzero"`
}

// DefaultMaxWait: a read of an idle tablet waits this long for a
// record (one arriving ends the wait at once), so an idle tablet costs
// the worker and the source one call per 5s. Each call costs the
// worker CPU whatever it brings, so a short wait makes idle tablets cost
// more than busy ones (make bench's idle and scale cases measure it;
// docs/benchmarks.md). A stream whose run.heartbeatTimeout
// or run.duration is short gets a shorter one (defaultMaxWait).
const DefaultMaxWait = 5 * time.Second

// Defaults for every optional field.
var (
	DefaultStartFrom      = "earliest"
	DefaultCellPreference = "preferLocal"
	DefaultTabletTypes    = []string{"REPLICA", "RDONLY", "PRIMARY"}
	DefaultMaxLag         = 30 * time.Second
	DefaultRetry          = Retry{InitialInterval: Duration(time.Second), BackoffCoefficient: 2, MaximumInterval: Duration(30 * time.Second), MaximumAttempts: ptr[int32](5)}
	DefaultAutoExcludeTTL = 5 * time.Minute
	DefaultBatch          = Batch{MaxRecords: 1000, MaxWait: Duration(DefaultMaxWait), Linger: ptr(Duration(DefaultLinger))}
	// DefaultLinger: long enough that a live tablet commits about once a
	// linger instead of once per record or two (a live tablet's CPU goes
	// by its commits more than by its records), short enough to keep the
	// commit-to-sink lag under its goal (a record waits at most about
	// 1.125 lingers). make bench's live and lag cases measure both; see
	// docs/benchmarks.md.
	DefaultLinger = 750 * time.Millisecond
	// DefaultRun: a run's end costs the server a few writes and the tablet
	// a pause in its reads (seconds under load, which slows an exclusion
	// at many tablets; make bench's reaction case measures it); runs on a
	// fallback replica end sooner (activities.FallbackRun).
	DefaultRun             = Run{Duration: Duration(5 * time.Minute), HeartbeatTimeout: Duration(10 * time.Second)}
	DefaultTopologyRefresh = time.Minute
	// DefaultStatusRefresh: with workers that send heartbeats every 2 s
	// (--live-every 2s), figures at most 5 s old.
	DefaultStatusRefresh = 3 * time.Second
	DefaultReportRate    = 100.0
)

// Bounds of ReportRate: below one report a second a stream of thousands of
// tablets would take hours to show a mass state change; above 10,000 the
// bound stops protecting the stream's history.
const (
	MinReportRate = 1.0
	MaxReportRate = 10000.0
)

// Limits on values.
const (
	MaxBatchRecords = 100_000
	MaxBatchWait    = time.Minute
)

var tabletTypes = []string{"PRIMARY", "REPLICA", "RDONLY"}

// Decode parses a stream config strictly, fills defaults and validates it.
// Errors name the field ("retry.maximumInterval: ...").
func Decode(data []byte) (Stream, error) {
	var s Stream
	if err := DecodeStrict(data, &s); err != nil {
		return Stream{}, err
	}
	s.Defaults()
	if err := s.Validate(); err != nil {
		return Stream{}, err
	}
	return s, nil
}

// DecodeForStart is Decode for a stream about to start, which also refuses
// a size given as 0 (batch.maxRecords, reportRate): Decode takes an absent
// field and a 0 alike as "the default", which a config that says 0 does
// not mean. Streams already running keep Decode's reading of their config.
func DecodeForStart(data []byte) (Stream, error) {
	var sizes struct {
		Batch struct {
			MaxRecords *int `json:"maxRecords"`
		} `json:"batch"`
		ReportRate *float64 `json:"reportRate"`
	}
	if json.Unmarshal(data, &sizes) == nil {
		switch {
		case sizes.Batch.MaxRecords != nil && *sizes.Batch.MaxRecords == 0:
			return Stream{}, fieldErr("batch.maxRecords", "0 not in [1, %d] (leave it out for the default %d)", MaxBatchRecords, DefaultBatch.MaxRecords)
		case sizes.ReportRate != nil && *sizes.ReportRate == 0:
			return Stream{}, fieldErr("reportRate", "0 not in [%g, %g] (leave it out for the default %g)", MinReportRate, MaxReportRate, DefaultReportRate)
		}
	}
	return Decode(data)
}

// DecodeStrict decodes one JSON object into v, rejecting unknown fields,
// wrong types and trailing data, with errors that name the field.
func DecodeStrict(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 || bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return errors.New("empty input: want a JSON object")
	}
	if err := checkFields(data, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeJSONError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// describeJSONError rewrites encoding/json's errors to lead with the field.
func describeJSONError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var fieldErr *FieldError
	switch {
	case errors.As(err, &fieldErr):
		return fieldErr
	case errors.As(err, &typeErr) && typeErr.Type == durationType:
		return &FieldError{Field: typeErr.Field, Msg: fmt.Sprintf("%s: want a duration string such as \"500ms\" or \"2h\"", typeErr.Value)}
	case errors.As(err, &typeErr):
		return &FieldError{Field: typeErr.Field, Msg: fmt.Sprintf("wrong type: got JSON %s, want %s", typeErr.Value, typeErr.Type)}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return &FieldError{Field: strings.Trim(name, `"`), Msg: "unknown field"}
	}
	return fmt.Errorf("invalid JSON: %w", err)
}

// FieldError is a bad value, with the field's JSON path.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Defaults fills every unset optional field.
func (s *Stream) Defaults() {
	if s.StartFrom == "" {
		s.StartFrom = DefaultStartFrom
	}
	if s.Selection.CellPreference == "" {
		s.Selection.CellPreference = DefaultCellPreference
	}
	if len(s.Selection.TabletTypes) == 0 {
		s.Selection.TabletTypes = slices.Clone(DefaultTabletTypes)
	}
	if s.Selection.MaxLag == 0 {
		s.Selection.MaxLag = Duration(DefaultMaxLag)
	}
	if s.Retry.InitialInterval == 0 {
		s.Retry.InitialInterval = DefaultRetry.InitialInterval
	}
	if s.Retry.BackoffCoefficient == 0 {
		s.Retry.BackoffCoefficient = DefaultRetry.BackoffCoefficient
	}
	if s.Retry.MaximumInterval == 0 {
		s.Retry.MaximumInterval = max(DefaultRetry.MaximumInterval, s.Retry.InitialInterval)
	}
	if s.Retry.MaximumAttempts == nil {
		s.Retry.MaximumAttempts = ptr(*DefaultRetry.MaximumAttempts)
	}
	if s.AutoExcludeTTL == 0 {
		s.AutoExcludeTTL = Duration(DefaultAutoExcludeTTL)
	}
	if s.Batch.MaxRecords == 0 {
		s.Batch.MaxRecords = DefaultBatch.MaxRecords
	}
	if s.Batch.Linger == nil {
		s.Batch.Linger = ptr(Duration(DefaultLinger))
	}
	if s.Run.Duration == 0 {
		s.Run.Duration = DefaultRun.Duration
	}
	if s.Run.HeartbeatTimeout == 0 {
		s.Run.HeartbeatTimeout = DefaultRun.HeartbeatTimeout
	}
	if s.Batch.MaxWait == 0 {
		s.Batch.MaxWait = defaultMaxWait(s.Run)
	}
	if s.TopologyRefresh == 0 {
		s.TopologyRefresh = Duration(DefaultTopologyRefresh)
	}
	if s.StatusRefresh == 0 {
		s.StatusRefresh = Duration(DefaultStatusRefresh)
	}
	if s.ReportRate == 0 {
		s.ReportRate = DefaultReportRate
	}
}

// ValidAlias reports whether s looks like a replica alias, <cell>-<name>
// (tabletd: <cell>-<uid>; a postgres source: as configured, e.g. zone1-s1).
func ValidAlias(s string) bool { return aliasRe.MatchString(s) }

// ValidEnvName reports whether s is an environment variable's name, as a
// config names the variable holding a secret rather than the secret.
func ValidEnvName(s string) bool { return envVarRe.MatchString(s) }

// ValidTabletType reports whether s is a replica type: PRIMARY, REPLICA
// or RDONLY.
func ValidTabletType(s string) bool { return slices.Contains(tabletTypes, s) }

var (
	aliasRe  = regexp.MustCompile(`^[A-Za-z0-9_.]+-[A-Za-z0-9_.]+$`)
	envVarRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Validate checks every field; Defaults must have run.
func (s *Stream) Validate() error {
	if err := checkSection("source", s.Source.Kind, s.Source.Spec, SourceKinds()); err != nil {
		return err
	}
	if err := checkSection("sink", s.Sink.Kind, s.Sink.Spec, SinkKinds()); err != nil {
		return err
	}
	switch {
	case s.StartFrom == "snapshot" && !SourceKinds()[s.Source.Kind].Snapshot:
		return fieldErr("startFrom", "\"snapshot\": the %s source cannot start from a copy of its tables", s.Source.Kind)
	case s.StartFrom != "earliest" && s.StartFrom != "latest" && s.StartFrom != "snapshot":
		return fieldErr("startFrom", "%q: want \"earliest\", \"latest\" or \"snapshot\"", s.StartFrom)
	}
	if err := s.Tunables().Validate(); err != nil {
		return err
	}
	if s.TopologyRefresh.D() < time.Second {
		// Each refresh lists every tablet of the keyspace; a timer of zero or
		// less would re-list in a tight loop.
		return fieldErr("topologyRefresh", "%v: must be at least 1s", s.TopologyRefresh)
	}
	if s.StatusRefresh.D() < time.Second {
		return fieldErr("statusRefresh", "%v: must be at least 1s", s.StatusRefresh)
	}
	if !(s.ReportRate >= MinReportRate && s.ReportRate <= MaxReportRate) {
		return fieldErr("reportRate", "%v: want %v to %v reports per second", s.ReportRate, MinReportRate, MaxReportRate)
	}
	for i, e := range s.Exclude {
		if err := e.Validate(fmt.Sprintf("exclude[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// Tunables are the fields an operator may change on a running stream (the
// `configure` update).
type Tunables struct {
	Selection      Selection `json:"selection"`
	Retry          Retry     `json:"retry"`
	AutoExcludeTTL Duration  `json:"autoExcludeTTL"`
	Batch          Batch     `json:"batch"`
	Run            Run       `json:"run"`
}

// Tunables returns the stream's tunable fields.
func (s *Stream) Tunables() Tunables {
	return Tunables{Selection: s.Selection, Retry: s.Retry, AutoExcludeTTL: s.AutoExcludeTTL, Batch: s.Batch, Run: s.Run}
}

// Validate checks the tunable fields.
func (t Tunables) Validate() error {
	sel := t.Selection
	if sel.CellPreference != "preferLocal" && sel.CellPreference != "onlySpecified" {
		return fieldErr("selection.cellPreference", "%q: want \"preferLocal\" or \"onlySpecified\"", sel.CellPreference)
	}
	if sel.CellPreference == "onlySpecified" && len(sel.Cells) == 0 {
		return fieldErr("selection.cells", "must not be empty with cellPreference \"onlySpecified\"")
	}
	for i, c := range sel.Cells {
		if c == "" || slices.Index(sel.Cells, c) != i {
			return fieldErr(fmt.Sprintf("selection.cells[%d]", i), "%q empty or repeated", c)
		}
	}
	for i, typ := range sel.TabletTypes {
		if !slices.Contains(tabletTypes, typ) || slices.Index(sel.TabletTypes, typ) != i {
			return fieldErr(fmt.Sprintf("selection.tabletTypes[%d]", i), "%q: want PRIMARY, REPLICA or RDONLY, each once", typ)
		}
	}
	if sel.MaxLag < 0 {
		return fieldErr("selection.maxLag", "must not be negative")
	}
	r := t.Retry
	switch {
	case r.InitialInterval <= 0:
		return fieldErr("retry.initialInterval", "must be positive")
	case r.BackoffCoefficient < 1 || math.IsNaN(r.BackoffCoefficient) || math.IsInf(r.BackoffCoefficient, 0):
		return fieldErr("retry.backoffCoefficient", "%v: must be >= 1", r.BackoffCoefficient)
	case r.MaximumInterval < r.InitialInterval:
		return fieldErr("retry.maximumInterval", "%v is below retry.initialInterval %v", r.MaximumInterval, r.InitialInterval)
	case r.Attempts() < 0:
		return fieldErr("retry.maximumAttempts", "%d: must be >= 0 (0 = no limit)", r.Attempts())
	case t.AutoExcludeTTL <= 0:
		return fieldErr("autoExcludeTTL", "must be positive")
	case t.Batch.MaxRecords < 1 || t.Batch.MaxRecords > MaxBatchRecords:
		return fieldErr("batch.maxRecords", "%d not in [1, %d]", t.Batch.MaxRecords, MaxBatchRecords)
	case t.Batch.MaxWait < 0 || t.Batch.MaxWait.D() > MaxBatchWait:
		return fieldErr("batch.maxWait", "%v not in [0, %v]", t.Batch.MaxWait, MaxBatchWait)
	case t.Batch.LingerD() < 0 || t.Batch.LingerD() > MaxBatchWait:
		return fieldErr("batch.linger", "%v not in [0, %v]", t.Batch.LingerD(), MaxBatchWait)
	case t.Run.Duration.D() < time.Second:
		return fieldErr("run.duration", "%v: must be at least 1s", t.Run.Duration)
	case t.Run.HeartbeatTimeout.D() < time.Second:
		// GetChanges heartbeats every third of it, through long polls and
		// slow commits; much faster heartbeats for every tablet would load
		// the Temporal server.
		return fieldErr("run.heartbeatTimeout", "%v: must be at least 1s", t.Run.HeartbeatTimeout)
	case t.Batch.MaxWait >= t.Run.Duration:
		// A run checks its time between polls: with a long-poll as long as
		// the run, every run would be a single poll, taking twice as long.
		return fieldErr("batch.maxWait", "%v: must be shorter than run.duration (%v)", t.Batch.MaxWait, t.Run.Duration)
	case t.Batch.LingerD() >= t.Run.Duration.D():
		return fieldErr("batch.linger", "%v: must be shorter than run.duration (%v)", t.Batch.LingerD(), t.Run.Duration)
	case t.Run.HeartbeatTimeout.D() < 2*t.Batch.MaxWait.D():
		// Kept although GetChanges now heartbeats during a long poll:
		// workers from before that still heartbeat only between batches,
		// and a stream's config outlives a rolling upgrade.
		return fieldErr("run.heartbeatTimeout", "%v: must be at least twice batch.maxWait (%v)", t.Run.HeartbeatTimeout, t.Batch.MaxWait)
	}
	return nil
}

// ValidateChange checks the tunables a configure update asks for:
// Validate's checks, and a selection.maxLag or batch.maxWait of 0 is
// refused. A stream's own config never holds one (at start a 0 takes the
// default), so through configure it would mean something else: no lag
// limit, and an idle tablet polling in a tight loop. Validate itself keeps
// taking them: an update accepted before this rule is applied again, as
// it was, when its history replays.
func (t Tunables) ValidateChange() error {
	switch {
	case t.Selection.MaxLag == 0:
		return fieldErr("selection.maxLag", "must be positive (leave it out to keep the current value)")
	case t.Batch.MaxWait == 0:
		return fieldErr("batch.maxWait", "must be positive (leave it out to keep the current value)")
	}
	return t.Validate()
}

// Validate checks an exclude-list entry; field prefixes error fields.
func (e Exclusion) Validate(field string) error {
	switch {
	case e.Alias == "":
		return fieldErr(field+".alias", "must not be empty")
	case !aliasRe.MatchString(e.Alias):
		return fieldErr(field+".alias", "%q: want <cell>-<name>", e.Alias)
	case e.TTL < 0:
		return fieldErr(field+".ttl", "must not be negative")
	}
	return nil
}
