package testbed

import (
	"path/filepath"
	"testing"
)

// A dev server that cannot start is an error and no server: a caller's
// cleanup has no process to stop (the benchmarks panicked on a fresh
// clone before the Temporal CLI was built).
func TestStartDevServerWithoutTheCLIIsAnErrorAndNoServer(t *testing.T) {
	dir := t.TempDir()
	s, err := StartDevServer(filepath.Join(dir, "no-such-temporal"), dir)
	if err == nil {
		s.Stop()
		t.Fatal("a dev server started from a missing binary")
	}
	if s != nil {
		t.Fatalf("StartDevServer returned a server with its error %v", err)
	}
}
