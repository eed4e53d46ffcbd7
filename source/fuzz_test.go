package source

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkpointSeeds are the forms the checkpoint tests accept and reject,
// with and without an opaque part.
var checkpointSeeds = []string{
	"1.5", "", "0.42", "0.0", "18446744073709551615.18446744073709551615",
	"18446744073709551616.1", "1.2.3", ".5", "1.", "+1.5", " 1.5", "007.010",
	"57.3@MariaDB/0-100-57", "007.1@x", "1.2@", "1.2@a b", "@x", "1.2@a@b",
}

// FuzzParseCheckpoint feeds arbitrary strings to ParseCheckpoint: they come
// from tabletd responses, manifests and workflow state. It must not panic;
// a rejection wraps ErrBadCheckpoint and returns the zero Checkpoint. An
// accepted checkpoint survives its encodings: String parses back to an
// equal checkpoint (Compare 0) and is canonical (the input "007.1" prints
// as "7.1", which prints as itself), and JSON round-trips through
// MarshalJSON/UnmarshalJSON.
func FuzzParseCheckpoint(f *testing.F) {
	for _, s := range checkpointSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cp, err := ParseCheckpoint(s)
		if err != nil {
			require.True(t, errors.Is(err, ErrBadCheckpoint), "error %q does not wrap ErrBadCheckpoint", err)
			require.Equal(t, Checkpoint{}, cp)
			return
		}
		str := cp.String()
		back, err := ParseCheckpoint(str)
		require.NoError(t, err, "String() of %q gave %q, which does not parse", s, str)
		require.Zero(t, cp.Compare(back), "%q parsed to %v, its String %q to %v", s, cp, str, back)
		require.Equal(t, cp, back)
		require.Equal(t, str, back.String(), "String is not canonical")
		require.Equal(t, cp.IsZero(), str == "", "only the zero checkpoint prints as empty")

		b, err := json.Marshal(cp)
		require.NoError(t, err)
		var fromJSON Checkpoint
		require.NoError(t, json.Unmarshal(b, &fromJSON))
		require.Equal(t, cp, fromJSON)
	})
}
