package config

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// configSeeds are valid configs from the tests and the design's example,
// and near-valid ones each rejected for one reason.
func configSeeds() []string {
	return []string{
		designExample,
		minimal(""),
		minimal(`"batch": {"maxRecords": 100000, "maxWait": "1m", "linger": "0s"}, "run": {"duration": "61s", "heartbeatTimeout": "2m"}`),
		minimal(`"exclude": [{"alias": "zone1-1", "tablet": "t-1", "ttl": "1h", "expires": "2026-01-02T03:04:05.5+01:00"}]`),
		minimal(`"batch": {"maxWait": 500}`),
		minimal(`"retry": {"MaximumAttempts": 3}`),
		minimal("") + ` {}`,
	}
}

// FuzzDecodeConfig feeds arbitrary bytes to Decode, as an operator's
// start request may carry anything. Decode must not panic; a rejection is
// an error with text and the zero Stream. An accepted config is a fixed
// point of encoding: json.Marshal of it decodes again without error (the
// stream's config travels as JSON in workflow input and state, and must
// stay valid there), and to the same bytes (defaults are filled once and
// nothing drifts on each round).
func FuzzDecodeConfig(f *testing.F) {
	for _, s := range configSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Decode(data)
		if err != nil {
			require.NotEmpty(t, err.Error())
			require.Zero(t, s, "a rejected config returns the zero Stream")
			return
		}
		enc, err := json.Marshal(s)
		require.NoError(t, err, "an accepted config must encode")
		back, err := Decode(enc)
		require.NoError(t, err, "an accepted config, re-encoded, must decode again:\n%s", enc)
		again, err := json.Marshal(back)
		require.NoError(t, err)
		require.Equal(t, string(enc), string(again), "decode∘encode is not stable")
	})
}
