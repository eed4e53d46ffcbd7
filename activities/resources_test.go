package activities

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
)

// TestSinksAreSharedPerStreamAndConfig: a worker opens one sink per
// stream and sink config; the postgres sink's given tables are part of
// that config, so a stream started again with other tables does not get
// the sink that writes the old ones.
func TestSinksAreSharedPerStreamAndConfig(t *testing.T) {
	opened := 0
	r := NewResources()
	r.NewSink = func(config.Sink, string) (sink.Sink, error) { opened++; return newMemSink(&callLog{}), nil }
	cfg := config.Sink{Kind: "postgres", DSNEnv: "D", Schema: "tabletflow", Mode: "apply", Tables: map[string]string{"public.a": "app.a", "public.b": "app.b"}}
	_, err := r.Sink(cfg, "orders")
	require.NoError(t, err)
	same := cfg
	same.Tables = map[string]string{"public.b": "app.b", "public.a": "app.a"}
	_, err = r.Sink(same, "orders")
	require.NoError(t, err)
	require.Equal(t, 1, opened, "the same config shares the sink")

	other := cfg
	other.Tables = map[string]string{"public.a": "app.a2", "public.b": "app.b"}
	_, err = r.Sink(other, "orders")
	require.NoError(t, err)
	require.Equal(t, 2, opened, "other given tables, another sink")
	_, err = r.Sink(cfg, "returns")
	require.NoError(t, err)
	require.Equal(t, 3, opened, "another stream, another sink")
}
