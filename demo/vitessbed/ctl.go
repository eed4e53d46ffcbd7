package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

// defaultSocket is the control socket, relative to the repository (where
// make runs the demo and where its printed commands run).
const defaultSocket = ".data/vitessbed.sock"

// ctlCommands are what ctl asks of the bed: the tablets (no alias), or an
// action on one tablet.
var ctlCommands = map[string]string{
	"tablets":           "list every tablet: its vttablet, replication and GTID position",
	"stop-replication":  "STOP SLAVE on a replica: it falls behind its primary",
	"start-replication": "START SLAVE on a replica, and wait until it caught up",
	"kill":              "kill a vttablet with SIGKILL, as a crash would (its MariaDB runs on)",
	"restart":           "start a killed vttablet again, and wait until it serves",
}

// ctl sends one command to the running bed and prints its answer.
func ctl(args []string) error {
	fs := flag.NewFlagSet("vitessbed ctl", flag.ContinueOnError)
	socket := fs.String("socket", defaultSocket, "the running bed's control socket")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: vitessbed ctl [--socket S] COMMAND [ALIAS]")
		for _, c := range []string{"tablets", "stop-replication", "start-replication", "kill", "restart"} {
			fmt.Fprintf(fs.Output(), "  %-18s %s\n", c, ctlCommands[c])
		}
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	cmd, rest := fs.Arg(0), fs.Args()
	if len(rest) > 0 {
		rest = rest[1:]
	}
	if _, ok := ctlCommands[cmd]; !ok {
		fs.Usage()
		if cmd == "" {
			return errors.New("ctl: a command is required")
		}
		return fmt.Errorf("ctl: unknown command %q", cmd)
	}
	method, path := http.MethodPost, "/"+cmd+"/"
	switch {
	case cmd == "tablets" && len(rest) == 0:
		method, path = http.MethodGet, "/tablets"
	case cmd != "tablets" && len(rest) == 1 && rest[0] != "":
		path += rest[0]
	case cmd == "tablets":
		return errors.New("ctl tablets: takes no alias")
	default:
		return fmt.Errorf("ctl %s: takes one tablet alias (zone2-0000000101)", cmd)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", *socket)
	}}}
	req, err := http.NewRequest(method, "http://vitessbed"+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("no bed answers on %s (is make demo-vitess running?): %w", *socket, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return errors.New(strings.TrimSpace(string(body)))
	}
	fmt.Print(string(body))
	return nil
}

// serveCtl serves ctl's commands on a unix socket at path until ctx ends;
// the channel is closed once the server is shut down and the socket gone.
func serveCtl(ctx context.Context, c *vitessbed.Cluster, path string) (<-chan struct{}, error) {
	if conn, err := net.Dial("unix", path); err == nil {
		conn.Close()
		return nil, fmt.Errorf("control socket %s: another bed answers there", path)
	}
	_ = os.Remove(path) // left by a run that was killed
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /tablets", func(w http.ResponseWriter, r *http.Request) { listTablets(r.Context(), w, c) })
	mux.HandleFunc("POST /{cmd}/{alias}", func(w http.ResponseWriter, r *http.Request) {
		t := c.Tablet(r.PathValue("alias"))
		if t == nil {
			http.Error(w, fmt.Sprintf("no tablet %q: the tablets are %s", r.PathValue("alias"), aliases(c)), http.StatusNotFound)
			return
		}
		msg, err := act(r.Context(), t, r.PathValue("cmd"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		fmt.Printf("ctl: %s\n", msg)
		fmt.Fprintln(w, msg)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			_ = srv.Close()
		}
	}()
	return done, nil
}

// act carries out one of ctl's commands on a tablet and says what it did.
func act(ctx context.Context, t *vitessbed.Tablet, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	switch cmd {
	case "stop-replication":
		if err := t.StopReplication(ctx); err != nil {
			return "", err
		}
		pos, err := t.Position(ctx)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: replication stopped at %s; the shard's primary moves on without it", t.Alias, pos), nil
	case "start-replication":
		if err := t.StartReplication(ctx); err != nil {
			return "", err
		}
		if err := t.WaitCaughtUp(ctx); err != nil {
			return "", fmt.Errorf("%s: replication started, not caught up: %w", t.Alias, err)
		}
		pos, err := t.Position(ctx)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: replication started, caught up with its primary at %s", t.Alias, pos), nil
	case "kill":
		pid := t.Pid()
		if pid == 0 {
			return "", fmt.Errorf("%s: its vttablet is not running (ctl restart %s starts it)", t.Alias, t.Alias)
		}
		t.Kill()
		return fmt.Sprintf("%s: vttablet (pid %d) killed; its MariaDB runs on", t.Alias, pid), nil
	case "restart":
		if t.Running() {
			return "", fmt.Errorf("%s: its vttablet runs (pid %d)", t.Alias, t.Pid())
		}
		if err := t.Restart(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: vttablet (pid %d) serving again", t.Alias, t.Pid()), nil
	}
	return "", fmt.Errorf("unknown command %q", cmd)
}

// listTablets writes a line per tablet: its vttablet, and a replica's
// replication, with each tablet's GTID position.
func listTablets(ctx context.Context, w io.Writer, c *vitessbed.Cluster) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ALIAS\tSHARD\tTYPE\tVTTABLET\tREPLICATION\tPOSITION")
	for _, t := range c.Tablets() {
		vttablet := "down"
		if pid := t.Pid(); pid != 0 {
			vttablet = fmt.Sprintf("pid %d", pid)
		}
		repl := "-"
		if t.Type == "REPLICA" {
			switch st, err := t.Replication(ctx); {
			case err != nil:
				repl = "? " + err.Error()
			case st.IORunning && st.SQLRunning:
				repl = "running"
			default:
				repl = "stopped"
			}
		}
		pos, err := t.Position(ctx)
		if err != nil {
			pos = "? " + err.Error()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Alias, t.Shard, t.Type, vttablet, repl, pos)
	}
	tw.Flush()
}

func aliases(c *vitessbed.Cluster) string {
	var out []string
	for _, t := range c.Tablets() {
		out = append(out, t.Alias)
	}
	return strings.Join(out, ", ")
}
