package publish

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPublishWritesIndentedJSONIntoANewDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results", "x.json")
	require.NoError(t, JSON(path, map[string]int{"a": 1}))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "{\n  \"a\": 1\n}\n", string(b))
	require.NoError(t, JSON("", 1), "no file asked for")
}
