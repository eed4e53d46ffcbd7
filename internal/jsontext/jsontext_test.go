package jsontext

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// AppendString writes what json.Marshal writes, for plain strings and for
// every kind it escapes or replaces.
func TestAppendStringWritesWhatEncodingJSONWrites(t *testing.T) {
	for _, s := range []string{
		"", "plain", "customer-42", `quote " and \ backslash`, "a&b", "a<b", "a>b",
		"a\nb", "tab\t", "\x00", "\x7f", "zoë 日本", "bad \xff utf-8", "\u2028",
	} {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		require.Equal(t, string(want), string(AppendString(nil, s)), "%q", s)
		require.Equal(t, "x"+string(want), string(AppendString([]byte("x"), []byte(s))), "%q as bytes", s)
	}
}
