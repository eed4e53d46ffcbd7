package vitessbed

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGTIDSetAfter(t *testing.T) {
	for _, tc := range []struct {
		s, o string
		want bool
	}{
		{"0-100-58", "0-100-57", true},              // one transaction later
		{"0-100-57", "0-100-57", false},             // the same: a reader at o is served
		{"0-100-56", "0-100-57", false},             // behind
		{"0-101-58", "0-100-57", true},              // the server ID does not order
		{"0-100-58,1-5-3", "0-100-57", true},        // a domain o lacks does not matter
		{"1-5-3", "0-100-57", false},                // o's domain missing
		{"0-100-58,1-5-2", "0-100-57,1-5-3", false}, // behind in one domain
		{"0-100-1", "", true},                       // anything is past no GTID
		{"", "", false},
	} {
		s, err := parseGTIDs(tc.s)
		require.NoError(t, err)
		o, err := parseGTIDs(tc.o)
		require.NoError(t, err)
		require.Equal(t, tc.want, s.after(o), "%q after %q", tc.s, tc.o)
	}
}

func TestParseGTIDsRefusesWhatIsNotAMariaDBPosition(t *testing.T) {
	for _, bad := range []string{"0-100", "a-b-c", "MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"} {
		_, err := parseGTIDs(bad)
		require.Error(t, err, bad)
	}
	s, err := parseGTIDs(" 1-5-3, 0-100-57 ")
	require.NoError(t, err)
	require.Equal(t, "0-100-57,1-5-3", s.String())
}

func TestShardOfSplitsIdsBetweenBothShards(t *testing.T) {
	seen := map[string]int{}
	for id := int64(1); id <= 1000; id++ {
		seen[ShardOf(id)]++
	}
	// A hash spreads ids evenly; each shard gets a fair share and no id
	// falls outside the key ranges.
	require.Len(t, seen, 2, "%v", seen)
	require.Greater(t, seen["-80"], 400)
	require.Greater(t, seen["80-"], 400)
}
