package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/workflows"
)

// operator runs one operator command against a stream: by default as an
// update, so a bad request comes back as an error; with --signal as a
// signal (fire and forget), exactly as `temporal workflow signal` sends it.
func operator(name string, args []string, stdout, stderr io.Writer) error {
	var conn temporalclient.Flags
	fs := newFlags(name, stderr, &conn)
	asSignal := fs.Bool("signal", false, "send a signal (fire and forget) instead of an update")
	var payload func() (any, error)
	switch name {
	case workflows.CmdExclude:
		aliases := fs.String("aliases", "", "comma-separated replica aliases (required)")
		tablet := fs.String("tablet", "", "only on this tablet (default: every tablet)")
		reason := fs.String("reason", "", "why, shown in the status")
		ttl := fs.Duration("ttl", 0, "how long (default: until include)")
		payload = func() (any, error) {
			return workflows.ExcludeRequest{Aliases: split(*aliases), Tablet: *tablet, Reason: *reason, TTL: config.Duration(*ttl)}, nil
		}
	case workflows.CmdInclude:
		aliases := fs.String("aliases", "", "comma-separated replica aliases (required)")
		payload = func() (any, error) { return workflows.IncludeRequest{Aliases: split(*aliases)}, nil }
	case workflows.CmdPause, workflows.CmdResume, workflows.CmdRetry:
		tablets := fs.String("tablets", "", "comma-separated tablets (default: all)")
		payload = func() (any, error) { return workflows.TabletsRequest{Tablets: split(*tablets)}, nil }
	case workflows.CmdResync:
		tablets := fs.String("tablets", "", "comma-separated tablets (required)")
		reason := fs.String("reason", "", "why, shown in the status")
		payload = func() (any, error) { return workflows.ResyncRequest{Tablets: split(*tablets), Reason: *reason}, nil }
	case workflows.CmdSnapshot:
		tables := fs.String("tables", "", "comma-separated tables to copy, from the stream's source.tables (required)")
		tablets := fs.String("tablets", "", "comma-separated tablets (default: all)")
		reason := fs.String("reason", "", "why, shown in the status")
		payload = func() (any, error) {
			return workflows.SnapshotRequest{Tables: split(*tables), Tablets: split(*tablets), Reason: *reason}, nil
		}
	case workflows.CmdSnapshotCancel:
		reason := fs.String("reason", "", "why, shown in the status")
		payload = func() (any, error) { return workflows.SnapshotCancelRequest{Reason: *reason}, nil }
	case workflows.CmdStop:
		drop := fs.Bool("drop-source-stream", false, "also delete the source-side stream, so it holds no history")
		payload = func() (any, error) { return workflows.StopRequest{DropSourceStream: *drop}, nil }
	case workflows.CmdConfigure:
		file := fs.String("f", "", "JSON file with any of selection, retry, autoExcludeTTL, batch, run")
		tables := fs.String("tables", "", "comma-separated tables the stream reads from now on (source.tables)")
		reason := fs.String("reason", "", "why the tables change, shown in the status")
		payload = func() (any, error) {
			if *file == "" && *tables == "" {
				return nil, usageError{errors.New("configure: give -f, --tables or both")}
			}
			// The file's fields are sent as written (RawMessage): decoded
			// into Go values its numbers would be floats.
			req := map[string]any{}
			if *file != "" {
				b, err := os.ReadFile(*file)
				if err != nil {
					return nil, err
				}
				var fields map[string]json.RawMessage
				if err := json.Unmarshal(b, &fields); err != nil {
					return nil, fmt.Errorf("%s: %w", *file, err)
				}
				for k, v := range fields {
					req[k] = v
				}
			}
			for flag, key := range map[string]string{"tables": "source", "reason": "reason"} {
				if _, ok := req[key]; ok && fs.Lookup(flag).Value.String() != "" {
					return nil, usageError{fmt.Errorf("configure: %q is in %s and --%s is given; give one", key, *file, flag)}
				}
			}
			if *tables != "" {
				req["source"] = workflows.SourceChange{Tables: split(*tables)}
			}
			if *reason != "" {
				req["reason"] = *reason
			}
			return req, nil
		}
	}
	id, err := parseID(fs, args)
	if err != nil {
		return err
	}
	req, err := payload()
	if err != nil {
		return err
	}
	raw, err := json.Marshal(req)
	if err != nil {
		return err
	}
	c, _, err := dial(&conn)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if *asSignal {
		if name == workflows.CmdConfigure {
			return usageError{errors.New("configure is an update only")}
		}
		if err := c.SignalWorkflow(ctx, id, "", name, json.RawMessage(raw)); err != nil {
			return fmt.Errorf("signal %s to %s: %w", name, id, err)
		}
		fmt.Fprintf(stdout, "signalled %s to %s: %s (a bad request shows in the status's rejected list)\n", name, id, raw)
		return nil
	}
	h, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID: id, UpdateName: name, WaitForStage: client.WorkflowUpdateStageCompleted,
		Args: []any{json.RawMessage(raw)},
	})
	if err == nil {
		err = h.Get(ctx, nil)
	}
	if err != nil {
		return fmt.Errorf("%s on %s: %w", name, id, err)
	}
	fmt.Fprintf(stdout, "%s done on %s: %s\n", name, id, raw)
	return nil
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
