// Package bins is what the test beds share: where they find the binaries
// the Makefile caches, who their servers run as, and ending a test whose
// bed cannot run.
package bins

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
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

// ErrNoUser: running as root, the unprivileged user the servers must run
// as does not exist.
var ErrNoUser = errors.New("no such user")

// Credential is who a bed's servers run as: nil when this process is not
// root (they run as we do), else the unprivileged user name, with no
// supplementary groups (an empty Groups with NoSetGroups false clears
// them, so access checks need only the owner, group and other bits).
// Database servers refuse to run as root.
func Credential(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: running as root, the servers need the unprivileged user %s: %v", ErrNoUser, name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil || uid == 0 {
		return nil, fmt.Errorf("user %s (uid %s, gid %s) cannot run the servers", name, u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}
