package testbed

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
)

// FirstRowDifference names the first key, in key order, whose row differs
// between want (the source's rows of a table, by key) and got (what a
// replay of the stream's records gives): a row missing or different, then
// one the source does not have, with both rows. It is "" when the two are
// equal.
func FirstRowDifference[R ~map[string]map[string]any](want, got R) string {
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if !reflect.DeepEqual(want[k], got[k]) {
			return fmt.Sprintf("key %s: source %v, replayed %v", k, want[k], got[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			return fmt.Sprintf("key %s replayed, not in the source: %v", k, got[k])
		}
	}
	return ""
}
