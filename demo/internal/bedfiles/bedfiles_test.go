package bedfiles

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	_ "github.com/tabletflow/tabletflow/adapters" // the kinds config.Decode checks
)

func TestStreamConfigPutsTheBedsFieldsOverTheDemoDefaults(t *testing.T) {
	cfg, err := StreamConfig(map[string]any{
		"source": map[string]any{"kind": "vitess", "vtctld": "127.0.0.1:1", "keyspace": "commerce", "tables": []string{"customer"}},
		"sink":   map[string]any{"kind": "jsonl", "path": "/tmp/out"},
		"batch":  map[string]any{"maxRecords": 10, "maxWait": "1s"},
	})
	require.NoError(t, err)
	require.Equal(t, byte('\n'), cfg[len(cfg)-1])
	var got map[string]any
	require.NoError(t, json.Unmarshal(cfg, &got))
	require.Equal(t, map[string]any{"maxRecords": 10.0, "maxWait": "1s"}, got["batch"], "the bed's own choice wins")
	require.Equal(t, "5m", got["autoExcludeTTL"], "the demo's default")
	require.Equal(t, map[string]any{"duration": "1m", "heartbeatTimeout": "10s"}, got["run"])

	_, err = StreamConfig(map[string]any{"sink": map[string]any{"kind": "jsonl", "path": "/tmp/out"}})
	require.ErrorContains(t, err, "stream config", "a config without a source does not decode")
}

func TestWriteFileMakesTheDirectoryAndGivesTheModeFromTheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new", "pg.env")
	require.NoError(t, WriteFile(path, []byte("A=1\n"), 0o600))
	require.NoError(t, WriteFile(path, []byte("A=2\n"), 0o600))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "A=2\n", string(data))
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left")
}
