// Package bins finds what the Makefile caches for the test beds (their
// servers' binaries) from a test, and ends a test whose bed cannot run.
package bins

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// RepoRoot is the nearest directory above the working directory with a
// go.mod (tests run in their package's directory), where the Makefile
// caches the servers' binaries.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// SkipOrFail ends a test whose bed cannot run for err (binaries that are
// missing, say): skipped, except under CI (CI=true), where it fails rather
// than letting the test pass unseen. bed names the bed in the message.
func SkipOrFail(t testing.TB, bed string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: %v", bed, err)
	}
	t.Skipf("%s: %v", bed, err)
}
