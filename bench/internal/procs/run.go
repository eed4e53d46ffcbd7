package procs

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/tabletflow/tabletflow/bench/internal/publish"
)

// Run is what a benchmark of the real binaries in a temporary directory
// does around its measuring: its flags --bin, --out, --keep and the dev
// server's (DevServerFlags), the directory, and at the end what becomes
// of it. bench/pgsource and bench/vitess use it.
type Run struct {
	name      string
	bin       *string
	out       *string
	keep      *bool
	devServer func() []string
	bedStop   func() error
	bedLogs   func() string
}

// NewRun registers the run's flags on the command line's flag set; name
// is the command's, for its messages and its directory's name.
func NewRun(name string) *Run {
	return &Run{
		name:      name,
		bin:       flag.String("bin", "./bin", "directory holding temporal and worker"),
		out:       flag.String("out", "", "write the result JSON here too"),
		keep:      flag.Bool("keep", false, "keep the temporary directory (it is kept anyway when the run fails)"),
		devServer: DevServerFlags(),
	}
}

// Out is --out: where the result JSON goes too ("": nowhere else).
func (r *Run) Out() string { return *r.out }

// DevServer is the dev server's extra arguments, after flag.Parse.
func (r *Run) DevServer() []string { return r.devServer() }

// Start, after flag.Parse, makes the run's temporary directory dir
// (tabletflow-<name>-*) and returns it with --bin made absolute (a
// Group's Bin and Dir), and a context cancelled on SIGINT or SIGTERM
// (stop releases it).
func (r *Run) Start() (ctx context.Context, stop context.CancelFunc, bin, dir string, err error) {
	if bin, err = filepath.Abs(*r.bin); err != nil {
		return nil, nil, "", "", err
	}
	if dir, err = os.MkdirTemp("", "tabletflow-"+r.name+"-"); err != nil {
		return nil, nil, "", "", err
	}
	ctx, stop = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	return ctx, stop, bin, dir, nil
}

// Bed tells the run of the test bed it started: End stops it with stop
// (after the children and close; an error is logged) and, for a failed
// run, writes logs (the end of its servers' logs) to stderr.
func (r *Run) Bed(stop func() error, logs func() string) {
	r.bedStop, r.bedLogs = stop, logs
}

// End ends a run of the group g: it stops g's children, then close stops
// what else the run holds (clients), then the bed is stopped; then g.Dir
// is removed, or kept and named on stderr when the run failed or --keep
// asks. For a failed run the end of each child's log and of the bed's go
// to stderr first.
func (r *Run) End(g *Group, failed bool, close func()) {
	g.StopAll()
	close()
	if r.bedStop != nil {
		if err := r.bedStop(); err != nil {
			publish.Logf("stop the bed: %v", err)
		}
	}
	if failed || *r.keep {
		fmt.Fprintln(os.Stderr, r.name+": kept", g.Dir)
		if failed {
			g.DumpLogs(os.Stderr)
			if r.bedLogs != nil {
				fmt.Fprintln(os.Stderr, r.bedLogs())
			}
		}
		return
	}
	_ = os.RemoveAll(g.Dir)
}

// Main runs run and exits 1 with its error, prefixed with name, when it
// fails.
func Main(name string, run func() error) {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
