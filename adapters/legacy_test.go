package adapters_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/config"
)

// legacyStreams are source and sink sections exactly as tabletflow wrote
// them into workflow histories before each adapter owned its section (one
// config struct held every kind's fields, so a postgres source carries an
// empty address and keyspace, and a jsonl sink could carry a dsnEnv it
// ignored). Printed by the code of e53933a~1 from configs it accepted.
var legacyStreams = []string{
	`{"source":{"kind":"tabletd","address":"127.0.0.1:15991","keyspace":"commerce","tables":["orders"]},"sink":{"kind":"jsonl","path":"/var/lib/tabletflow/orders/"}}`,
	`{"source":{"kind":"postgres","address":"","keyspace":"","tables":["public.orders"],"shards":[{"id":"s1","replicas":[{"alias":"zone1-s1p","cell":"zone1","type":"PRIMARY","dsnEnv":"S1_P_DSN"}]}]},"sink":{"kind":"postgres","dsnEnv":"SINK_DSN","mode":"apply","schema":"tabletflow","tables":{"public.orders":"app.orders"}}}`,
	`{"source":{"kind":"postgres","address":"","keyspace":"","tables":["public.orders"],"shards":[{"id":"s1","replicas":[{"alias":"zone1-s1p","cell":"zone1","type":"PRIMARY","dsnEnv":"S1_P_DSN"}]}]},"sink":{"kind":"jsonl","path":"/x","dsnEnv":"UNUSED_DSN"}}`,
}

// TestStreamsOfAnOlderTabletflowStillDecode: a running stream's config
// travels in its histories (tablet inputs, continue-as-new state, pending
// activities) as an older worker encoded it; after an upgrade it decodes,
// and each section parses with its adapter, as it did.
func TestStreamsOfAnOlderTabletflowStillDecode(t *testing.T) {
	for _, in := range legacyStreams {
		s, err := config.Decode([]byte(in))
		require.NoError(t, err, in)
		_, err = config.SourceKinds()[s.Source.Kind].Parse(s.Source.Spec)
		require.NoError(t, err, "source of %s", in)
		_, err = config.SinkKinds()[s.Sink.Kind].Parse(s.Sink.Spec)
		require.NoError(t, err, "sink of %s", in)
	}
}

// FuzzDecodeWithEveryAdapter: an accepted config, with the real adapters'
// sections, is a fixed point of encoding (it travels as JSON in workflow
// input and state and must stay valid there).
func FuzzDecodeWithEveryAdapter(f *testing.F) {
	for _, s := range append([]string{"{" + pgSource + "}"}, legacyStreams...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := config.Decode(data)
		if err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		enc, err := json.Marshal(s)
		require.NoError(t, err)
		back, err := config.Decode(enc)
		require.NoError(t, err, "an accepted config, re-encoded, must decode again:\n%s", enc)
		again, err := json.Marshal(back)
		require.NoError(t, err)
		require.Equal(t, string(enc), string(again))
	})
}
