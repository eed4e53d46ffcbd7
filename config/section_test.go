package config

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// WithTables changes a source section's tables, in Tables and in the
// section as given, keeping the rest of it.
func TestWithTablesChangesTheTablesOnly(t *testing.T) {
	var s Source
	require.NoError(t, json.Unmarshal([]byte(`{"kind": "postgres", "tables": ["public.a"], "shards": [{"id": "s1"}]}`), &s))
	got, err := s.WithTables([]string{"public.a", "public.b"})
	require.NoError(t, err)
	require.Equal(t, []string{"public.a", "public.b"}, got.Tables)
	require.JSONEq(t, `{"kind": "postgres", "tables": ["public.a", "public.b"], "shards": [{"id": "s1"}]}`, string(got.Spec))
	require.Equal(t, []string{"public.a"}, s.Tables, "the section it was made from is unchanged")
	var back Source
	require.NoError(t, json.Unmarshal(got.Spec, &back))
	require.Equal(t, got.Tables, back.Tables, "the section reads back as the tables it was given")
}
