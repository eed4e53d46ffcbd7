package pgbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/tabletflow/tabletflow/testbed/bins"
)

// Versions are the PostgreSQL major versions the postgres source supports
// (decoding on standbys needs 16), which `make pg` fetches: every test
// runs on the newest, and the source's smoke test on each.
var Versions = []int{16, 17, 18}

var versionRe = regexp.MustCompile(`\(PostgreSQL\) (\d+)\.`)

// Major returns the major version of the binaries in dir, as their
// postgres --version says.
func Major(dir string) (int, error) {
	out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("%s --version: %w", filepath.Join(dir, "postgres"), err)
	}
	m := versionRe.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("%s --version: no version in %q", filepath.Join(dir, "postgres"), out)
	}
	return strconv.Atoi(string(m[1]))
}

// BinOf returns the directory holding PostgreSQL major's initdb and
// postgres: $TABLETFLOW_PG_BIN when its binaries are that version, else the
// newest <repo>/.pg/<major>.*/bin that `make pg` completed.
func BinOf(major int) (string, error) {
	if dir := os.Getenv(BinEnv); dir != "" && hasBinaries(dir) == nil {
		if m, err := Major(dir); err == nil && m == major {
			return dir, nil
		}
	}
	root, err := bins.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("%w: PostgreSQL %d (%v)", ErrNoBinaries, major, err)
	}
	stamps, _ := filepath.Glob(filepath.Join(root, ".pg", fmt.Sprintf("%d.*", major), ".stamp"))
	slices.Sort(stamps)
	for i := len(stamps) - 1; i >= 0; i-- {
		dir := filepath.Join(filepath.Dir(stamps[i]), "bin")
		if hasBinaries(dir) == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w: PostgreSQL %d, nothing in %s", ErrNoBinaries, major, filepath.Join(root, ".pg", fmt.Sprintf("%d.*", major)))
}

// RequireOf returns BinOf's directory, or skips the test when those
// binaries are missing — except under CI (CI=true), where it fails, as
// Require does.
func RequireOf(t testing.TB, major int) string {
	t.Helper()
	dir, err := BinOf(major)
	if err != nil {
		bins.SkipOrFail(t, "pgbed", err)
	}
	return dir
}
