// Package vitessbed starts a real Vitess cluster for the vitess source's
// tests: etcd as the topology server, vtctld, the keyspace commerce with two
// shards (-80, 80-), each a primary in cell zone1 and a replica in each of
// zone2 and zone3 (every tablet a vttablet over its own MariaDB), and vtgate;
// the tables customer and corder sharded by a hash vindex on customer_id.
// Every server listens on 127.0.0.1 on ports picked free, under a temporary
// directory.
//
// The Vitess commands and etcd come from `make vitess` (.vitess/, built from
// tools/vitess and tools/etcd); MariaDB 10.11 from Debian (`make debs`).
// Bin finds them. mysqlctl refuses to run as root, so when this process is
// root every server runs as the user MariaDB's package makes, mysql
// (Options.User), started directly with its credentials: a wrapper such as
// runuser would stay the parent and not pass signals on.
//
// MariaDB differs from the MySQL 8 Vitess is made for in three ways the bed
// works around: Vitess's init_db.sql sets @@super_read_only (the Makefile
// writes a copy without those lines), the option super-read-only is
// unknown (loose-super-read-only here), and PlannedReparentShard promotes
// the primary but cannot attach the replicas (its errant-GTID check parses
// server_uuid, which MariaDB has not), so the bed attaches each replica by
// hand (CHANGE MASTER … MASTER_USE_GTID=slave_pos). A replica's vttablet
// restarted in a shard with a primary makes the same check and exits;
// Tablet.Restart restarts it with --restore-from-backup, which finds the
// tablet's data and leaves replication as it is. Reparenting and failover
// do not work on this bed for that reason.
package vitessbed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tabletflow/tabletflow/testbed/bins"
)

// The keyspace, its shards, tables and cells.
const (
	Keyspace = "commerce"
	// PrimaryCell holds the primaries; each other cell of Cells one replica
	// of every shard.
	PrimaryCell = "zone1"
)

var (
	// Shards are the keyspace's shards, in key order.
	Shards = []string{"-80", "80-"}
	// Cells are the cells: the primaries' first, then one per replica.
	Cells = []string{"zone1", "zone2", "zone3"}
	// Tables are the keyspace's tables, in creation order.
	Tables = []string{"customer", "corder"}
)

// Schema creates the tables, VSchema shards both by customer_id.
const (
	Schema = `CREATE TABLE customer (
  customer_id bigint NOT NULL,
  email varchar(128),
  PRIMARY KEY (customer_id)
) ENGINE=InnoDB;
CREATE TABLE corder (
  order_id bigint NOT NULL,
  customer_id bigint,
  sku varchar(128),
  price bigint,
  PRIMARY KEY (order_id)
) ENGINE=InnoDB;`
	VSchema = `{
  "sharded": true,
  "vindexes": {"hash": {"type": "hash"}},
  "tables": {
    "customer": {"column_vindexes": [{"column": "customer_id", "name": "hash"}]},
    "corder": {"column_vindexes": [{"column": "customer_id", "name": "hash"}]}
  }
}`
)

// The environment variables naming the binaries' directories; the Makefile
// exports them.
const (
	VitessBinEnv = "TABLETFLOW_VITESS_BIN"
	EtcdBinEnv   = "TABLETFLOW_ETCD_BIN"
)

// ErrNoBinaries is returned by Bin when a part of the bed is missing.
var ErrNoBinaries = errors.New(`the Vitess test bed's binaries are missing: run "make vitess debs"`)

// Binaries are where the bed's programs are.
type Binaries struct {
	// Vitess holds mysqlctl, vttablet, vtgate, vtctld and vtctldclient.
	Vitess string
	// Etcd holds etcd.
	Etcd string
	// InitDB is Vitess's init_db.sql without the @@super_read_only lines
	// (config/init_db.sql beside Vitess).
	InitDB string
	// Mysqld is MariaDB's server (Debian's /usr/sbin/mariadbd).
	Mysqld string
}

// VitessCommands are the Vitess commands the bed runs.
var VitessCommands = []string{"mysqlctl", "vttablet", "vtgate", "vtctld", "vtctldclient"}

// Bin finds the binaries: $TABLETFLOW_VITESS_BIN and $TABLETFLOW_ETCD_BIN,
// else the newest .vitess/<version>/bin and .vitess/etcd-<version>/bin that
// `make vitess` completed in the repository; and MariaDB's mariadbd in
// /usr/sbin or on PATH.
func Bin() (Binaries, error) {
	var b Binaries
	var err error
	if b.Vitess, err = findDir(VitessBinEnv, "v*", VitessCommands); err != nil {
		return b, err
	}
	if b.Etcd, err = findDir(EtcdBinEnv, "etcd-*", []string{"etcd"}); err != nil {
		return b, err
	}
	b.InitDB = filepath.Join(filepath.Dir(b.Vitess), "config", "init_db.sql")
	if _, err := os.Stat(b.InitDB); err != nil {
		return b, fmt.Errorf("%w: %v", ErrNoBinaries, err)
	}
	for _, p := range []string{"/usr/sbin/mariadbd", "mariadbd"} {
		if b.Mysqld, err = exec.LookPath(p); err == nil {
			return b, nil
		}
	}
	return b, fmt.Errorf("%w: MariaDB's mariadbd is not installed (make debs)", ErrNoBinaries)
}

// findDir is $env if set, else the newest .vitess/<pattern>/bin with a
// .stamp beside it; it must hold every one of names.
func findDir(env, pattern string, names []string) (string, error) {
	has := func(dir string) error {
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("%w: %v", ErrNoBinaries, err)
			}
		}
		return nil
	}
	if dir := os.Getenv(env); dir != "" {
		if err := has(dir); err != nil {
			return "", fmt.Errorf("%s=%s: %w", env, dir, err)
		}
		return dir, nil
	}
	root, err := bins.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("%w (%s unset, %v)", ErrNoBinaries, env, err)
	}
	stamps, _ := filepath.Glob(filepath.Join(root, ".vitess", pattern, ".stamp"))
	slices.Sort(stamps)
	for i := len(stamps) - 1; i >= 0; i-- {
		dir := filepath.Join(filepath.Dir(stamps[i]), "bin")
		if has(dir) == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w (%s unset, nothing in %s)", ErrNoBinaries, env, filepath.Join(root, ".vitess", pattern))
}

// Require returns Bin's binaries, or skips the test when they are missing —
// except under CI (CI=true), where a missing bed fails the test rather than
// letting it pass unseen.
func Require(t testing.TB) Binaries {
	t.Helper()
	b, err := Bin()
	if err != nil {
		bins.SkipOrFail(t, "vitessbed", err)
	}
	return b
}

// Options shape a cluster. The zero value is the bed the package describes.
type Options struct {
	// Dir holds everything: etcd's data, each tablet's MariaDB (vt_<uid>),
	// each process's log. Empty: a new temporary directory, removed by Stop.
	Dir string
	// User is the OS user the servers run as when this process is root;
	// default "mysql". Ignored when not root: servers run as we do.
	User string
	// Bin are the binaries; default Bin().
	Bin *Binaries
	// Log, if set, is told each step of Start and how long it took.
	Log func(format string, args ...any)
}

// StartT starts a cluster for a test: Require, Start under a five-minute
// deadline, and on cleanup the end of every process's log if the test
// failed, then Stop.
func StartT(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Bin == nil {
		b := Require(t)
		opts.Bin = &b
	}
	if _, err := lookupRunAs(cmp.Or(opts.User, "mysql")); err != nil {
		if os.Getenv("CI") == "true" || !errors.Is(err, ErrNoBinaries) {
			t.Fatalf("vitessbed: %v", err)
		}
		t.Skipf("vitessbed: %v", err)
	}
	if opts.Log == nil {
		opts.Log = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("vitessbed: start: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("vitessbed: the end of each log:\n%s", c.Tails())
		}
		if err := c.Stop(); err != nil {
			t.Errorf("vitessbed: stop: %v", err)
		}
	})
	return c
}
