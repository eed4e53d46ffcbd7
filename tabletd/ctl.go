package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	tabletdclient "github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

const ctlUsage = `usage: tabletd ctl [--addr ADDR] COMMAND
commands:
  list [--json]                       tablets, replicas, health, lag
  workload status|pause|resume|stop   the write workload (stop is for good)
  workload rate N                     records per second
  digest [--stream ID]                records produced (or due to stream ID) and their hash
  rows [--table T] [--tablet ID]      the workload's current rows, one JSON object a line
  fault --server ALIAS [--tablet ID] [--down] [--not-serving] [--position-mismatch]
        [--code CODE [--error-rate R]] [--latency D] [--lag D] [--unhealthy]
  fault --topology-down [--for D]     Topology RPCs answer UNAVAILABLE (for D, or until healed)
  heal --server ALIAS [--tablet ID]   undo a server's (or one replica's) faults
  heal --topology                     end --topology-down
  split --tablet ID                   split a tablet in two
  tail --tablet ID [--from POS]       print a tablet's changes as they are written
  stream describe|delete ID           a source-side stream
  resync --stream ID --tablet ID [--id RID]
                                      give a stream's tablet a fresh start with a copy of its rows
ADDR defaults to $TABLETD_ADDR, then 127.0.0.1:15991. TLS: --tls-ca (and
--tls-cert/--tls-key for mutual TLS), or $TABLETD_TLS_CA/_CERT/_KEY; a
server's bearer token (serve --token-env) comes from $TABLETD_TOKEN.
`

// ctlClients are the admin and topology clients on one connection.
type ctlClients struct {
	admin sourcepb.AdminClient
	topo  sourcepb.TopologyClient
}

func ctl(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tabletd ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, ctlUsage) }
	defAddr := os.Getenv("TABLETD_ADDR")
	if defAddr == "" {
		defAddr = "127.0.0.1:15991"
	}
	addr := fs.String("addr", defAddr, "tabletd topology/admin address")
	timeout := fs.Duration("timeout", 10*time.Second, "per-request timeout (not for tail)")
	var tlsFiles tlsfiles.Files
	fs.StringVar(&tlsFiles.CA, "tls-ca", os.Getenv("TABLETD_TLS_CA"), "dial TLS, verifying the server with this CA (PEM; default $TABLETD_TLS_CA)")
	fs.StringVar(&tlsFiles.Cert, "tls-cert", os.Getenv("TABLETD_TLS_CERT"), "client certificate for mutual TLS (default $TABLETD_TLS_CERT)")
	fs.StringVar(&tlsFiles.Key, "tls-key", os.Getenv("TABLETD_TLS_KEY"), "its private key (default $TABLETD_TLS_KEY)")
	if err := fs.Parse(args); err != nil {
		return usageErr(err)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return usageError{errors.New("ctl: no command")}
	}
	creds, err := tabletdclient.Credentials(tlsFiles)
	if err != nil {
		return usageError{fmt.Errorf("tls: %w", err)}
	}
	dial := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if token := os.Getenv("TABLETD_TOKEN"); token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(tabletdclient.Bearer(token, !tlsFiles.IsZero())))
	}
	conn, err := grpc.NewClient(*addr, dial...)
	if err != nil {
		return err
	}
	defer conn.Close()
	cl := ctlClients{admin: sourcepb.NewAdminClient(conn), topo: sourcepb.NewTopologyClient(conn)}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	if cmd == "tail" {
		return ctlTail(context.Background(), cl, rest, stdout, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch cmd {
	case "list":
		err = ctlList(ctx, cl, rest, stdout, stderr)
	case "workload":
		err = ctlWorkload(ctx, cl, rest, stdout)
	case "digest":
		err = ctlDigest(ctx, cl, rest, stdout, stderr)
	case "rows":
		err = ctlRows(ctx, cl, rest, stdout, stderr)
	case "fault":
		err = ctlFault(ctx, cl, rest, stdout, stderr)
	case "heal":
		err = ctlHeal(ctx, cl, rest, stdout, stderr)
	case "split":
		err = ctlSplit(ctx, cl, rest, stdout, stderr)
	case "stream":
		err = ctlStream(ctx, cl, rest, stdout)
	case "resync":
		err = ctlResync(ctx, cl, rest, stdout, stderr)
	default:
		fs.Usage()
		return usageError{fmt.Errorf("ctl: unknown command %q", cmd)}
	}
	return describeErr(err)
}

// describeErr turns a status into "CODE (REASON): message".
func describeErr(err error) error {
	if err == nil {
		return nil
	}
	var u usageError
	if errors.As(err, &u) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	reason := ""
	for _, d := range st.Details() {
		if info, ok := d.(*sourcepb.ErrorInfo); ok && info.Reason != sourcepb.Reason_REASON_UNSPECIFIED {
			reason = " " + info.Reason.String()
		}
	}
	return fmt.Errorf("%s%s: %s", st.Code(), reason, st.Message())
}

func flags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("tabletd ctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return usageErr(err)
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func ctlList(ctx context.Context, cl ctlClients, args []string, stdout, stderr io.Writer) error {
	fs := flags("list", stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	resp, err := cl.topo.ListTablets(ctx, &sourcepb.ListTabletsRequest{})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, resp.Tablets)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLET\tSTATE\tPOSITIONS\tREPLICA\tTYPE\tADDRESS\tSERVING\tHEALTHY\tLAG")
	for _, t := range resp.Tablets {
		state := t.State.String()
		if len(t.Children) > 0 {
			state += " → " + strings.Join(t.Children, ",") + " at " + t.SplitCheckpoint
		}
		positions := "-"
		if t.FirstPosition != "" {
			positions = t.FirstPosition + ".." + t.LastPosition
		}
		for i, r := range t.Replicas {
			id, st, pos := t.Id, state, positions
			if i > 0 {
				id, st, pos = "", "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%v\t%v\t%v\n", id, st, pos, r.Alias, r.Type, r.Address,
				r.Serving, r.Healthy, r.Lag.AsDuration().Round(time.Millisecond))
		}
	}
	return tw.Flush()
}

func ctlWorkload(ctx context.Context, cl ctlClients, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("workload: want status, pause, resume, stop or rate N")}
	}
	req := &sourcepb.WorkloadRequest{}
	switch args[0] {
	case "status":
		req.Action = sourcepb.WorkloadRequest_STATUS
	case "pause":
		req.Action = sourcepb.WorkloadRequest_PAUSE
	case "resume":
		req.Action = sourcepb.WorkloadRequest_RESUME
	case "stop":
		req.Action = sourcepb.WorkloadRequest_STOP
	case "rate":
		if len(args) != 2 {
			return usageError{errors.New("workload rate: want one number, records per second")}
		}
		r, err := strconv.ParseFloat(args[1], 64)
		if err != nil {
			return usageError{fmt.Errorf("workload rate: %q is not a number", args[1])}
		}
		req.Action, req.Rate = sourcepb.WorkloadRequest_RATE, r
		args = args[1:]
	default:
		return usageError{fmt.Errorf("workload: unknown action %q", args[0])}
	}
	if len(args) > 1 {
		return usageError{fmt.Errorf("workload: unexpected argument %q", args[1])}
	}
	resp, err := cl.admin.Workload(ctx, req)
	if err != nil {
		return err
	}
	return printJSON(stdout, map[string]any{"state": resp.State, "rate": resp.Rate, "records": resp.Records})
}

// DigestJSON is what `ctl digest` prints.
type DigestJSON struct {
	Records uint64                `json:"records"`
	Hash    string                `json:"hash"`
	Tablets map[string]TabletJSON `json:"tablets"`
}

// TabletJSON is one tablet's part of a digest.
type TabletJSON struct {
	Records uint64 `json:"records"`
	Hash    string `json:"hash"`
}

func ctlDigest(ctx context.Context, cl ctlClients, args []string, stdout, stderr io.Writer) error {
	fs := flags("digest", stderr)
	stream := fs.String("stream", "", "only what this stream is due")
	if err := parse(fs, args); err != nil {
		return err
	}
	resp, err := cl.admin.Digest(ctx, &sourcepb.DigestRequest{Stream: *stream})
	if err != nil {
		return err
	}
	out := DigestJSON{Records: resp.Records, Hash: digest.HashHex(resp.Hash), Tablets: map[string]TabletJSON{}}
	for id, d := range resp.Tablets {
		out.Tablets[id] = TabletJSON{Records: d.Records, Hash: digest.HashHex(d.Hash)}
	}
	return printJSON(stdout, out)
}

// RowJSON is a line of `ctl rows`.
type RowJSON struct {
	Table string          `json:"table"`
	Key   json.RawMessage `json:"key"`
	Row   json.RawMessage `json:"row"`
}

func ctlRows(ctx context.Context, cl ctlClients, args []string, stdout, stderr io.Writer) error {
	fs := flags("rows", stderr)
	table := fs.String("table", "", "only this table")
	tablet := fs.String("tablet", "", "only the rows of this tablet's key range")
	if err := parse(fs, args); err != nil {
		return err
	}
	resp, err := cl.admin.Rows(ctx, &sourcepb.RowsRequest{Table: *table, Tablet: *tablet})
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	for _, r := range resp.Rows {
		if err := enc.Encode(RowJSON{Table: r.Table, Key: r.Key, Row: r.Row}); err != nil {
			return err
		}
	}
	return nil
}

func ctlFault(ctx context.Context, cl ctlClients, args []string, stdout, stderr io.Writer) error {
	fs := flags("fault", stderr)
	req := &sourcepb.FaultRequest{}
	fs.StringVar(&req.Server, "server", "", "tablet server alias (required unless --topology-down)")
	fs.StringVar(&req.Tablet, "tablet", "", "limit the fault to this tablet's replica on the server")
	fs.BoolVar(&req.Down, "down", false, "close the server's listener (server-wide)")
	fs.BoolVar(&req.NotServing, "not-serving", false, "answer FAILED_PRECONDITION NOT_SERVING")
	fs.BoolVar(&req.PositionMismatch, "position-mismatch", false, "the replica lost its history: INVALID_ARGUMENT POSITION_MISMATCH")
	fs.StringVar(&req.Code, "code", "", "answer this gRPC code (UNAVAILABLE, ...)")
	fs.Float64Var(&req.ErrorRate, "error-rate", 0, "fraction of requests that get --code (default 1)")
	fs.BoolVar(&req.Unhealthy, "unhealthy", false, "report the replica unhealthy in the topology")
	fs.BoolVar(&req.TopologyDown, "topology-down", false, "every Topology RPC answers UNAVAILABLE (cluster-wide: no --server)")
	latency := fs.Duration("latency", 0, "add latency to every request")
	lag := fs.Duration("lag", 0, "add replication lag")
	forD := fs.Duration("for", 0, "with --topology-down: heal by itself after this long (default: until healed)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var set []string
	fs.Visit(func(f *flag.Flag) {
		set = append(set, f.Name)
		switch f.Name {
		case "latency":
			req.Latency = durationpb.New(*latency)
		case "lag":
			req.Lag = durationpb.New(*lag)
		case "for":
			req.Duration = durationpb.New(*forD)
		}
	})
	if req.TopologyDown {
		for _, name := range set {
			if name != "topology-down" && name != "for" {
				return usageError{fmt.Errorf("fault: --topology-down takes no --%s (only --for)", name)}
			}
		}
		if _, err := cl.admin.Fault(ctx, req); err != nil {
			return err
		}
		until := "until healed"
		if req.Duration != nil {
			until = "for " + forD.String()
		}
		fmt.Fprintf(stdout, "topology down (fault injected) %s\n", until)
		return nil
	}
	if req.Duration != nil {
		return usageError{errors.New("fault: --for needs --topology-down")}
	}
	if req.Server == "" {
		return usageError{errors.New("fault: --server is required (or --topology-down)")}
	}
	if _, err := cl.admin.Fault(ctx, req); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fault injected on %s%s\n", req.Server, onTablet(req.Tablet))
	return nil
}

func onTablet(t string) string {
	if t == "" {
		return ""
	}
	return " for tablet " + t
}

func ctlHeal(ctx context.Context, cl ctlClients, args []string, stdout, stderr io.Writer) error {
	fs := flags("heal", stderr)
	req := &sourcepb.HealRequest{}
	fs.StringVar(&req.Server, "server", "", "tablet server alias (required unless --topology)")
	fs.StringVar(&req.Tablet, "tablet", "", "heal only this tablet's replica")
	fs.BoolVar(&req.Topology, "topology", false, "end --topology-down (no --server)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if req.Topology {
		if req.Server != "" || req.Tablet != "" {
			return usageError{errors.New("heal: --topology takes no --server or --tablet")}
		}
		if _, err := cl.admin.Heal(ctx, req); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "healed the topology")
		return nil
	}
	if req.Server == "" {
		return usageError{errors.New("heal: --server is required (or --topology)")}
	}
	if _, err := cl.admin.Heal(ctx, req); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "healed %s%s\n", req.Server, onTablet(req.Tablet))
	return nil
}

func ctlSplit(ctx context.Context, cl ctlClients, args []string, stdout, stderr io.Writer) error {
	fs := flags("split", stderr)
	tablet := fs.String("tablet", "", "tablet to split (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *tablet == "" {
		return usageError{errors.New("split: --tablet is required")}
	}
	resp, err := cl.admin.Split(ctx, &sourcepb.SplitRequest{Tablet: *tablet})
	if err != nil {
		return err
	}
	return printJSON(stdout, map[string]any{"tablet": *tablet, "children": resp.Children, "handoff": resp.HandoffCheckpoint})
}

// RecordJSON is one line of `ctl tail`: the JSONL sink's shape, without
// the stream.
type RecordJSON struct {
	Tablet     string          `json:"tablet"`
	Position   string          `json:"position"`
	Table      string          `json:"table"`
	Op         string          `json:"op"`
	Key        json.RawMessage `json:"key"`
	Before     json.RawMessage `json:"before"`
	After      json.RawMessage `json:"after"`
	CommitTime string          `json:"commitTime"`
}

func ctlTail(ctx context.Context, cl ctlClients, args []string, stdout, stderr io.Writer) error {
	fs := flags("tail", stderr)
	tablet := fs.String("tablet", "", "tablet to follow (required)")
	from := fs.String("from", "", "start after this position (default: the current end)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *tablet == "" {
		return usageError{errors.New("tail: --tablet is required")}
	}
	stream, err := cl.admin.Tail(ctx, &sourcepb.TailRequest{Tablet: *tablet, From: *from})
	if err != nil {
		return describeErr(err)
	}
	enc := json.NewEncoder(stdout)
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			fmt.Fprintf(stderr, "tablet %s ended (split); `tabletd ctl list` shows its children\n", *tablet)
			return nil
		}
		if err != nil {
			return describeErr(err)
		}
		if err := enc.Encode(RecordJSON{
			Tablet: r.Tablet, Position: r.Position, Table: r.Table, Op: strings.ToLower(r.Op.String()),
			Key: orNull(r.Key), Before: orNull(r.Before), After: orNull(r.After),
			CommitTime: r.CommitTime.AsTime().UTC().Format(time.RFC3339Nano),
		}); err != nil {
			return err
		}
	}
}

func orNull(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

func ctlStream(ctx context.Context, cl ctlClients, args []string, stdout io.Writer) error {
	if len(args) != 2 {
		return usageError{errors.New("stream: want describe ID or delete ID")}
	}
	switch args[0] {
	case "describe":
		s, err := cl.topo.DescribeStream(ctx, &sourcepb.DescribeStreamRequest{Stream: args[1]})
		if err != nil {
			return err
		}
		b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(s)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, string(b))
		return err
	case "delete":
		resp, err := cl.topo.DeleteStream(ctx, &sourcepb.DeleteStreamRequest{Stream: args[1]})
		if err != nil {
			return err
		}
		return printJSON(stdout, map[string]any{"stream": args[1], "existed": resp.Existed})
	}
	return usageError{fmt.Errorf("stream: unknown action %q", args[0])}
}

// ctlResync resyncs one tablet of a stream, as tabletflow's resync does
// through source/tabletd: for tests and demos.
func ctlResync(ctx context.Context, cl ctlClients, args []string, stdout, stderr io.Writer) error {
	fs := flags("resync", stderr)
	req := &sourcepb.ResyncStreamRequest{}
	fs.StringVar(&req.Stream, "stream", "", "the source-side stream (required)")
	fs.StringVar(&req.Tablet, "tablet", "", "the tablet to resync (required)")
	fs.StringVar(&req.Id, "id", "", "the resync's id: the id of the tablet's last resync starts nothing (default: always start)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if req.Stream == "" || req.Tablet == "" {
		return usageError{errors.New("resync: --stream and --tablet are required")}
	}
	resp, err := cl.topo.ResyncStream(ctx, req)
	if err != nil {
		return err
	}
	return printJSON(stdout, map[string]any{"stream": req.Stream, "tablet": req.Tablet, "id": req.Id,
		"start": resp.Start, "rows": resp.Rows, "existed": resp.Existed})
}
