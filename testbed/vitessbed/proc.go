package vitessbed

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/bins"
)

// runAs is who the servers run as: an unprivileged user when we are root
// (mysqlctl refuses root), else ourselves (cred nil).
type runAs struct {
	cred *syscall.Credential
	name string
}

// vitessErr names the bed in a user lookup's error; a missing user counts
// as a bed that cannot run here (ErrNoBinaries: skipped outside CI).
func vitessErr(err error) error {
	if errors.Is(err, bins.ErrNoUser) {
		return fmt.Errorf("%w: %v", ErrNoBinaries, err)
	}
	return fmt.Errorf("vitessbed: %w", err)
}

func lookupRunAs(name string) (runAs, error) {
	cred, err := bins.Credential(name)
	switch {
	case err != nil:
		return runAs{}, vitessErr(err)
	case cred == nil:
		return runAs{name: "current user"}, nil
	}
	return runAs{name: name, cred: cred}, nil
}

// chown gives path to the user (nothing to do when not root).
func (r runAs) chown(path string) error {
	if r.cred == nil {
		return nil
	}
	return os.Lchown(path, int(r.cred.Uid), int(r.cred.Gid))
}

// command is a command run as the user with the bed's environment: HOME in
// the bed's directory (the user's own is /nonexistent), a PATH with the
// Vitess binaries, etcd and /usr/sbin (mariadbd), VTDATAROOT (where
// mysqlctl and vttablet find each tablet's MariaDB) and EXTRA_MY_CNF (the
// bed's MariaDB settings, added to every my.cnf mysqlctl writes).
func (c *Cluster) command(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = c.Dir
	cmd.Env = []string{
		"HOME=" + filepath.Join(c.Dir, "home"),
		"PATH=" + strings.Join([]string{c.bin.Vitess, c.bin.Etcd, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}, ":"),
		"VTDATAROOT=" + c.Dir,
		"EXTRA_MY_CNF=" + filepath.Join(c.Dir, "extra.cnf"),
		"TMPDIR=" + filepath.Join(c.Dir, "tmp"),
		"LANG=C.UTF-8",
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.as.cred}
	return cmd
}

// server is a long-running process of the bed (etcd, vtctld, a vttablet,
// vtgate), restartable with the same arguments; its output goes to its log,
// appended to across restarts.
type server struct {
	name string
	log  string
	bin  string
	args []string

	mu   sync.Mutex
	proc *testbed.Proc
}

// start runs the server, in a process group of its own (Stop and Kill reach
// what it starts) and killed if this process dies without stopping it.
func (c *Cluster) start(s *server) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil && !s.proc.Exited() {
		return nil
	}
	fmt.Fprintf(logFile(s.log), "\n=== vitessbed: %s %s\n", s.bin, strings.Join(s.args, " "))
	p, err := testbed.StartCmd(s.log, c.command(context.Background(), s.bin, s.args...))
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	s.proc = p
	return nil
}

// logFile opens a log for appending a marker; it is closed when written.
func logFile(path string) *closingWriter { return &closingWriter{path: path} }

type closingWriter struct{ path string }

func (w *closingWriter) Write(b []byte) (int, error) {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Write(b)
}

// running reports whether the server's process is up.
func (s *server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.Exited()
}

// exited is closed once the current process has ended (a nil server or one
// never started: already).
func (s *server) exited() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		done := make(chan struct{})
		close(done)
		return done
	}
	return s.proc.Done()
}

// stop ends the server: SIGTERM to its group, SIGKILL after 45 s.
func (s *server) stop() {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		p.Stop()
	}
}

// kill ends the server with SIGKILL, a crash.
func (s *server) kill() {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// pid is the running process's ID, 0 when not running.
func (s *server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.Exited() {
		return 0
	}
	return s.proc.Pid()
}

// tail is the end of the server's log.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// run runs a one-shot command as the user, its output appended to log, and
// returns the output with the error.
func (c *Cluster) run(ctx context.Context, log, bin string, args ...string) (string, error) {
	return runCmd(c.command(ctx, bin, args...), log)
}

// runCmd runs cmd in a process group of its own, so what it leaves running
// (mysqlctl's mysqld_safe and mariadbd) can be found and ended by the
// group's ID, cmd.Process.Pid.
func runCmd(cmd *exec.Cmd, log string) (string, error) {
	cmd.SysProcAttr.Setpgid = true
	out, err := cmd.CombinedOutput()
	fmt.Fprintf(logFile(log), "\n=== vitessbed: %s\n%s", strings.Join(cmd.Args, " "), out)
	if err != nil {
		return string(out), fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, lastLines(string(out), 20))
	}
	return string(out), nil
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Vtctldclient runs a vtctldclient command against the bed's vtctld
// ("GetTablets", "--keyspace", "commerce") and returns its output (standard
// output and error together); its log is vtctldclient.log in Dir.
func (c *Cluster) Vtctldclient(ctx context.Context, args ...string) (string, error) {
	return c.run(ctx, filepath.Join(c.Dir, "vtctldclient.log"), filepath.Join(c.bin.Vitess, "vtctldclient"),
		append([]string{"--server", c.addr.Vtctld}, args...)...)
}

// freePorts picks n distinct free loopback ports below the kernel's
// ephemeral range (32768 and up on Linux), at random: ports handed out by
// listening on port 0 are reused by the kernel soon after they are closed,
// and another test process starting a server at the same time could take
// one first. They are from 20000 to 25999: pgbed's are above, so that a
// PostgreSQL of a test package running beside this one's cannot take a
// port picked here before its server binds it (seen once: a vttablet's
// HTTP port taken while the tablets' MariaDB started).
func freePorts(n int) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for attempts := 0; len(out) < n; attempts++ {
		if attempts > 100*n {
			return nil, errors.New("vitessbed: no free loopback ports")
		}
		port := 20000 + rand.IntN(6000)
		if seen[port] {
			continue
		}
		seen[port] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		out = append(out, port)
	}
	return out, nil
}

// poll calls f every interval until it reports done, returns an error
// marked permanent (a server that exited), or ctx ends; the last error f
// returned is in the timeout's.
func poll(ctx context.Context, interval time.Duration, f func() (bool, error)) error {
	var last error
	for {
		done, err := f()
		if done {
			return nil
		}
		var p permanentError
		if errors.As(err, &p) {
			return p.err
		}
		if err != nil {
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

// permanent marks an error poll must not wait out.
func permanent(err error) error { return permanentError{err} }

type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }

// pgroupAlive reports whether any process of group pgid is still alive (a
// zombie is not).
func pgroupAlive(pgid int) bool { return len(groupPids(pgid)) > 0 }

// can reports whether the user may access path with the permission bits
// want (4 read, 2 write, 1 search/execute), by its owner, group and other
// bits (the user has no supplementary groups).
func (r runAs) can(path string, want uint32) bool {
	if r.cred == nil {
		return true
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return false
	}
	perm := st.Mode & 0o7
	switch {
	case st.Uid == r.cred.Uid:
		perm = st.Mode >> 6 & 0o7
	case st.Gid == r.cred.Gid:
		perm = st.Mode >> 3 & 0o7
	}
	return perm&want == want
}

// canRun reports whether the user can reach dir and run each of names in it.
func (r runAs) canRun(dir string, names []string) bool {
	for d := dir; ; d = filepath.Dir(d) {
		if !r.can(d, 1) {
			return false
		}
		if d == "/" || d == "." {
			break
		}
	}
	for _, n := range names {
		if !r.can(filepath.Join(dir, n), 5) {
			return false
		}
	}
	return true
}

// reachable returns dir, or, when the user cannot run the binaries there (a
// checkout under /root, say), a copy of them in the temporary directory,
// made once per directory (hard links where the file system allows).
func (r runAs) reachable(dir string, names []string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if r.canRun(dir, names) {
		return dir, nil
	}
	h := fnv.New32a()
	h.Write([]byte(dir))
	dst := filepath.Join(os.TempDir(), fmt.Sprintf("tabletflow-vitess-%08x", h.Sum32()))
	if r.canRun(dst, names) {
		return dst, nil
	}
	tmp, err := os.MkdirTemp(os.TempDir(), "tabletflow-vitess-copy-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, n := range names {
		src, to := filepath.Join(dir, n), filepath.Join(tmp, n)
		if err := os.Link(src, to); err != nil {
			if err := copyFile(src, to); err != nil {
				return "", fmt.Errorf("vitessbed: copy the binaries for user %s: %w", r.name, err)
			}
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	// Another test process may have made it meanwhile: either copy will do.
	if err := os.Rename(tmp, dst); err != nil && !r.canRun(dst, names) {
		return "", err
	}
	if !r.canRun(dst, names) {
		return "", fmt.Errorf("vitessbed: user %s cannot run the binaries of %s, nor their copy in %s", r.name, dir, dst)
	}
	return dst, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
