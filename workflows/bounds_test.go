package workflows

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"

	"github.com/tabletflow/tabletflow/codec"
	"github.com/tabletflow/tabletflow/source"
)

func TestUpdatesOverTheBoundsAreRefused(t *testing.T) {
	long := strings.Repeat("x", maxReasonBytes+1)
	tests := []struct {
		name, cmd, payload, wantErr string
	}{
		// A reason an operator could mean: accepted.
		{"short reason", CmdExclude, `{"aliases": ["zone1-a"], "reason": "maintenance"}`, ""},
		// A reason past the bound would grow the state and the memo.
		{"long reason", CmdExclude, `{"aliases": ["zone1-a"], "reason": "` + long + `"}`, "reason: 1025 bytes, at most 1024"},
		// Any command's payload is bounded as a whole.
		{"huge payload", CmdPause, `{"tablets": ["` + strings.Repeat("t", maxUpdateBytes) + `"]}`, "payload: 16401 bytes, at most 16384"},
		// A bad payload is left to the command's own validation.
		{"malformed", CmdExclude, `{"aliases": [`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkUpdateBounds(tt.cmd, json.RawMessage(tt.payload))
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.wantErr)
		})
	}
}

func TestTruncateCutsOnARuneBoundaryAndMarksTheCut(t *testing.T) {
	require.Equal(t, "short", truncate("short", 10))
	got := truncate(strings.Repeat("é", 100), 11) // 2 bytes a rune
	require.True(t, utf8.ValidString(got), got)
	require.LessOrEqual(t, len(got), 11)
	require.Equal(t, "éééé…", got)
}

// A signal whose payload does not decode (not JSON, not the report's
// shape, not JSON at all) is rejected and shown; the stream goes on to
// apply the next good signal on the same channel. (The SDK's Receive would
// drop it and wait for the next signal of that name, stalling the stream.)
func TestStreamRejectsUndecodableSignalsAndTakesTheNextOnes(t *testing.T) {
	env := newEnv(t)
	raw := func(encoding, data string) converter.RawValue {
		return converter.NewRawValue(&commonpb.Payload{
			Metadata: map[string][]byte{converter.MetadataEncoding: []byte(encoding)}, Data: []byte(data)})
	}
	st := badThenGoodSignal(t, env, func() {
		env.SignalWorkflow(CmdExclude, raw(converter.MetadataEncodingJSON, `{"aliases": [`))
		env.SignalWorkflow(SignalTabletReport, raw(converter.MetadataEncodingJSON, `"not a report"`))
		env.SignalWorkflow(CmdPause, raw("binary/plain", "\x00\x01"))
	}, "after the bad ones")

	require.Len(t, st.Rejected, 3, "%+v", st.Rejected)
	require.Equal(t, CmdExclude, st.Rejected[0].Signal)
	require.Contains(t, st.Rejected[0].Reason, "invalid JSON")
	require.Equal(t, SignalTabletReport, st.Rejected[1].Signal)
	require.Contains(t, st.Rejected[1].Reason, "payload")
	require.Equal(t, CmdPause, st.Rejected[2].Signal)
	require.Contains(t, st.Rejected[2].Reason, `encoding "binary/plain"`)
	require.Len(t, st.Exclude, 1, "the good signal after the bad one is applied")
	require.Equal(t, "after the bad ones", st.Exclude[0].Reason)
}

// With payload encryption, a signal sealed with a key the worker lacks is
// rejected naming the key, and the next signal is applied: the SDK would
// drop it in the codec and block for the next one.
func TestStreamRejectsASignalSealedWithAnUnknownKey(t *testing.T) {
	key := func(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }
	ours, err := codec.New(key(1))
	require.NoError(t, err)
	theirs, err := codec.New(key(2))
	require.NoError(t, err)
	env := newEnv(t)
	// The test environment encodes a signal's argument with the worker's
	// converter; a raw one goes as it is, as if from a client that sealed
	// it with its own key.
	env.SetDataConverter(rawPassing{ours.DataConverter()})
	sealed, err := theirs.DataConverter().ToPayload(json.RawMessage(`{"aliases": ["zone1-0000000101"], "reason": "other key"}`))
	require.NoError(t, err)
	st := badThenGoodSignal(t, env, func() { env.SignalWorkflow(CmdExclude, converter.NewRawValue(sealed)) }, "our key")

	require.Len(t, st.Rejected, 1, "%+v", st.Rejected)
	require.Contains(t, st.Rejected[0].Reason, "unknown encryption key \""+codec.KeyID(key(2))+"\"")
	require.Len(t, st.Exclude, 1)
	require.Equal(t, "our key", st.Exclude[0].Reason)
}

// badThenGoodSignal runs a stream of one tablet on replica
// zone1-0000000101, sends the bad signals at 5 s and a good exclusion
// with reason at 6 s, and returns the stream's status at 10 s.
func badThenGoodSignal(t *testing.T, env *testsuite.TestWorkflowEnvironment, bad func(), reason string) StreamStatus {
	t.Helper()
	w := &streamWith{lists: [][]source.Tablet{{{ID: "t-0001", Replicas: []source.Replica{{Alias: "zone1-0000000101"}}}}}}
	w.mock(env)
	var started startedTablets
	started.mock(env)
	var st StreamStatus
	env.RegisterDelayedCallback(bad, 5*time.Second)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(CmdExclude, json.RawMessage(`{"aliases": ["zone1-0000000101"], "reason": "`+reason+`"}`))
	}, 6*time.Second)
	env.RegisterDelayedCallback(func() { st = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 10*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), (*StreamState)(nil))
	return st
}

// rawPassing encodes a lone converter.RawValue as it is.
type rawPassing struct{ converter.DataConverter }

func (r rawPassing) ToPayloads(args ...any) (*commonpb.Payloads, error) {
	if len(args) == 1 {
		if v, ok := args[0].(converter.RawValue); ok {
			return &commonpb.Payloads{Payloads: []*commonpb.Payload{v.Payload()}}, nil
		}
	}
	return r.DataConverter.ToPayloads(args...)
}
