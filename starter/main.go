// Command starter starts and watches tabletflow streams. Everything it does
// can also be done with the Temporal CLI alone (see docs/operating.md).
//
//	starter start -f orders.json [--id orders]
//	starter status orders [--watch]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	_ "github.com/tabletflow/tabletflow/adapters" // the kinds config.DecodeForStart checks
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/workflows"
)

const usage = `usage:
  starter start -f STREAM.json [--id ID]   validate the config locally, start the stream
  starter status ID [--watch] [--json]     per-tablet status (--watch: live, with records/s)
  starter exclude ID --aliases A,B [--tablet T] [--reason R] [--ttl 2h]
  starter include ID --aliases A,B
  starter pause|resume|retry ID [--tablets T1,T2]   (default: all tablets)
  starter resync ID --tablets T1,T2 [--reason R]   fresh start + copy of tablets (running ones stop first)
  starter snapshot ID --tables S.T1,S.T2 [--tablets T1,T2] [--reason R]   copy tables again while streaming
  starter snapshot-cancel ID [--reason R]
  starter stop ID [--drop-source-stream]
  starter configure ID [-f TUNABLES.json] [--tables S.T1,S.T2] [--reason R]
                                           tunables (selection, retry, autoExcludeTTL, batch, run)
                                           and/or the tables the stream reads (added ones are backfilled)
Operator commands run as updates (a bad request is an error here); --signal
sends them as signals instead.
connection flags (every command): --address --namespace --api-key --tls-ca --tls-cert --tls-key,
defaulting to the Temporal SDK's environment variables and config profile.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "start":
		err = start(args[1:], stdout, stderr)
	case "status":
		err = status(args[1:], stdout, stderr)
	case workflows.CmdExclude, workflows.CmdInclude, workflows.CmdPause, workflows.CmdResume,
		workflows.CmdRetry, workflows.CmdStop, workflows.CmdConfigure, workflows.CmdResync,
		workflows.CmdSnapshot, workflows.CmdSnapshotCancel:
		err = operator(args[0], args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = usageError{fmt.Errorf("unknown command %q", args[0])}
	}
	var u usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &u):
		fmt.Fprintf(stderr, "starter: %v\n%s", err, usage)
		return 2
	}
	fmt.Fprintf(stderr, "starter: %v\n", err)
	return 1
}

type usageError struct{ error }

// newFlags returns a flag set with the connection flags.
func newFlags(name string, stderr io.Writer, conn *temporalclient.Flags) *flag.FlagSet {
	fs := flag.NewFlagSet("starter "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	conn.Register(fs)
	return fs
}

func dial(conn *temporalclient.Flags) (client.Client, client.Options, error) {
	opts, err := conn.Options(temporalclient.Quiet{})
	if err != nil {
		return nil, opts, err
	}
	c, err := client.Dial(opts)
	if err != nil {
		return nil, opts, fmt.Errorf("connect to Temporal at %s: %w", opts.HostPort, err)
	}
	return c, opts, nil
}

// maxConfigBytes bounds a stream config: it is the stream's input, kept
// in its state across continue-as-new.
const maxConfigBytes = 256 << 10

func start(args []string, stdout, stderr io.Writer) error {
	var conn temporalclient.Flags
	fs := newFlags("start", stderr, &conn)
	file := fs.String("f", "", "stream config JSON file (required)")
	id := fs.String("id", "", "stream ID, the workflow ID (default: the file's base name)")
	ui := fs.String("ui", "http://localhost:8233", "Temporal Web UI base URL, for the printed link")
	taskQueue := fs.String("task-queue", workflows.TaskQueue, "task queue the workers poll")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if *file == "" {
		return usageError{errors.New("start: -f is required")}
	}
	data, err := os.ReadFile(*file)
	if err != nil {
		return err
	}
	if len(data) > maxConfigBytes {
		return fmt.Errorf("%s: %d bytes, at most %d (the config travels in the stream's history, whose payloads the server caps at 2 MB)", *file, len(data), maxConfigBytes)
	}
	if _, err := config.DecodeForStart(data); err != nil {
		return fmt.Errorf("%s: %w", *file, err)
	}
	if *id == "" {
		*id = strings.TrimSuffix(filepath.Base(*file), filepath.Ext(*file))
	}
	c, opts, err := dial(&conn)
	if err != nil {
		return err
	}
	defer c.Close()
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{
		ID:                    *id,
		TaskQueue:             *taskQueue,
		StaticSummary:         "CDC stream " + *id,
		TypedSearchAttributes: temporal.NewSearchAttributes(workflows.SAStream.ValueSet(*id)),
	}, "StreamWorkflow", json.RawMessage(data))
	if err != nil {
		return fmt.Errorf("start stream %s: %w", *id, err)
	}
	fmt.Fprintf(stdout, "stream %s started (run %s)\n", run.GetID(), run.GetRunID())
	fmt.Fprintf(stdout, "Web UI: %s/namespaces/%s/workflows/%s\n", strings.TrimRight(*ui, "/"), opts.Namespace, run.GetID())
	fmt.Fprintf(stdout, "status: starter status %s --watch\n", run.GetID())
	return nil
}

func status(args []string, stdout, stderr io.Writer) error {
	var conn temporalclient.Flags
	fs := newFlags("status", stderr, &conn)
	watch := fs.Bool("watch", false, "refresh until interrupted, with records/s")
	interval := fs.Duration("interval", 2*time.Second, "refresh interval for --watch")
	asJSON := fs.Bool("json", false, "print the status query's JSON (with the heartbeats read now unless --live=false)")
	liveFigures := fs.Bool("live", true, "read each running tablet's last heartbeat now, not only as of the stream's last read (docs/operating.md#live-status)")
	id, err := parseID(fs, args)
	if err != nil {
		return err
	}
	c, opts, err := dial(&conn)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var prev map[string]int64
	var prevAt time.Time
	for {
		st, err := queryStatus(ctx, c, id)
		if err != nil {
			return err
		}
		if *liveFigures {
			st = withLive(ctx, c, opts.DataConverter, st)
		}
		age := liveAge(st, time.Now())
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(st)
		}
		if *watch {
			fmt.Fprint(stdout, "\033[H\033[2J")
		}
		printStatus(stdout, st, age, prev, time.Since(prevAt))
		if !*watch {
			return nil
		}
		prev, prevAt = records(st), time.Now()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

func queryStatus(ctx context.Context, c client.Client, id string) (workflows.StreamStatus, error) {
	var st workflows.StreamStatus
	v, err := c.QueryWorkflow(ctx, id, "", workflows.QueryStatus)
	if err != nil {
		return st, fmt.Errorf("query status of %s: %w", id, err)
	}
	return st, v.Get(&st)
}

func records(st workflows.StreamStatus) map[string]int64 {
	out := map[string]int64{}
	for _, t := range st.Tablets {
		out[t.ID] = t.Records
	}
	return out
}

// printStatus prints st as a table; age is how old each tablet's live
// figures are (withLive; none: as of its last run's end), prev the
// records of the last refresh, since long ago, for the rates.
func printStatus(w io.Writer, st workflows.StreamStatus, age map[string]time.Duration, prev map[string]int64, since time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "stream %s\n", st.Stream)
	fmt.Fprintln(tw, "TABLET\tSTATE\tREPLICA\tCHECKPOINT\tRECORDS\tREC/S\tLAG\tLIVE\tATTEMPT\tEXCLUDED\tWHY / LAST ERROR")
	var total, delta int64
	streaming := 0
	for _, t := range st.Tablets {
		total += t.Records
		if t.State == workflows.Streaming {
			streaming++
		}
		rate := "-"
		// A run that just ended and was not reported yet shows its
		// successor's few records for one refresh: no rate then.
		if p, ok := prev[t.ID]; ok && since > 0 && t.Records >= p {
			rate = fmt.Sprintf("%.0f", float64(t.Records-p)/since.Seconds())
			delta += t.Records - p
		}
		liveAge := "-"
		if a, ok := age[t.ID]; ok {
			liveAge = a.Round(time.Second).String()
		}
		why := t.Reason
		if t.LastError != "" {
			why = strings.TrimSpace(why + " " + t.LastError)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%.1fs\t%s\t%d\t%d\t%s\n", t.ID, t.State, dash(t.Replica), dash(t.Checkpoint.String()),
			t.Records, rate, t.LagSeconds, liveAge, t.Attempt, len(t.Excluded), truncate(why, 80))
	}
	_ = tw.Flush()
	totalRate := "-"
	if prev != nil && since > 0 {
		totalRate = fmt.Sprintf("%.0f", float64(delta)/since.Seconds())
	}
	fmt.Fprintf(w, "total: %d records, %s rec/s, %d of %d tablets streaming\n", total, totalRate, streaming, len(st.Tablets))
	if tc := st.TablesChange; tc != nil {
		fmt.Fprintf(w, "tables %s: %s, %s -> %s (added %s, removed %s; asked %s)\n", tc.ID, tc.State, strings.Join(tc.From, ","),
			strings.Join(tc.Tables, ","), dash(strings.Join(tc.Added, ",")), dash(strings.Join(tc.Removed, ",")), tc.Asked.Format(time.RFC3339))
		if tc.Error != "" {
			fmt.Fprintf(w, "tables %s failed: %s\n", tc.ID, tc.Error)
		}
		if tc.Backfill != "" {
			fmt.Fprintf(w, "tables %s: the tables added are backfilled by %s\n", tc.ID, tc.Backfill)
		}
	}
	if sn := st.Snapshot; sn != nil {
		fmt.Fprintf(w, "snapshot %s of %s on %d tablets: %s, %d done, %d failed (asked %s)\n", sn.ID, strings.Join(sn.Tables, ","),
			len(sn.Tablets), sn.State, len(sn.Done), len(sn.Failed), sn.Asked.Format(time.RFC3339))
		for _, id := range slices.Sorted(maps.Keys(sn.Failed)) {
			fmt.Fprintf(w, "snapshot %s failed on %s: %s\n", sn.ID, id, sn.Failed[id])
		}
	}
	for _, t := range st.Tablets {
		if c := t.Copy; c != nil && !c.Done {
			fmt.Fprintf(w, "copy %s: %s %s, %d of %d tables done, at %s, %d rows copied (the tables hold ~%d)\n",
				t.ID, c.Kind, dash(c.ID), c.TablesDone, c.Tables, dash(c.Table), c.Rows, c.Estimate)
		}
	}
	for _, e := range st.Exclude {
		fmt.Fprintf(w, "excluded %s %s: %s (until %s)\n", e.Alias, e.Tablet, e.Reason, until(e.Expires))
	}
	for _, r := range st.Rejected {
		fmt.Fprintf(w, "rejected %s at %s: %s\n", r.Signal, r.At.Format(time.RFC3339), r.Reason)
	}
}

func until(t time.Time) string {
	if t.IsZero() {
		return "lifted"
	}
	return t.Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func parseArgs(fs *flag.FlagSet, args []string, positional int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() != positional {
		return usageError{fmt.Errorf("%s: want %d argument(s), got %v", fs.Name(), positional, fs.Args())}
	}
	return nil
}

// parseID accepts the stream ID before or after the flags.
func parseID(fs *flag.FlagSet, args []string) (string, error) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		if err := parseArgs(fs, args[1:], 0); err != nil {
			return "", err
		}
		return args[0], nil
	}
	if err := parseArgs(fs, args, 1); err != nil {
		return "", err
	}
	return fs.Arg(0), nil
}
