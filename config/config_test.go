package config

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// designExample is the stream config of DESIGN.md "Contract examples".
const designExample = `{
  "source": {"kind": "tabletd", "address": "127.0.0.1:15991", "keyspace": "commerce"},
  "sink": {"kind": "jsonl", "path": "/var/lib/tabletflow/orders"},
  "startFrom": "earliest",
  "selection": {"cells": ["zone1"], "cellPreference": "preferLocal",
                "tabletTypes": ["REPLICA", "RDONLY", "PRIMARY"], "maxLag": "30s"},
  "retry": {"initialInterval": "1s", "backoffCoefficient": 2.0,
            "maximumInterval": "30s", "maximumAttempts": 5},
  "autoExcludeTTL": "5m",
  "batch": {"maxRecords": 1000, "maxWait": "500ms"},
  "run": {"duration": "1m", "heartbeatTimeout": "10s"},
  "topologyRefresh": "1m",
  "exclude": [{"alias": "zone2-0000000201", "reason": "maintenance", "ttl": "2h"}]
}`

// minimalFields are the two required blocks, without braces, so tests can
// add fields after them.
const minimalFields = `"source": {"kind": "tabletd", "address": "127.0.0.1:15991", "keyspace": "commerce"},
  "sink": {"kind": "jsonl", "path": "/var/lib/tabletflow/orders"}`

// minimal returns the minimal config with extra fields ("" for none).
func minimal(extra string) string {
	if extra == "" {
		return "{" + minimalFields + "}"
	}
	return "{" + minimalFields + ", " + extra + "}"
}

func TestDecodeAcceptsTheDesignExample(t *testing.T) {
	got, err := Decode([]byte(designExample))
	require.NoError(t, err)
	want := Stream{
		Source:    Source{Kind: "tabletd", Spec: json.RawMessage(`{"kind":"tabletd","address":"127.0.0.1:15991","keyspace":"commerce"}`)},
		Sink:      Sink{Kind: "jsonl", Spec: json.RawMessage(`{"kind":"jsonl","path":"/var/lib/tabletflow/orders"}`)},
		StartFrom: "earliest",
		Selection: Selection{
			Cells: []string{"zone1"}, CellPreference: "preferLocal",
			TabletTypes: []string{"REPLICA", "RDONLY", "PRIMARY"}, MaxLag: Duration(30 * time.Second),
		},
		Retry: Retry{
			InitialInterval: Duration(time.Second), BackoffCoefficient: 2,
			MaximumInterval: Duration(30 * time.Second), MaximumAttempts: ptr[int32](5),
		},
		AutoExcludeTTL:  Duration(5 * time.Minute),
		Batch:           Batch{MaxRecords: 1000, MaxWait: Duration(500 * time.Millisecond), Linger: ptr(Duration(DefaultLinger))},
		Run:             Run{Duration: Duration(time.Minute), HeartbeatTimeout: Duration(10 * time.Second)},
		TopologyRefresh: Duration(time.Minute),
		StatusRefresh:   Duration(DefaultStatusRefresh),
		ReportRate:      100,
		Exclude:         ExcludeList{{Alias: "zone2-0000000201", Reason: "maintenance", TTL: Duration(2 * time.Hour)}},
	}
	require.Equal(t, want, got)
}

func TestDecodeFillsDocumentedDefaultsForAMinimalConfig(t *testing.T) {
	got, err := Decode([]byte(minimal("")))
	require.NoError(t, err)
	tests := []struct {
		name string
		got  any
		want any
	}{
		// The required blocks are kept as given.
		{name: "source", got: got.Source, want: Source{Kind: "tabletd", Spec: json.RawMessage(`{"kind":"tabletd","address":"127.0.0.1:15991","keyspace":"commerce"}`)}},
		{name: "sink", got: got.Sink, want: Sink{Kind: "jsonl", Spec: json.RawMessage(`{"kind":"jsonl","path":"/var/lib/tabletflow/orders"}`)}},
		// startFrom: all retained history.
		{name: "startFrom", got: got.StartFrom, want: DefaultStartFrom},
		// No cells listed, preferLocal.
		{name: "selection.cells", got: got.Selection.Cells, want: []string(nil)},
		{name: "selection.cellPreference", got: got.Selection.CellPreference, want: DefaultCellPreference},
		// REPLICA, RDONLY, PRIMARY.
		{name: "selection.tabletTypes", got: got.Selection.TabletTypes, want: DefaultTabletTypes},
		{name: "selection.maxLag", got: got.Selection.MaxLag.D(), want: DefaultMaxLag},
		// The whole retry block, maximumAttempts included (DESIGN.md: every
		// field but source and sink has a default; DefaultRetry says 5).
		{name: "retry", got: got.Retry, want: DefaultRetry},
		{name: "autoExcludeTTL", got: got.AutoExcludeTTL.D(), want: DefaultAutoExcludeTTL},
		{name: "batch", got: got.Batch, want: DefaultBatch},
		{name: "run", got: got.Run, want: DefaultRun},
		{name: "topologyRefresh", got: got.TopologyRefresh.D(), want: DefaultTopologyRefresh},
		{name: "statusRefresh", got: got.StatusRefresh.D(), want: DefaultStatusRefresh},
		{name: "reportRate", got: got.ReportRate, want: DefaultReportRate},
		// No exclusions.
		{name: "exclude", got: got.Exclude, want: ExcludeList(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.got)
		})
	}
}

func TestDefaultsDoNotAliasDefaultTabletTypes(t *testing.T) {
	// A stream that edits its tabletTypes in place must not change the
	// package default for the next stream.
	var s Stream
	s.Defaults()
	s.Selection.TabletTypes[0] = "PRIMARY"
	require.Equal(t, []string{"REPLICA", "RDONLY", "PRIMARY"}, DefaultTabletTypes)
}

func TestDecodeRejectsBadConfigsNamingTheField(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		wantPrefix string // the error starts with this
	}{
		// A top-level key the config does not have.
		{name: "unknown top-level field", in: minimal(`"sinks": {}`), wantPrefix: "sinks: unknown field"},
		// A nested unknown key is reported with its full path.
		{name: "unknown nested field", in: minimal(`"batch": {"maxRecordz": 5}`), wantPrefix: "batch.maxRecordz: unknown field"},
		// An unknown key in an array element names the element.
		{name: "unknown field in exclude entry", in: minimal(`"exclude": [{"alias": "zone1-1", "reasn": "x"}]`),
			wantPrefix: "exclude[0].reasn: unknown field"},
		// Field names are exact: encoding/json's case folding is not allowed.
		{name: "wrong-case top-level field", in: minimal(`"Batch": {"maxRecords": 5}`), wantPrefix: "Batch: unknown field"},
		// ... nor in nested blocks.
		{name: "wrong-case nested field", in: minimal(`"retry": {"MaximumAttempts": 3}`), wantPrefix: "retry.MaximumAttempts: unknown field"},
		// A string where an int belongs.
		{name: "string for int", in: minimal(`"batch": {"maxRecords": "1000"}`), wantPrefix: "batch.maxRecords: wrong type"},
		// A fraction where an int belongs.
		{name: "fraction for int", in: minimal(`"retry": {"maximumAttempts": 1.5}`), wantPrefix: "retry.maximumAttempts: wrong type"},
		// A number that overflows int32.
		{name: "int32 overflow", in: minimal(`"retry": {"maximumAttempts": 3000000000}`), wantPrefix: "retry.maximumAttempts: wrong type"},
		// A number where a duration string belongs: "500" has no unit.
		{name: "number for nested duration", in: minimal(`"batch": {"maxWait": 500}`), wantPrefix: "batch.maxWait: 500: want a duration string"},
		// ... at the top level too.
		{name: "number for top-level duration", in: minimal(`"autoExcludeTTL": 300`), wantPrefix: "autoExcludeTTL: 300: want a duration string"},
		// A string that is not a Go duration.
		{name: "bad duration string", in: minimal(`"run": {"heartbeatTimeout": "10 seconds"}`), wantPrefix: "run.heartbeatTimeout: \"10 seconds\": want a duration string"},
		// A unitless duration string.
		{name: "unitless duration string", in: minimal(`"selection": {"maxLag": "30"}`), wantPrefix: "selection.maxLag:"},
		// A string where a block belongs.
		{name: "string for object", in: minimal(`"batch": "big"`), wantPrefix: "batch: wrong type"},
		// A string where a list belongs.
		{name: "string for list", in: minimal(`"selection": {"cells": "zone1"}`), wantPrefix: "selection.cells: wrong type"},
		// A bool where a float belongs.
		{name: "bool for float", in: minimal(`"retry": {"backoffCoefficient": true}`), wantPrefix: "retry.backoffCoefficient: wrong type"},
		// A wrong type inside an exclude entry names the entry, as every
		// other exclude error does.
		{name: "wrong type in exclude entry", in: minimal(`"exclude": [{"alias": "zone1-1"}, {"alias": 101}]`),
			wantPrefix: "exclude[1].alias: wrong type"},
		// A wrong type inside a list names the element.
		{name: "wrong type in list element", in: minimal(`"selection": {"tabletTypes": ["REPLICA", 2]}`),
			wantPrefix: "selection.tabletTypes[1]: wrong type"},
		// A second object after the first.
		{name: "trailing object", in: minimal("") + ` {}`, wantPrefix: "unexpected data after the JSON object"},
		// Garbage after the object.
		{name: "trailing garbage", in: minimal("") + ` x`, wantPrefix: "unexpected data after the JSON object"},
		// Nothing at all.
		{name: "empty input", in: "", wantPrefix: "empty input"},
		// Only whitespace.
		{name: "blank input", in: " \n\t", wantPrefix: "empty input"},
		// JSON null (what a CLI start without --input may send).
		{name: "null", in: "null", wantPrefix: "empty input"},
		// A JSON value that is not an object.
		{name: "array", in: "[]", wantPrefix: "wrong type: got JSON array"},
		// A truncated object.
		{name: "truncated", in: `{"source": {"kind": "tabletd"`, wantPrefix: "invalid JSON"},
		// An object without source: the first required field is named.
		{name: "empty object", in: `{}`, wantPrefix: "source.kind:"},
		// A source kind no adapter is registered for.
		{name: "unknown source kind", in: `{"source": {"kind": "kafka"}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: `source.kind: "kafka": want "tabletd"`},
		// The fields common to every kind are checked with their path.
		{name: "source kind not a string", in: `{"source": {"kind": 5}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: `source.kind: wrong type: got JSON number`},
		{name: "source tables not a list", in: `{"source": {"kind": "tabletd", "tables": "orders"}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: `source.tables: wrong type: got JSON string`},
		{name: "sink kind not a string", in: `{"source": {"kind": "tabletd"}, "sink": {"kind": ["jsonl"]}}`,
			wantPrefix: `sink.kind: wrong type: got JSON array`},
		// A source section that is not an object.
		{name: "source not an object", in: `{"source": "tabletd", "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: `source: wrong type: want a JSON object`},
		// A sink kind no adapter is registered for.
		{name: "unknown sink kind", in: `{"source": {"kind": "tabletd"}, "sink": {"kind": "kafka"}}`,
			wantPrefix: `sink.kind: "kafka": want "jsonl"`},
		// No sink at all.
		{name: "missing sink", in: `{"source": {"kind": "tabletd"}}`, wantPrefix: "sink.kind:"},
		// The kind's adapter names the field at fault within its section.
		{name: "adapter's field", in: `{"source": {"kind": "tabletd", "bad": 1}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: `source.bad: rejected by the test kind`},
		// startFrom is earliest or latest.
		{name: "bad startFrom", in: minimal(`"startFrom": "now"`), wantPrefix: `startFrom: "now"`},
		// cellPreference is one of two words, exactly.
		{name: "bad cellPreference", in: minimal(`"selection": {"cellPreference": "prefer_local"}`), wantPrefix: "selection.cellPreference:"},
		// onlySpecified with no cells could never pick anything.
		{name: "onlySpecified without cells", in: minimal(`"selection": {"cellPreference": "onlySpecified"}`), wantPrefix: "selection.cells:"},
		// A cell listed twice.
		{name: "duplicate cell", in: minimal(`"selection": {"cells": ["zone1", "zone1"]}`), wantPrefix: "selection.cells[1]:"},
		// An empty cell name.
		{name: "empty cell", in: minimal(`"selection": {"cells": [""]}`), wantPrefix: "selection.cells[0]:"},
		// A tablet type listed twice.
		{name: "duplicate tablet type", in: minimal(`"selection": {"tabletTypes": ["REPLICA", "REPLICA"]}`), wantPrefix: "selection.tabletTypes[1]:"},
		// Tablet types are upper case, as the source reports them.
		{name: "unknown tablet type", in: minimal(`"selection": {"tabletTypes": ["REPLICA", "PRIMARY", "replica"]}`), wantPrefix: "selection.tabletTypes[2]:"},
		// A negative lag limit.
		{name: "negative maxLag", in: minimal(`"selection": {"maxLag": "-1s"}`), wantPrefix: "selection.maxLag:"},
		// A negative first retry interval.
		{name: "negative initialInterval", in: minimal(`"retry": {"initialInterval": "-1s"}`), wantPrefix: "retry.initialInterval:"},
		// A coefficient below 1 would shrink the backoff.
		{name: "backoffCoefficient below 1", in: minimal(`"retry": {"backoffCoefficient": 0.5}`), wantPrefix: "retry.backoffCoefficient:"},
		// ... as would a negative one.
		{name: "negative backoffCoefficient", in: minimal(`"retry": {"backoffCoefficient": -2}`), wantPrefix: "retry.backoffCoefficient:"},
		// The cap below the first interval.
		{name: "maximumInterval below initialInterval", in: minimal(`"retry": {"initialInterval": "10s", "maximumInterval": "5s"}`),
			wantPrefix: "retry.maximumInterval:"},
		// Negative attempts (0 means no limit).
		{name: "negative maximumAttempts", in: minimal(`"retry": {"maximumAttempts": -1}`), wantPrefix: "retry.maximumAttempts:"},
		// A negative auto-exclusion TTL.
		{name: "negative autoExcludeTTL", in: minimal(`"autoExcludeTTL": "-5m"`), wantPrefix: "autoExcludeTTL:"},
		// A negative batch size.
		{name: "negative maxRecords", in: minimal(`"batch": {"maxRecords": -1}`), wantPrefix: "batch.maxRecords:"},
		// A batch size past the limit.
		{name: "maxRecords over limit", in: minimal(`"batch": {"maxRecords": 100001}`), wantPrefix: "batch.maxRecords:"},
		// A long-poll longer than a minute (with a heartbeat that would fit it).
		{name: "maxWait over limit", in: minimal(`"batch": {"maxWait": "61s"}, "run": {"heartbeatTimeout": "5m"}`), wantPrefix: "batch.maxWait:"},
		// A negative long-poll.
		{name: "negative maxWait", in: minimal(`"batch": {"maxWait": "-1ms"}`), wantPrefix: "batch.maxWait:"},
		// A negative group-commit linger, one over the limit, one as long as the run.
		{name: "negative linger", in: minimal(`"batch": {"linger": "-1ms"}`), wantPrefix: "batch.linger:"},
		{name: "linger over limit", in: minimal(`"batch": {"linger": "61s"}, "run": {"duration": "5m"}`), wantPrefix: "batch.linger: 1m1s not in"},
		{name: "linger as long as run.duration", in: minimal(`"batch": {"linger": "5s"}, "run": {"duration": "5s", "heartbeatTimeout": "10s"}`),
			wantPrefix: "batch.linger: 5s: must be shorter than run.duration"},
		{name: "linger not a duration", in: minimal(`"batch": {"linger": 200}`), wantPrefix: "batch.linger: 200: want a duration string"},
		// A run shorter than a second.
		{name: "run shorter than 1s", in: minimal(`"run": {"duration": "500ms"}`), wantPrefix: "run.duration:"},
		// A negative run, or heartbeat timeout, with no maxWait given: the
		// error names the run field, not the default long-poll made from it.
		{name: "negative run without maxWait", in: minimal(`"run": {"duration": "-1s"}`), wantPrefix: "run.duration:"},
		{name: "negative heartbeatTimeout without maxWait", in: minimal(`"run": {"heartbeatTimeout": "-1s"}`), wantPrefix: "run.heartbeatTimeout:"},
		// A heartbeat timeout shorter than a second.
		{name: "heartbeatTimeout below 1s", in: minimal(`"run": {"heartbeatTimeout": "999ms"}`), wantPrefix: "run.heartbeatTimeout:"},
		// A heartbeat timeout below twice the long-poll (workers from before
		// the background heartbeats heartbeat only between batches).
		{name: "heartbeatTimeout below twice maxWait", in: minimal(`"batch": {"maxWait": "10s"}, "run": {"heartbeatTimeout": "19s"}`),
			wantPrefix: "run.heartbeatTimeout:"},
		// A long-poll as long as the run: every run would be one poll.
		{name: "maxWait as long as run.duration", in: minimal(`"batch": {"maxWait": "5s"}, "run": {"duration": "5s", "heartbeatTimeout": "10s"}`),
			wantPrefix: "batch.maxWait: 5s: must be shorter than run.duration"},
		// A zero or negative topology refresh would re-list tablets in a loop.
		{name: "negative topologyRefresh", in: minimal(`"topologyRefresh": "-1m"`), wantPrefix: "topologyRefresh:"},
		// ... as would a very short one.
		{name: "topologyRefresh below 1s", in: minimal(`"topologyRefresh": "999ms"`), wantPrefix: "topologyRefresh: 999ms: must be at least 1s"},
		{name: "statusRefresh below 1s", in: minimal(`"statusRefresh": "500ms"`), wantPrefix: "statusRefresh: 500ms: must be at least 1s"},
		// ... which also holds against the default maxWait (500ms).
		{name: "heartbeatTimeout below twice default maxWait", in: minimal(`"batch": {"maxWait": "1s"}, "run": {"heartbeatTimeout": "1s"}`),
			wantPrefix: "run.heartbeatTimeout:"},
		// Reports paced slower than one a second, or not at all.
		{name: "reportRate below 1", in: minimal(`"reportRate": 0.5`), wantPrefix: "reportRate: 0.5: want 1 to 10000"},
		{name: "negative reportRate", in: minimal(`"reportRate": -3`), wantPrefix: "reportRate: -3:"},
		{name: "reportRate above 10000", in: minimal(`"reportRate": 20000`), wantPrefix: "reportRate: 20000:"},
		// An exclude entry without alias.
		{name: "exclude without alias", in: minimal(`"exclude": [{"reason": "x"}]`), wantPrefix: "exclude[0].alias: must not be empty"},
		// An alias not of the form <cell>-<uid>; the index is the entry's.
		{name: "malformed alias in second entry", in: minimal(`"exclude": [{"alias": "zone1-1"}, {"alias": "zone1"}]`),
			wantPrefix: `exclude[1].alias: "zone1"`},
		// A negative exclusion TTL.
		{name: "negative exclude ttl", in: minimal(`"exclude": [{"alias": "zone1-1", "ttl": "-1h"}]`), wantPrefix: "exclude[0].ttl:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.in))
			require.Error(t, err)
			require.Truef(t, strings.HasPrefix(err.Error(), tt.wantPrefix), "error %q does not start with %q", err, tt.wantPrefix)
			require.Zero(t, got, "a rejected config comes back empty")
		})
	}
}

func TestDecodeAcceptsBoundaryValues(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		check func(t *testing.T, s Stream)
	}{
		// The largest batch allowed.
		{name: "maxRecords at limit", extra: `"batch": {"maxRecords": 100000}`,
			check: func(t *testing.T, s Stream) { require.Equal(t, MaxBatchRecords, s.Batch.MaxRecords) }},
		// The longest long-poll allowed, with a heartbeat exactly twice it
		// and a run longer than it.
		{name: "maxWait at limit", extra: `"batch": {"maxWait": "1m"}, "run": {"duration": "61s", "heartbeatTimeout": "2m"}`,
			check: func(t *testing.T, s Stream) {
				require.Equal(t, MaxBatchWait, s.Batch.MaxWait.D())
				require.Equal(t, 2*time.Minute, s.Run.HeartbeatTimeout.D())
			}},
		// A long-poll just shorter than the run.
		{name: "maxWait just below run.duration", extra: `"batch": {"maxWait": "1999ms"}, "run": {"duration": "2s", "heartbeatTimeout": "4s"}`,
			check: func(t *testing.T, s Stream) { require.Less(t, s.Batch.MaxWait, s.Run.Duration) }},
		// The shortest topology refresh.
		{name: "topologyRefresh of 1s", extra: `"topologyRefresh": "1s"`,
			check: func(t *testing.T, s Stream) { require.Equal(t, time.Second, s.TopologyRefresh.D()) }},
		// The shortest status refresh.
		{name: "statusRefresh of 1s", extra: `"statusRefresh": "1s"`,
			check: func(t *testing.T, s Stream) { require.Equal(t, time.Second, s.StatusRefresh.D()) }},
		// The slowest and fastest report pace.
		{name: "reportRate of 1", extra: `"reportRate": 1`,
			check: func(t *testing.T, s Stream) { require.Equal(t, 1.0, s.ReportRate) }},
		{name: "reportRate of 10000", extra: `"reportRate": 10000`,
			check: func(t *testing.T, s Stream) { require.Equal(t, MaxReportRate, s.ReportRate) }},
		// A coefficient of 1 is constant backoff.
		{name: "backoffCoefficient 1", extra: `"retry": {"backoffCoefficient": 1}`,
			check: func(t *testing.T, s Stream) { require.Equal(t, 1.0, s.Retry.BackoffCoefficient) }},
		// The cap may equal the first interval.
		{name: "maximumInterval equal to initialInterval", extra: `"retry": {"initialInterval": "30s", "maximumInterval": "30s"}`,
			check: func(t *testing.T, s Stream) { require.Equal(t, s.Retry.InitialInterval, s.Retry.MaximumInterval) }},
		// The shortest run and heartbeat timeout; the default long-poll
		// shrinks to fit them.
		{name: "run of 1s", extra: `"run": {"duration": "1s", "heartbeatTimeout": "1s"}`,
			check: func(t *testing.T, s Stream) {
				require.Equal(t, time.Second, s.Run.Duration.D())
				require.Equal(t, time.Second, s.Run.HeartbeatTimeout.D())
				require.Equal(t, 500*time.Millisecond, s.Batch.MaxWait.D())
			}},
		// A heartbeat timeout shorter than twice DefaultMaxWait, with no
		// maxWait given: the default is half the timeout, not an error.
		{name: "short heartbeatTimeout without maxWait", extra: `"run": {"heartbeatTimeout": "3s"}`,
			check: func(t *testing.T, s Stream) { require.Equal(t, 1500*time.Millisecond, s.Batch.MaxWait.D()) }},
		// A run shorter than twice DefaultMaxWait: half the run.
		{name: "short run without maxWait", extra: `"run": {"duration": "4s"}`,
			check: func(t *testing.T, s Stream) { require.Equal(t, 2*time.Second, s.Batch.MaxWait.D()) }},
		// onlySpecified with cells and all three types in another order.
		{name: "onlySpecified with cells", extra: `"selection": {"cells": ["zone2", "zone1"], "cellPreference": "onlySpecified", "tabletTypes": ["PRIMARY", "RDONLY", "REPLICA"]}`,
			check: func(t *testing.T, s Stream) {
				require.Equal(t, Selection{Cells: []string{"zone2", "zone1"}, CellPreference: "onlySpecified",
					TabletTypes: []string{"PRIMARY", "RDONLY", "REPLICA"}, MaxLag: Duration(DefaultMaxLag)}, s.Selection)
			}},
		// startFrom latest, as a new PostgreSQL slot.
		{name: "startFrom latest", extra: `"startFrom": "latest"`,
			check: func(t *testing.T, s Stream) { require.Equal(t, "latest", s.StartFrom) }},
		// A per-tablet exclusion without TTL.
		{name: "exclude per tablet", extra: `"exclude": [{"alias": "zone1-0000000101", "tablet": "t-0003"}]`,
			check: func(t *testing.T, s Stream) {
				require.Equal(t, ExcludeList{{Alias: "zone1-0000000101", Tablet: "t-0003"}}, s.Exclude)
			}},
		// Surrounding whitespace is not trailing data.
		{name: "whitespace around the object", extra: "",
			check: func(t *testing.T, s Stream) { require.Equal(t, "tabletd", s.Source.Kind) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Decode([]byte("\n  " + minimal(tt.extra) + "\n\n"))
			require.NoError(t, err)
			tt.check(t, s)
		})
	}
}

func TestDurationJSONRoundTrips(t *testing.T) {
	tests := []struct {
		name string
		d    time.Duration
		json string
	}{
		// The brief's example: minutes and seconds.
		{name: "1m30s", d: 90 * time.Second, json: `"1m30s"`},
		// Sub-second.
		{name: "500ms", d: 500 * time.Millisecond, json: `"500ms"`},
		// Hours.
		{name: "2h", d: 2 * time.Hour, json: `"2h0m0s"`},
		// Zero.
		{name: "zero", d: 0, json: `"0s"`},
		// Negative values survive (validation rejects them elsewhere).
		{name: "negative", d: -time.Second, json: `"-1s"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(Duration(tt.d))
			require.NoError(t, err)
			require.JSONEq(t, tt.json, string(b))
			var back Duration
			require.NoError(t, json.Unmarshal(b, &back))
			require.Equal(t, tt.d, back.D())
			require.Equal(t, tt.d.String(), back.String())
		})
	}
}

func TestDurationInAStructRoundTripsAsAString(t *testing.T) {
	in := Batch{MaxRecords: 7, MaxWait: Duration(90 * time.Second)}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	require.JSONEq(t, `{"maxRecords": 7, "maxWait": "1m30s"}`, string(b))
	var out Batch
	require.NoError(t, DecodeStrict(b, &out))
	require.Equal(t, in, out)
}

func TestDurationUnmarshalAcceptsOnlyDurationStrings(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want time.Duration
		bad  bool
	}{
		// Go duration strings with mixed units.
		{name: "mixed units", in: `"1h2m3s"`, want: time.Hour + 2*time.Minute + 3*time.Second},
		// Fractions of a unit.
		{name: "fraction", in: `"1.5s"`, want: 1500 * time.Millisecond},
		// A bare number is ambiguous.
		{name: "number", in: `90`, bad: true},
		// A unitless number string too.
		{name: "unitless string", in: `"90"`, bad: true},
		// Words are not durations.
		{name: "words", in: `"ninety seconds"`, bad: true},
		// An empty string is not zero.
		{name: "empty string", in: `""`, bad: true},
		// Neither is null.
		{name: "null", in: `null`, bad: true},
		// Nor an object.
		{name: "object", in: `{"s": 1}`, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Duration
			err := json.Unmarshal([]byte(tt.in), &d)
			if tt.bad {
				var typeErr *json.UnmarshalTypeError
				require.ErrorAs(t, err, &typeErr)
				require.Equal(t, tt.in, typeErr.Value)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, d.D())
		})
	}
}

// validTunables are the defaults of a minimal config.
func validTunables() Tunables {
	var s Stream
	s.Defaults()
	return s.Tunables()
}

func TestTunablesValidate(t *testing.T) {
	tests := []struct {
		name       string
		edit       func(tu *Tunables)
		wantPrefix string // "" means valid
	}{
		// The defaults are valid.
		{name: "defaults", edit: func(*Tunables) {}},
		// Zero tunables (Defaults not run) are not: the first field is named.
		{name: "zero", edit: func(tu *Tunables) { *tu = Tunables{} }, wantPrefix: "selection.cellPreference:"},
		// onlySpecified needs cells.
		{name: "onlySpecified without cells", edit: func(tu *Tunables) { tu.Selection.CellPreference = "onlySpecified" },
			wantPrefix: "selection.cells:"},
		// onlySpecified with cells is fine.
		{name: "onlySpecified with cells", edit: func(tu *Tunables) {
			tu.Selection.CellPreference = "onlySpecified"
			tu.Selection.Cells = []string{"zone1"}
		}},
		// A repeated cell further down the list is named by index.
		{name: "repeated cell", edit: func(tu *Tunables) { tu.Selection.Cells = []string{"zone1", "zone2", "zone1"} },
			wantPrefix: "selection.cells[2]:"},
		// An empty tablet type list is allowed here (all types).
		{name: "no tablet types", edit: func(tu *Tunables) { tu.Selection.TabletTypes = nil }},
		// A duplicate tablet type.
		{name: "duplicate tablet type", edit: func(tu *Tunables) { tu.Selection.TabletTypes = []string{"RDONLY", "PRIMARY", "RDONLY"} },
			wantPrefix: "selection.tabletTypes[2]:"},
		// Zero maxLag means no limit here (a configure update refuses it:
		// TestTunablesValidateChangeRefusesZeroWaits).
		{name: "zero maxLag", edit: func(tu *Tunables) { tu.Selection.MaxLag = 0 }},
		// A zero first interval.
		{name: "zero initialInterval", edit: func(tu *Tunables) { tu.Retry.InitialInterval = 0 }, wantPrefix: "retry.initialInterval:"},
		// NaN can't come from JSON but can from Go; it is rejected.
		{name: "NaN backoffCoefficient", edit: func(tu *Tunables) { tu.Retry.BackoffCoefficient = math.NaN() }, wantPrefix: "retry.backoffCoefficient:"},
		// So is infinity.
		{name: "infinite backoffCoefficient", edit: func(tu *Tunables) { tu.Retry.BackoffCoefficient = math.Inf(1) }, wantPrefix: "retry.backoffCoefficient:"},
		// Just below 1.
		{name: "backoffCoefficient 0.999", edit: func(tu *Tunables) { tu.Retry.BackoffCoefficient = 0.999 }, wantPrefix: "retry.backoffCoefficient:"},
		// The cap one nanosecond below the first interval.
		{name: "maximumInterval just below initialInterval", edit: func(tu *Tunables) {
			tu.Retry.InitialInterval = Duration(time.Second)
			tu.Retry.MaximumInterval = Duration(time.Second - 1)
		}, wantPrefix: "retry.maximumInterval:"},
		// 0 attempts: no limit.
		{name: "unlimited attempts", edit: func(tu *Tunables) { tu.Retry.MaximumAttempts = ptr[int32](0) }},
		// A zero auto-exclusion TTL would exclude nothing.
		{name: "zero autoExcludeTTL", edit: func(tu *Tunables) { tu.AutoExcludeTTL = 0 }, wantPrefix: "autoExcludeTTL:"},
		// Zero records per batch.
		{name: "zero maxRecords", edit: func(tu *Tunables) { tu.Batch.MaxRecords = 0 }, wantPrefix: "batch.maxRecords:"},
		// One record per batch is the smallest.
		{name: "one record per batch", edit: func(tu *Tunables) { tu.Batch.MaxRecords = 1 }},
		// A zero long-poll (return at once) is taken here, for updates
		// accepted before configure refused it.
		{name: "zero maxWait", edit: func(tu *Tunables) { tu.Batch.MaxWait = 0 }},
		// One nanosecond over a minute.
		{name: "maxWait just over limit", edit: func(tu *Tunables) {
			tu.Batch.MaxWait = Duration(MaxBatchWait + 1)
			tu.Run.HeartbeatTimeout = Duration(time.Hour)
		}, wantPrefix: "batch.maxWait:"},
		// A zero run.
		{name: "zero run duration", edit: func(tu *Tunables) { tu.Run.Duration = 0 }, wantPrefix: "run.duration:"},
		// A long-poll as long as the run (a configure update can make one).
		{name: "maxWait equal to run duration", edit: func(tu *Tunables) {
			tu.Run.Duration = Duration(5 * time.Second)
			tu.Batch.MaxWait = Duration(5 * time.Second)
			tu.Run.HeartbeatTimeout = Duration(10 * time.Second)
		}, wantPrefix: "batch.maxWait:"},
		// One nanosecond shorter is fine.
		{name: "maxWait just below run duration", edit: func(tu *Tunables) {
			tu.Run.Duration = Duration(5 * time.Second)
			tu.Batch.MaxWait = Duration(5*time.Second - 1)
			tu.Run.HeartbeatTimeout = Duration(10 * time.Second)
		}},
		// A heartbeat timeout just under a second (heartbeats go every third).
		{name: "heartbeatTimeout just below 1s", edit: func(tu *Tunables) {
			tu.Batch.MaxWait = 0
			tu.Run.HeartbeatTimeout = Duration(time.Second - 1)
		}, wantPrefix: "run.heartbeatTimeout:"},
		// A heartbeat timeout one nanosecond short of twice maxWait.
		{name: "heartbeatTimeout just below twice maxWait", edit: func(tu *Tunables) {
			tu.Batch.MaxWait = Duration(5 * time.Second)
			tu.Run.HeartbeatTimeout = Duration(10*time.Second - 1)
		}, wantPrefix: "run.heartbeatTimeout:"},
		// Exactly twice maxWait.
		{name: "heartbeatTimeout twice maxWait", edit: func(tu *Tunables) {
			tu.Batch.MaxWait = Duration(5 * time.Second)
			tu.Run.HeartbeatTimeout = Duration(10 * time.Second)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tu := validTunables()
			tt.edit(&tu)
			err := tu.Validate()
			if tt.wantPrefix == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Truef(t, strings.HasPrefix(err.Error(), tt.wantPrefix), "error %q does not start with %q", err, tt.wantPrefix)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, strings.TrimSuffix(tt.wantPrefix, ":"), fe.Field)
		})
	}
}

// TestTunablesValidateChangeRefusesZeroWaits: configure means what start
// means. At start a maxWait or maxLag of 0 takes the default; a configure
// update asking for 0 is refused, naming the field, rather than making an
// idle tablet poll in a tight loop or lifting the lag limit.
func TestTunablesValidateChangeRefusesZeroWaits(t *testing.T) {
	require.NoError(t, validTunables().ValidateChange())
	for _, tt := range []struct {
		name, field string
		edit        func(tu *Tunables)
	}{
		{"zero maxLag", "selection.maxLag", func(tu *Tunables) { tu.Selection.MaxLag = 0 }},
		{"zero maxWait", "batch.maxWait", func(tu *Tunables) { tu.Batch.MaxWait = 0 }},
		// The other checks still run.
		{"negative maxLag", "selection.maxLag", func(tu *Tunables) { tu.Selection.MaxLag = -1 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tu := validTunables()
			tt.edit(&tu)
			var fe *FieldError
			require.ErrorAs(t, tu.ValidateChange(), &fe)
			require.Equal(t, tt.field, fe.Field)
		})
	}
	// At start, 0 is the default.
	s, err := Decode([]byte(minimal(`"batch": {"maxWait": "0s"}, "selection": {"maxLag": "0s"}`)))
	require.NoError(t, err)
	require.Equal(t, DefaultMaxLag, s.Selection.MaxLag.D())
	require.Positive(t, s.Batch.MaxWait.D())
}

func TestTunablesDecodeStrictly(t *testing.T) {
	// The configure update's payload decodes with the same strictness.
	tests := []struct {
		name       string
		in         string
		wantPrefix string // "" means it decodes
	}{
		// A known block.
		{name: "batch", in: `{"batch": {"maxRecords": 10}}`},
		// A field of the stream that is not tunable.
		{name: "source is not tunable", in: `{"source": {"kind": "tabletd"}}`, wantPrefix: "source: unknown field"},
		// A typo in a nested block.
		{name: "typo", in: `{"run": {"heartbeatTimout": "10s"}}`, wantPrefix: "run.heartbeatTimout: unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tu Tunables
			err := DecodeStrict([]byte(tt.in), &tu)
			if tt.wantPrefix == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Truef(t, strings.HasPrefix(err.Error(), tt.wantPrefix), "error %q does not start with %q", err, tt.wantPrefix)
		})
	}
}

func TestExclusionValidate(t *testing.T) {
	tests := []struct {
		name    string
		e       Exclusion
		field   string
		wantErr string // "" means valid; else the whole message
	}{
		// A Vitess-style alias.
		{name: "cell and uid", e: Exclusion{Alias: "zone1-0000000101"}, field: "exclude[0]"},
		// Cell names may hold dots and underscores.
		{name: "dotted cell", e: Exclusion{Alias: "us_east.1a-7", Tablet: "t-0003", Reason: "x", TTL: Duration(time.Hour)}, field: "exclude[0]"},
		// A zero TTL means until lifted.
		{name: "zero ttl", e: Exclusion{Alias: "zone1-1", TTL: 0}, field: "exclude[0]"},
		// The alias is required; the field prefix is the caller's.
		{name: "empty alias", e: Exclusion{}, field: "exclude[3]", wantErr: "exclude[3].alias: must not be empty"},
		// A cell without a name.
		{name: "no uid", e: Exclusion{Alias: "zone1"}, field: "exclude[0]", wantErr: `exclude[0].alias: "zone1": want <cell>-<name>`},
		// Two dashes: the cell and the name are each one word.
		{name: "two dashes", e: Exclusion{Alias: "zone1-s1-x"}, field: "exclude[0]", wantErr: `exclude[0].alias: "zone1-s1-x": want <cell>-<name>`},
		// A uid without cell.
		{name: "no cell", e: Exclusion{Alias: "-101"}, field: "exclude[0]", wantErr: `exclude[0].alias: "-101": want <cell>-<name>`},
		// Surrounding spaces are not trimmed.
		{name: "spaces", e: Exclusion{Alias: " zone1-101"}, field: "exclude[0]", wantErr: `exclude[0].alias: " zone1-101": want <cell>-<name>`},
		// A negative TTL.
		{name: "negative ttl", e: Exclusion{Alias: "zone1-1", TTL: Duration(-time.Second)}, field: "exclude[1]", wantErr: "exclude[1].ttl: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.e.Validate(tt.field)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.wantErr)
		})
	}
}

// batch.linger "0s" is kept (the group commit off: every poll commits), not
// taken for an absent field and defaulted; absent, it is DefaultLinger.
func TestLingerZeroTurnsTheGroupCommitOffAbsentIsTheDefault(t *testing.T) {
	off, err := Decode([]byte(minimal(`"batch": {"linger": "0s"}`)))
	require.NoError(t, err)
	require.NotNil(t, off.Batch.Linger)
	require.Zero(t, off.Batch.LingerD())
	def, err := Decode([]byte(minimal(``)))
	require.NoError(t, err)
	require.Equal(t, DefaultLinger, def.Batch.LingerD())
	require.Zero(t, Batch{}.LingerD(), "a stream from before the group commit commits every poll")
}

// A stream about to start refuses a size given as 0; Decode (a running
// stream's config) keeps reading 0 as the default.
func TestDecodeForStartRefusesSizesGivenAsZero(t *testing.T) {
	for _, tt := range []struct{ extra, want string }{
		{`"batch": {"maxRecords": 0}`, "batch.maxRecords: 0 not in [1, 100000] (leave it out for the default 1000)"},
		{`"reportRate": 0`, "reportRate: 0 not in [1, 10000] (leave it out for the default 100)"},
	} {
		_, err := DecodeForStart([]byte(minimal(tt.extra)))
		require.EqualError(t, err, tt.want)
		s, err := Decode([]byte(minimal(tt.extra)))
		require.NoError(t, err, "a running stream's config still decodes")
		require.Equal(t, 1000, s.Batch.MaxRecords)
	}
	_, err := DecodeForStart([]byte(minimal(`"batch": {"maxWait": "1s"}`)))
	require.NoError(t, err, "an absent size is the default")
}

// TestDropLegacyDropsOnlyZeroValuedKeysItIsGiven: a stream encoded by an
// older tabletflow carries the fields of other kinds, empty; a field with
// a value stays for the strict decode to name.
func TestDropLegacyDropsOnlyZeroValuedKeysItIsGiven(t *testing.T) {
	for _, tt := range []struct{ name, in, want string }{
		{"empty strings dropped", `{"kind":"postgres","address":"","keyspace":"","tables":["a.b"]}`, `{"kind":"postgres","tables":["a.b"]}`},
		{"null and empty list dropped", `{"kind":"x","tls":null,"shards":[]}`, `{"kind":"x"}`},
		{"a value kept", `{"kind":"postgres","address":"h:1"}`, `{"kind":"postgres","address":"h:1"}`},
		{"keys not named kept", `{"kind":"x","path":""}`, `{"kind":"x","path":""}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.JSONEq(t, tt.want, string(DropLegacy([]byte(tt.in), "address", "keyspace", "tls", "shards")))
		})
	}
}
