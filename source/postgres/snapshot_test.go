package postgres

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVisibilityTellsWhichCommittedTransactionsASelectMissed(t *testing.T) {
	for _, c := range []struct {
		snapshot string
		xids     []uint32
		missed   []uint32
	}{
		{"748:748:", []uint32{700, 747}, nil},
		{"740:748:741,745", []uint32{741, 744, 745}, []uint32{741, 745}},
		{"740:748:", []uint32{748, 900}, []uint32{748, 900}}, // not begun when it was taken
		// 64-bit xids are cut to the 32 bits the change log carries, and
		// compared modulo 2^32 across a wraparound.
		{"4294967290:4294967306:4294967295,4294967298", []uint32{4294967295, 2, 1, 10}, []uint32{4294967295, 2, 10}},
	} {
		v, err := parseVisibility(c.snapshot)
		require.NoError(t, err)
		xids := map[uint32]bool{}
		for _, x := range c.xids {
			xids[x] = true
		}
		require.ElementsMatch(t, c.missed, v.missed(xids), c.snapshot)
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:2:x"} {
		_, err := parseVisibility(bad)
		require.Error(t, err, bad)
	}
}
