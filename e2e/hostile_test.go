package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/workflows"
)

// TestHostileInputIsRefusedClearlyAndLosesNothing throws bad input at the
// starter and at a running stream, each case with the error its caller
// must see: the starter names the field, an update answers with the
// error, a bad signal is shown in the status's rejected list. Through all
// of it, and a burst of 1,000 alternating exclude/include signals, the
// stream keeps running and its sink ends exactly equal to the source.
func TestHostileInputIsRefusedClearlyAndLosesNothing(t *testing.T) {
	e := newEnv(t, "--tablets", "4", "--rate", "200")
	e.startWorker()
	out := filepath.Join(e.dir, "out")
	const stream = "hostile"
	good := e.config(out, nil)
	e.startStream(stream, good)
	st := e.waitStatus(stream, "every tablet streaming", time.Minute, allStreaming(4))
	alias := busiest(st)

	// The starter refuses a bad config before anything reaches Temporal,
	// naming the field.
	withField := func(path string, v any) string {
		var m map[string]any
		require.NoError(t, json.Unmarshal(good, &m))
		parts := strings.Split(path, ".")
		at := m
		for _, p := range parts[:len(parts)-1] {
			if at[p] == nil {
				at[p] = map[string]any{}
			}
			at = at[p].(map[string]any)
		}
		if v == nil {
			delete(at, parts[len(parts)-1])
		} else {
			at[parts[len(parts)-1]] = v
		}
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return string(b)
	}
	starterCases := []struct{ name, config, want string }{
		{"malformed JSON", `{"source": {"kind": "tabletd",`, "invalid JSON: unexpected EOF"},
		{"not an object", `[1, 2, 3]`, "wrong type: got JSON array"},
		{"unknown field", withField("batch.maxRecordz", 5), "batch.maxRecordz: unknown field"},
		{"wrong type", withField("batch.maxRecords", "many"), "batch.maxRecords"},
		{"zero batch size", withField("batch.maxRecords", 0), "batch.maxRecords: 0 not in"},
		{"zero report rate", withField("reportRate", 0), "reportRate: 0 not in"},
		{"batch size past the bound", withField("batch.maxRecords", 100001), "batch.maxRecords"},
		{"negative batch size", withField("batch.maxRecords", -5), "batch.maxRecords"},
		{"negative duration", withField("run.duration", "-1s"), "run.duration"},
		{"absurd duration", withField("run.duration", "100000000h"), "run.duration"},
		{"not a duration", withField("batch.maxWait", "soon"), "batch.maxWait"},
		{"unknown source kind", withField("source.kind", "mysql"), `source.kind: "mysql"`},
		{"unknown sink kind", withField("sink.kind", "kafka"), `sink.kind: "kafka"`},
		{"missing source", withField("source", nil), "source.kind"},
		{"missing sink", withField("sink", nil), "sink.kind"},
		{"secret instead of a variable name", withField("source.tokenEnv", "hunter2 hunter2"), "source.tokenEnv"},
		{"TLS key without certificate", withField("source.tls", map[string]any{"key": "/k.pem"}), "source.tls: cert and key go together"},
		{"oversized config", withField("exclude", oversizedExclusions(3<<20)), "bytes, at most 262144"},
	}
	for _, tc := range starterCases {
		t.Run("starter/"+tc.name, func(t *testing.T) {
			f := filepath.Join(e.dir, "bad.json")
			require.NoError(t, os.WriteFile(f, []byte(tc.config), 0o644))
			msg, err := e.starter("start", "-f", f, "--id", "hostile-bad", "--task-queue", e.taskQueue)
			require.Error(t, err, "the starter must refuse it: %s", msg)
			require.Contains(t, msg, tc.want)
			require.NotContains(t, msg, "panic")
		})
	}
	_, err := e.temporal.DescribeWorkflow(context.Background(), "hostile-bad", "")
	require.Error(t, err, "no bad config started a stream")

	// Operator commands: each bad payload as an update (the caller gets
	// the error) and as a signal (rejected, shown in the status).
	commandCases := []struct{ name, signal, payload, want string }{
		{"malformed JSON", "exclude", `{"aliases": [`, "unexpected"},
		{"unknown field", "exclude", `{"alias": "zone1-0000000101"}`, "unknown field"},
		{"wrong type", "pause", `{"tablets": "t-0001"}`, "tablets"},
		{"empty alias list", "exclude", `{"aliases": []}`, "aliases: must not be empty"},
		{"unknown alias", "exclude", `{"aliases": ["zone9-0000000999"]}`, "not a replica of this stream"},
		{"malformed alias", "include", `{"aliases": ["no cell here"]}`, "want <cell>-<name>"},
		{"unknown tablet in exclude", "exclude", fmt.Sprintf(`{"aliases": [%q], "tablet": "t-9999"}`, alias), `unknown tablet "t-9999"`},
		{"unknown tablet in pause", "pause", `{"tablets": ["t-0001", "t-9999"]}`, `tablets[1]: unknown tablet "t-9999"`},
		{"unknown tablet in resume", "resume", `{"tablets": ["nope"]}`, `unknown tablet "nope"`},
		{"negative ttl", "exclude", fmt.Sprintf(`{"aliases": [%q], "ttl": "-1h"}`, alias), "ttl"},
		{"absurd ttl", "exclude", fmt.Sprintf(`{"aliases": [%q], "ttl": "100000000h"}`, alias), "ttl"},
		{"stop with a wrong type", "stop", `{"dropSourceStream": "yes"}`, "dropSourceStream"},
	}
	for _, tc := range commandCases {
		t.Run("update/"+tc.name, func(t *testing.T) {
			err := e.update(stream, tc.signal, tc.payload)
			require.Error(t, err, "the update must be refused")
			require.ErrorContains(t, err, tc.want)
		})
		t.Run("signal/"+tc.name, func(t *testing.T) {
			before, err := e.status(stream)
			require.NoError(t, err)
			require.NoError(t, e.temporal.SignalWorkflow(context.Background(), stream, "", tc.signal, rawJSON(tc.payload)))
			e.waitStatus(stream, "the signal rejected and shown", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
				// A new entry: the list (the last 10) changed, and its
				// last is this signal's.
				if len(st.Rejected) == 0 || reflect.DeepEqual(st.Rejected, before.Rejected) {
					return false, summary(st)
				}
				last := st.Rejected[len(st.Rejected)-1]
				return last.Signal == tc.signal && strings.Contains(last.Reason, tc.want), summary(st)
			})
		})
	}
	// configure is an update only: its validator names the field. A 0
	// that at start takes the default is refused here, not taken to mean
	// something else.
	for name, tc := range map[string]struct{ payload, want string }{
		"configure with a bad value":     {`{"batch": {"maxRecords": 0}}`, "batch.maxRecords"},
		"configure with an unknown part": {`{"sink": {"kind": "jsonl", "path": "/elsewhere"}}`, "sink: unknown field"},
		"configure with a zero maxWait":  {`{"batch": {"maxWait": "0s"}}`, "batch.maxWait: must be positive"},
		"configure with a zero maxLag":   {`{"selection": {"maxLag": "0s"}}`, "selection.maxLag: must be positive"},
	} {
		t.Run("update/"+name, func(t *testing.T) {
			require.ErrorContains(t, e.update(stream, "configure", tc.payload), tc.want)
		})
	}
	// Oversized: an update past the command bound is refused with the size;
	// a signal past the server's payload limit is refused by the server;
	// one past the command bound is rejected and shown, as an update is
	// refused; a long reason by signal within the bound is kept, cut to
	// 1 KiB.
	t.Run("oversized", func(t *testing.T) {
		huge := fmt.Sprintf(`{"aliases": [%q], "reason": %q}`, alias, strings.Repeat("r", 64<<10))
		require.ErrorContains(t, e.update(stream, "exclude", huge), "payload: ")
		tooBig := fmt.Sprintf(`{"aliases": [%q], "reason": %q}`, alias, strings.Repeat("r", 3<<20))
		require.Error(t, e.temporal.SignalWorkflow(context.Background(), stream, "", "exclude", json.RawMessage(tooBig)))
		require.NoError(t, e.temporal.SignalWorkflow(context.Background(), stream, "", "exclude", json.RawMessage(huge)))
		e.waitStatus(stream, "the signal over the bound rejected and shown", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
			if len(st.Rejected) == 0 {
				return false, summary(st)
			}
			last := st.Rejected[len(st.Rejected)-1]
			return last.Signal == "exclude" && strings.Contains(last.Reason, "payload: "), summary(st)
		})
		long := fmt.Sprintf(`{"aliases": [%q], "reason": %q}`, alias, strings.Repeat("r", 8<<10))
		require.NoError(t, e.temporal.SignalWorkflow(context.Background(), stream, "", "exclude", json.RawMessage(long)))
		e.waitStatus(stream, "the long reason kept, cut", 30*time.Second, func(st workflows.StreamStatus) (bool, string) {
			for _, x := range st.Exclude {
				if x.Alias == alias {
					return len(x.Reason) <= 1024 && strings.HasPrefix(x.Reason, "rrrr"), fmt.Sprintf("reason of %d bytes", len(x.Reason))
				}
			}
			return false, summary(st)
		})
	})

	// A burst of 1,000 alternating exclude/include signals of one replica
	// ends with it included: the last command wins, nothing fails.
	t.Run("burst", func(t *testing.T) {
		for i := range 1000 {
			name, payload := "exclude", fmt.Sprintf(`{"aliases": [%q], "reason": "burst %d"}`, alias, i)
			if i%2 == 1 {
				name, payload = "include", fmt.Sprintf(`{"aliases": [%q]}`, alias)
			}
			require.NoError(t, e.temporal.SignalWorkflow(context.Background(), stream, "", name, json.RawMessage(payload)))
		}
		e.waitStatus(stream, "the burst applied: the replica included, every tablet streaming", 2*time.Minute, func(st workflows.StreamStatus) (bool, string) {
			ok, why := allStreaming(4)(st)
			return ok && len(st.Exclude) == 0, why
		})
	})

	// A sink path the worker cannot write: the tablets say so; the stream
	// runs on, and nothing is lost once it is fixed (not applicable: it is
	// a separate stream, stopped).
	t.Run("sink path that cannot be written", func(t *testing.T) {
		blocker := filepath.Join(e.dir, "not-a-directory")
		require.NoError(t, os.WriteFile(blocker, nil, 0o644))
		bad := e.config(filepath.Join(blocker, "out"), nil)
		e.startStream("hostile-sink", bad)
		e.waitStatus("hostile-sink", "the tablets name the sink's trouble", time.Minute, func(st workflows.StreamStatus) (bool, string) {
			for _, tab := range st.Tablets {
				if strings.Contains(tab.Reason+tab.LastError, "not-a-directory") {
					return true, ""
				}
			}
			return false, summary(st)
		})
		require.NoError(t, e.temporal.SignalWorkflow(context.Background(), "hostile-sink", "", "stop", json.RawMessage(`{}`)))
	})

	// Nothing above failed the stream or lost a record.
	e.workload(sourcepb.WorkloadRequest_PAUSE)
	e.requireExact(stream, out, 2*time.Minute)
	desc, err := e.temporal.DescribeWorkflow(context.Background(), stream, "")
	require.NoError(t, err)
	require.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_RUNNING, desc.Status)
}

// update sends an operator command as an update and returns its error.
func (e *env) update(id, name, payload string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := e.temporal.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID: id, UpdateName: name, WaitForStage: client.WorkflowUpdateStageCompleted,
		Args: []any{rawJSON(payload)},
	})
	if err != nil {
		return err
	}
	return h.Get(ctx, nil)
}

// rawJSON sends payload as it is, even when it is not valid JSON (the SDK
// would refuse to encode a json.RawMessage that is not).
func rawJSON(payload string) converter.RawValue {
	return converter.NewRawValue(&commonpb.Payload{
		Metadata: map[string][]byte{converter.MetadataEncoding: []byte(converter.MetadataEncodingJSON)},
		Data:     []byte(payload),
	})
}

// oversizedExclusions is an exclude list of about n bytes.
func oversizedExclusions(n int) []map[string]any {
	var out []map[string]any
	for size := 0; size < n; size += 1000 {
		out = append(out, map[string]any{"alias": "zone1-0000000101", "reason": strings.Repeat("x", 1000)})
	}
	return out
}
