// Package publish writes a benchmark's result: indented JSON on standard
// output and, when asked, into a file (bench/results/<name>.json).
package publish

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// JSON prints v as indented JSON and writes it to path too, making its
// directory, unless path is empty.
func JSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println(string(data))
	if path == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
