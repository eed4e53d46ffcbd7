// Package bedfiles writes what a demo's test bed command (demo/pgbed,
// demo/vitessbed) leaves for the rest of the demo: the stream config for
// the bed, and files a reader sees whole or not at all.
package bedfiles

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/tabletflow/tabletflow/config"
)

// StreamConfig is a stream config of fields (the bed's source, the sink,
// the bed's own choices), over the settings every demo stream shares, as
// demo/orders.json has them: retry, autoExcludeTTL, batch, run and
// topologyRefresh. It is indented JSON ending in a newline, checked by
// config.Decode.
func StreamConfig(fields map[string]any) ([]byte, error) {
	stream := map[string]any{
		"retry":           map[string]any{"initialInterval": "1s", "backoffCoefficient": 2.0, "maximumInterval": "30s", "maximumAttempts": 5},
		"autoExcludeTTL":  "5m",
		"batch":           map[string]any{"maxRecords": 1000, "maxWait": "5s"},
		"run":             map[string]any{"duration": "1m", "heartbeatTimeout": "10s"},
		"topologyRefresh": "15s",
	}
	maps.Copy(stream, fields)
	cfg, err := json.MarshalIndent(stream, "", "  ")
	if err != nil {
		return nil, err
	}
	if _, err := config.Decode(cfg); err != nil {
		return nil, fmt.Errorf("stream config: %w", err)
	}
	return append(cfg, '\n'), nil
}

// WriteFile writes path, making its directory, through a temporary file
// renamed over it, so a reader sees the whole file or none, with mode perm
// from the start.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
