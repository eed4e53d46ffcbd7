// Package testbed starts the real parts that end-to-end tests and
// benchmarks run against: the project's binaries, a Temporal dev server
// (the Temporal CLI's `server start-dev`) on free loopback ports with
// tabletflow's search attributes, and child processes that are stopped with
// their whole process group.
package testbed

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/workflows"
)

// Proc is a child process with its output in a log file.
type Proc struct {
	cmd  *exec.Cmd
	log  string
	once sync.Once
	done chan struct{}
}

// Start runs bin with args in its own process group, output to logPath.
func Start(logPath, bin string, args ...string) (*Proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	return start(f, exec.Command(bin, args...))
}

// StartCmd runs a prepared cmd like Start, its output appended to logPath
// (a restarted server keeps its earlier log). cmd may carry its own
// SysProcAttr, a Credential say; the process group and the parent-death
// signal are added to it.
func StartCmd(logPath string, cmd *exec.Cmd) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return start(f, cmd)
}

func start(f *os.File, cmd *exec.Cmd) (*Proc, error) {
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, so Stop reaches whatever it starts; and killed
	// if the starting program dies without its cleanup.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pdeathsig = true, syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &Proc{cmd: cmd, log: f.Name(), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// Pid is the process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Log is the path of the process's log.
func (p *Proc) Log() string { return p.log }

// Stop sends SIGTERM to the process group and waits, then SIGKILL.
func (p *Proc) Stop() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(45 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
}

// Kill sends SIGKILL: a crash, with no chance to clean up.
func (p *Proc) Kill() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
}

// Tail returns the end of the process's log.
func (p *Proc) Tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr returns "127.0.0.1:<free port>".
func FreeAddr() (string, error) {
	p, err := FreePort()
	return fmt.Sprintf("127.0.0.1:%d", p), err
}

// Build compiles packages of the module at root into outDir, without cgo
// as the Makefile and the Dockerfile build them (the worker sets its timer
// slack only in a binary without cgo).
func Build(root, outDir string, pkgs ...string) error {
	cmd := exec.Command("go", append([]string{"build", "-o", outDir + "/"}, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %v: %w", pkgs, err)
	}
	return nil
}

// DevServer is a running Temporal dev server.
type DevServer struct {
	*Proc
	Addr string // frontend host:port
	UI   string // Web UI base URL

	cli, log string
	args     []string
}

// SQLiteWAL are dev server flags that run its SQLite database in WAL mode
// with synchronous=NORMAL: a commit waits for no fsync of its own, and a
// crash of the server process (SIGKILL) still loses nothing; only a crash
// of the machine can lose the last commits. With the dev server's own
// settings every persistence write waits for an fsync and the single
// database serialises them all, so on a slow disk the server, not
// tabletflow, sets the pace. The benchmarks that start a dev server
// (bench/throughput, bench/reaction, bench/scale, bench/pgsource) take
// --sqlite-defaults to run it with its own settings and measure the
// difference; see docs/benchmarks.md.
var SQLiteWAL = []string{"--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=NORMAL"}

// StartDevServer runs `temporal server start-dev` on free loopback ports
// with tabletflow's search attributes registered and its database in dir,
// and waits until it answers. extra are more flags
// (--dynamic-config-value ...).
func StartDevServer(temporalCLI, dir string, extra ...string) (*DevServer, error) {
	ports := make([]int, 4)
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	s := &DevServer{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), UI: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		cli: temporalCLI, log: filepath.Join(dir, "temporal.log")}
	s.args = []string{"server", "start-dev", "--ip", "127.0.0.1", "--port", strconv.Itoa(ports[0]),
		"--ui-port", strconv.Itoa(ports[1]), "--http-port", strconv.Itoa(ports[2]), "--metrics-port", strconv.Itoa(ports[3]),
		"--db-filename", filepath.Join(dir, "temporal.db"), "--log-level", "warn"}
	for _, sa := range workflows.SearchAttributes {
		s.args = append(s.args, "--search-attribute", sa+"=Keyword")
	}
	s.args = append(s.args, extra...)
	if err := s.start(); err != nil {
		return nil, err // not a server with no process for a caller to stop
	}
	return s, nil
}

// Restart kills the server with SIGKILL (a crash: nothing flushed on the
// way out) and starts it again on the same ports and database file. The
// new process replaces Proc: stop the server with s.Stop() at the time,
// not a method value taken before the restart.
func (s *DevServer) Restart() error {
	s.Kill()
	return s.start()
}

// start runs the server (its log appended to: a restart keeps what the
// crashed run wrote) and waits until it answers.
func (s *DevServer) start() error {
	p, err := StartCmd(s.log, exec.Command(s.cli, s.args...))
	if err != nil {
		return err
	}
	s.Proc = p
	deadline := time.Now().Add(90 * time.Second)
	for {
		c, err := client.Dial(client.Options{HostPort: s.Addr, Logger: temporalclient.Quiet{}})
		if err == nil {
			_, err = c.CheckHealth(context.Background(), &client.CheckHealthRequest{})
			c.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			p.Stop()
			return fmt.Errorf("dev server did not come up in 90s: %v\n%s", err, p.Tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Memory reads a process's current and peak resident set size in MiB.
func Memory(pid int) (rss, hwm float64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			hwm = kb / 1024
		}
	}
	return rss, hwm, sc.Err()
}
