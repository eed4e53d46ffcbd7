// Package publish writes a benchmark's result: indented JSON on standard
// output and, when asked, into a file (bench/results/<name>.json).
package publish

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
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

// GitCommit is the checkout's HEAD, "-dirty" when the tree has changes,
// "" outside a git checkout: which code a result came from.
func GitCommit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty", "--abbrev=12").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Logf prints a benchmark's progress line on standard error, with the time.
func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// Origin says where a result came from: when, the command that made it,
// the commit it ran at, and notes on what was measured. A result embeds
// it first, so that its JSON starts with these.
type Origin struct {
	Date    string   `json:"date"`
	Command string   `json:"command"`
	Commit  string   `json:"commit"`
	Setup   []string `json:"setup"`
}

// Now is the origin of a result that command (its arguments follow, as
// this program got them) starts making now, at the checkout's commit.
func Now(command string) Origin {
	return Origin{Date: time.Now().UTC().Format(time.RFC3339), Commit: GitCommit(),
		Command: strings.Join(append([]string{command}, os.Args[1:]...), " ")}
}
