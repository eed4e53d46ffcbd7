package cluster

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// mustJSON and keyJSON write exactly what encoding/json writes: records'
// bytes (and so every digest) do not depend on which encoder made them.
func TestMustJSONWritesWhatEncodingJSONWrites(t *testing.T) {
	w := newWorkload(nil, 0, 7)
	want := func(v map[string]any) []byte {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return b
	}
	for i := range 3000 {
		table := tableNames[i%len(tableNames)]
		row := w.newRow(table, int64(i))
		require.Equal(t, string(want(row)), string(mustJSON(row)))
		up := w.updated(table, row)
		require.Equal(t, string(want(up)), string(mustJSON(up)))
		id := rand.Int64()
		require.Equal(t, string(want(map[string]any{"id": id})), string(keyJSON(id)))
	}
	for _, v := range []map[string]any{
		{},
		{"id": int64(-3), "name": ""},
		{"name": `quote " and \ backslash`},
		{"html": "<b>&</b>", "tab": "a\tb"},
		{"amp": "a&b"}, {"lt": "a<b"}, {"gt": "a>b"}, {"nl": "a\nb"},
		{"unicode": "zoë 日本", "del": "\x7f"},
		{"float": 1.5, "bool": true, "nil": nil},
		{"ké": 1, "a\"b": 2},
	} {
		require.Equal(t, string(want(v)), string(mustJSON(v)), "%v", v)
	}
}
