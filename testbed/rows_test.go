package testbed

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFirstRowDifferenceNamesTheFirstKeyThatDiffers(t *testing.T) {
	row := func(v int) map[string]any { return map[string]any{"v": v} }
	want := map[string]map[string]any{"1": row(1), "2": row(2), "3": row(3)}
	require.Empty(t, FirstRowDifference(want, map[string]map[string]any{"1": row(1), "2": row(2), "3": row(3)}))
	require.Equal(t, "key 2: source map[v:2], replayed map[v:9]", FirstRowDifference(want, map[string]map[string]any{"1": row(1), "2": row(9), "3": row(0)}))
	require.Equal(t, "key 1: source map[v:1], replayed map[]", FirstRowDifference(want, map[string]map[string]any{"2": row(2), "3": row(3)}))
	require.Equal(t, "key 4 replayed, not in the source: map[v:4]", FirstRowDifference(want, map[string]map[string]any{"1": row(1), "2": row(2), "3": row(3), "4": row(4)}))
}
