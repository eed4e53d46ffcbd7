package vitess

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
)

func TestCountIsTheTransactionsAGTIDPositionHolds(t *testing.T) {
	tests := []struct {
		name string
		pos  string
		want uint64
	}{
		// MariaDB: one domain, its sequence number.
		{name: "mariadb", pos: "MariaDB/0-100-57", want: 57},
		// Several domains: their sequence numbers add up.
		{name: "mariadb domains", pos: "MariaDB/0-100-57,1-200-3", want: 60},
		// A new primary (another server id) goes on with the sequence.
		{name: "mariadb after a reparent", pos: "MariaDB/0-101-58", want: 58},
		// MySQL: one server's interval.
		{name: "mysql", pos: "MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57", want: 57},
		// Several intervals and servers; a single transaction number.
		{name: "mysql set", pos: "MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57:60-70,4e11fa47-71ca-11e1-9e33-c80aa9429562:5", want: 57 + 11 + 1},
		// An empty set holds none.
		{name: "empty mysql", pos: "MySQL56/", want: 0},
		{name: "empty mariadb", pos: "MariaDB/", want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := count(tt.pos)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestCountRefusesWhatIsNotAGTIDPosition(t *testing.T) {
	for _, pos := range []string{
		"",                        // nothing
		"0-100-57",                // no flavor
		"FilePos/binlog.000001:4", // a file position has no count
		"MariaDB/0-100",           // two parts
		"MariaDB/0-100-x",         // not a number
		"MariaDB/0-100-57,",       // an empty GTID
		"MySQL56/3e11fa47:1-5",    // not a UUID
		"MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562",     // no interval
		"MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:9-5", // backwards
		"MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:0-5", // transaction 0
		"MariaDB/0-1-18446744073709551615,1-1-1",           // more than 2^64
	} {
		_, err := count(pos)
		require.Error(t, err, "%q", pos)
	}
}

func TestACheckpointCarriesItsGTIDPositionAndCountsItsTransactions(t *testing.T) {
	cp, err := checkpointAt("MariaDB/0-100-57", 3)
	require.NoError(t, err)
	require.Equal(t, source.Checkpoint{Term: 57, Index: 3, Opaque: "MariaDB/0-100-57"}, cp)
	require.Equal(t, "57.3@MariaDB/0-100-57", cp.String())
	back, err := source.ParseCheckpoint(cp.String())
	require.NoError(t, err)
	pos, state, err := positionOf(back)
	require.NoError(t, err)
	require.Equal(t, "MariaDB/0-100-57", pos)
	require.Nil(t, state, "not taken during a copy")

	// A checkpoint of another source, or one whose count does not match
	// its position, is refused.
	for _, s := range []string{"57.3", "56.3@MariaDB/0-100-57", "57.3@FilePos/binlog.000001:4"} {
		cp, err := source.ParseCheckpoint(s)
		require.NoError(t, err)
		_, _, err = positionOf(cp)
		require.ErrorIs(t, err, source.ErrBadCheckpoint, s)
	}
}
