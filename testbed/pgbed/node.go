package pgbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/testbed"
)

// Node is one PostgreSQL server of a shard: its primary or a standby. It
// keeps its port and data directory across Stop/Kill and Start.
type Node struct {
	// Name is "s1-primary", "s1-standby1", ….
	Name string
	// Port is its TCP port on 127.0.0.1.
	Port int
	// Primary is the primary a standby streams from; nil on a primary.
	Primary *Node
	// SlotName is a standby's physical slot on its primary ("s1_standby1").
	SlotName string

	c    *Cluster
	dir  string // the node's directory: data/ and postgres.log
	mu   sync.Mutex
	proc *testbed.Proc
}

// errPortTaken: a node's port was taken by another process between the
// moment it was picked free and the server's start (a port picked is not
// held until the server binds it).
var errPortTaken = errors.New("port taken by another process")

// pickPort is freePort, replaced by a test.
var pickPort = freePort

func (c *Cluster) newNode(name string, primary *Node) (*Node, error) {
	n := &Node{Name: name, Primary: primary, c: c, dir: filepath.Join(c.Dir, name)}
	if primary != nil {
		n.SlotName = strings.ReplaceAll(name, "-", "_")
	}
	if err := n.place(); err != nil {
		return nil, err
	}
	return n, nil
}

// place gives the node a port picked free and makes its directory, which
// must not exist.
func (n *Node) place() error {
	port, err := pickPort()
	if err != nil {
		return err
	}
	n.Port = port
	return os.Mkdir(n.dir, 0o755)
}

// freePort picks a free loopback port below the kernel's ephemeral range
// (32768 and up on Linux), at random: ports handed out by listening on
// port 0 (testbed.FreePort, the Temporal dev server's) are reused by the
// kernel soon after they are closed, and another test process starting a
// server at the same time could take the port first. It is from 26000 to
// 31999: vitessbed's are below (see its freePorts).
func freePort() (int, error) {
	for range 100 {
		port := 26000 + rand.IntN(6000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return testbed.FreePort()
}

// sameDir reports whether two paths name the same directory.
func sameDir(a, b string) bool {
	if a == b {
		return true
	}
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}

// IsStandby reports whether the node is a standby.
func (n *Node) IsStandby() bool { return n.Primary != nil }

// DataDir is the node's data directory.
func (n *Node) DataDir() string { return filepath.Join(n.dir, "data") }

// LogPath is the server's log (every start appends to it).
func (n *Node) LogPath() string { return filepath.Join(n.dir, "postgres.log") }

// DSN is the adapter's connection string: role tabletflow, with its
// password; with the bed's TLS, sslmode=verify-full against its CA.
func (n *Node) DSN() string {
	q := url.Values{"sslmode": {"disable"}}
	if ca := n.c.opts.TLS.CA; ca != "" {
		q = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {ca}}
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(User, Password),
		Host: fmt.Sprintf("127.0.0.1:%d", n.Port), Path: "/postgres", RawQuery: q.Encode()}
	return u.String()
}

// ReplicationDSN is DSN for a logical replication connection
// (replication=database).
func (n *Node) ReplicationDSN() string { return n.DSN() + "&replication=database" }

// AdminDSN is the superuser's connection string (trusted on 127.0.0.1).
func (n *Node) AdminDSN() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", AdminUser, n.Port)
}

// Running reports whether the server process is up.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil && !n.proc.Exited()
}

// Start starts the server on its directory and port and waits until it
// accepts connections (a standby: once it reached a consistent state). It is
// a no-op on a running node.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	if n.proc != nil && !n.proc.Exited() {
		n.mu.Unlock()
		return nil
	}
	cmd := exec.Command(filepath.Join(n.c.bin, "postgres"), "-D", n.DataDir(), "-p", strconv.Itoa(n.Port))
	cmd.Dir = n.dir
	cmd.SysProcAttr = n.c.run.sysProcAttr()
	p, err := testbed.StartCmd(n.LogPath(), cmd)
	if err != nil {
		n.mu.Unlock()
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	n.proc = p
	n.mu.Unlock()
	err = poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if p.Exited() {
			if strings.Contains(n.Tail(), "Address already in use") {
				return false, fmt.Errorf("postgres exited: port %d: %w", n.Port, errPortTaken)
			}
			return false, errors.New("postgres exited")
		}
		conn, err := n.Connect(ctx)
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		// The server answering must be this node's: a port taken by
		// another process's server meanwhile would be mistaken for it.
		var dir string
		if err := conn.QueryRow(ctx, `SHOW data_directory`).Scan(&dir); err != nil {
			return false, err
		}
		if !sameDir(dir, n.DataDir()) {
			return false, fmt.Errorf("port %d answers for another server (%s): %w", n.Port, dir, errPortTaken)
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%s: start: %w\n%s", n.Name, err, n.Tail())
	}
	return nil
}

// Stop shuts the server down cleanly (fast shutdown: SIGINT to the
// postmaster, which ends its sessions and writes a shutdown checkpoint), and
// kills it if it has not ended within 30 s. A stopped node is left as is.
func (n *Node) Stop() error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil || p.Exited() {
		return nil
	}
	_ = syscall.Kill(p.Pid(), syscall.SIGINT)
	select {
	case <-p.Done():
		return nil
	case <-time.After(30 * time.Second):
		n.Kill()
		return fmt.Errorf("%s: no clean shutdown in 30s, killed", n.Name)
	}
}

// Kill crashes the server: SIGKILL to the postmaster and to each of its
// children (which put themselves in process groups of their own, so the
// postmaster's group alone would leave them running), as a host crash would.
// It returns once they are gone, so Start can follow at once; the next start
// runs crash recovery.
func (n *Node) Kill() {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil || p.Exited() {
		return
	}
	children := childPids(p.Pid())
	p.Kill()
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range children {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Tail is the end of the server's log.
func (n *Node) Tail() string {
	b, _ := os.ReadFile(n.LogPath())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Connect opens a superuser connection; the caller closes it.
func (n *Node) Connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, n.AdminDSN())
}

// Exec runs sql as the superuser on a connection of its own; without args it
// may hold several statements, which then run as one transaction.
func (n *Node) Exec(ctx context.Context, sql string, args ...any) error {
	conn, err := n.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// Query runs sql as the superuser and returns its rows as column → value.
func (n *Node) Query(ctx context.Context, sql string, args ...any) ([]map[string]any, error) {
	conn, err := n.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToMap)
}

// QueryRow runs sql as the superuser; Scan reads its one row and closes the
// connection.
func (n *Node) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	conn, err := n.Connect(ctx)
	if err != nil {
		return errRow{err}
	}
	return connRow{ctx: ctx, conn: conn, row: conn.QueryRow(ctx, sql, args...)}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type connRow struct {
	ctx  context.Context
	conn *pgx.Conn
	row  pgx.Row
}

func (r connRow) Scan(dest ...any) error {
	defer r.conn.Close(r.ctx)
	return r.row.Scan(dest...)
}

// WaitStreaming waits until the primary reports this standby's walreceiver
// streaming (pg_stat_replication, by application_name).
func (n *Node) WaitStreaming(ctx context.Context) error {
	if n.Primary == nil {
		return fmt.Errorf("%s is a primary", n.Name)
	}
	var recovering bool
	if err := n.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	if !recovering {
		return fmt.Errorf("%s is not in recovery: not a standby (no standby.signal?)", n.Name)
	}
	var state string
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if !n.Running() {
			return false, fmt.Errorf("%s is not running", n.Name)
		}
		err := n.Primary.QueryRow(ctx, "SELECT coalesce(max(state), '') FROM pg_stat_replication WHERE application_name = $1", n.Name).Scan(&state)
		return state == "streaming", err
	})
	if err != nil {
		return fmt.Errorf("%s: not streaming from %s (state %q): %w\n%s", n.Name, n.Primary.Name, state, err, n.Tail())
	}
	return nil
}

// CreateLogicalSlot creates a logical slot with plugin (pgoutput,
// test_decoding) on the node and returns its consistent point. On a standby
// the creation waits for a running-transactions record from the primary, so
// meanwhile it has the primary log one every 100 ms.
func (n *Node) CreateLogicalSlot(ctx context.Context, name, plugin string) (lsn string, err error) {
	done := make(chan struct{})
	defer close(done)
	if n.Primary != nil {
		go func() {
			for {
				_ = n.Primary.Exec(ctx, "SELECT pg_log_standby_snapshot()")
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
	err = n.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, $2)", name, plugin).Scan(&lsn)
	if err != nil {
		return "", fmt.Errorf("%s: create slot %s: %w", n.Name, name, err)
	}
	return lsn, nil
}

// Rows are a table's rows by primary key (id, as text), each row as
// PostgreSQL's to_jsonb of it decoded with numbers kept as json.Number:
// numeric, timestamptz (UTC) and text compare exactly.
type Rows map[string]map[string]any

// Rows reads a whole table ("public.orders").
func (n *Node) Rows(ctx context.Context, table string) (Rows, error) {
	conn, err := n.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier(strings.Split(table, ".")).Sanitize()
	rows, err := conn.Query(ctx, "SELECT t.id::text, to_jsonb(t)::text FROM "+ident+" t")
	if err != nil {
		return nil, fmt.Errorf("%s: read %s: %w", n.Name, table, err)
	}
	out := Rows{}
	var id, js string
	_, err = pgx.ForEachRow(rows, []any{&id, &js}, func() error {
		dec := json.NewDecoder(strings.NewReader(js))
		dec.UseNumber()
		var row map[string]any
		if err := dec.Decode(&row); err != nil {
			return err
		}
		out[id] = row
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: read %s: %w", n.Name, table, err)
	}
	return out, nil
}

// AllRows reads every table of Tables.
func (n *Node) AllRows(ctx context.Context) (map[string]Rows, error) {
	out := map[string]Rows{}
	for _, t := range Tables {
		rows, err := n.Rows(ctx, t)
		if err != nil {
			return nil, err
		}
		out[t] = rows
	}
	return out, nil
}

// ServerPids returns the running server's processes, the postmaster and
// its children (backends, writers); nil when it is not running. For CPU
// accounting.
func (n *Node) ServerPids() []int {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil || p.Exited() {
		return nil
	}
	return append(childPids(p.Pid()), p.Pid())
}

// childPids are the processes whose parent is pid (from /proc).
func childPids(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(child); ok && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// alive reports whether pid is a live process (a zombie is not).
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != "Z"
}

// procStat reads a process's parent and state from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	// "pid (comm) state ppid …"; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err == nil
}
