package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	tabletdclient "github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/tabletd/cluster"
)

func startCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	cfg := cluster.DefaultConfig()
	cfg.Listen, cfg.Rate, cfg.Tablets, cfg.Seed = "127.0.0.1:0", 0, 4, 7
	c, err := cluster.New(cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start())
	t.Cleanup(c.Close)
	return c
}

// ctlRun runs `tabletd ctl --addr ADDR args...` and returns its exit code
// and output.
func ctlRun(t *testing.T, addr string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"ctl", "--addr", addr}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestCtlCommandsDriveTheCluster(t *testing.T) {
	c := startCluster(t)
	addr := c.Addr()

	code, out, _ := ctlRun(t, addr, "list")
	require.Zero(t, code)
	for _, want := range []string{"t-0001", "t-0004", "PRIMARY", "zone1-0000000101"} {
		require.Contains(t, out, want)
	}

	code, out, _ = ctlRun(t, addr, "workload", "rate", "50")
	require.Zero(t, code)
	require.Contains(t, out, `"rate": 50`)
	code, out, _ = ctlRun(t, addr, "workload", "pause")
	require.Zero(t, code)
	require.Contains(t, out, `"paused"`)

	c.Write(120)
	code, out, _ = ctlRun(t, addr, "digest")
	require.Zero(t, code)
	var d DigestJSON
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Equal(t, uint64(120), d.Records)
	require.Len(t, d.Hash, 16)
	require.Len(t, d.Tablets, 4)

	// 120 records from nothing: the first is an insert, so rows exist;
	// each line is a row of a workload table, keyed by its id.
	code, out, _ = ctlRun(t, addr, "rows", "--table", "orders")
	require.Zero(t, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.NotEmpty(t, lines[0])
	for _, line := range lines {
		var r RowJSON
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		require.Equal(t, "orders", r.Table)
		var key, row map[string]any
		require.NoError(t, json.Unmarshal(r.Key, &key))
		require.NoError(t, json.Unmarshal(r.Row, &row))
		require.Equal(t, key["id"], row["id"])
	}

	// A stream's tablet resynced: its start is the log's end, the copy
	// holds the tablet's rows (rows --tablet), and the same id again
	// starts nothing.
	code, out, _ = ctlRun(t, addr, "rows", "--tablet", "t-0001")
	require.Zero(t, code)
	tabletRows := strings.Count(out, "\n")
	require.NotZero(t, tabletRows)
	client, err := tabletdclient.Dial(addr, "commerce", tabletdclient.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	_, err = client.EnsureStream(t.Context(), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	var resynced struct {
		Start   string `json:"start"`
		Rows    int    `json:"rows"`
		Existed bool   `json:"existed"`
	}
	for _, existed := range []bool{false, true} {
		code, out, _ = ctlRun(t, addr, "resync", "--stream", "s", "--tablet", "t-0001", "--id", "r1")
		require.Zero(t, code)
		require.NoError(t, json.Unmarshal([]byte(out), &resynced))
		require.Equal(t, tabletRows, resynced.Rows)
		require.Equal(t, existed, resynced.Existed)
	}
	code, out, _ = ctlRun(t, addr, "stream", "describe", "s")
	require.Zero(t, code)
	var described struct { // protojson: its spacing varies, its fields do not
		Tablets []struct {
			Tablet, ResyncID, ResyncStart string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &described))
	require.Equal(t, "t-0001", described.Tablets[0].Tablet)
	require.Equal(t, "r1", described.Tablets[0].ResyncID)
	require.Equal(t, resynced.Start, described.Tablets[0].ResyncStart)

	code, out, _ = ctlRun(t, addr, "fault", "--server", "zone1-0000000101", "--code", "UNAVAILABLE", "--error-rate", "0.5")
	require.Zero(t, code)
	require.Contains(t, out, "fault injected")
	code, _, _ = ctlRun(t, addr, "fault", "--server", "zone1-0000000101", "--latency", "10ms")
	require.Zero(t, code)
	code, _, _ = ctlRun(t, addr, "heal", "--server", "zone1-0000000101")
	require.Zero(t, code)

	code, out, _ = ctlRun(t, addr, "split", "--tablet", "t-0002")
	require.Zero(t, code)
	require.Contains(t, out, `"t-0005"`)
	code, out, _ = ctlRun(t, addr, "list", "--json")
	require.Zero(t, code)
	require.Contains(t, out, `"t-0006"`)
}

func TestCtlRejectsBadInputWithAClearMessage(t *testing.T) {
	c := startCluster(t)
	addr := c.Addr()
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		// Usage errors exit 2 and say what is wrong.
		{"no command", nil, 2, "no command"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"fault without server", []string{"fault", "--down"}, 2, "--server is required"},
		{"workload rate not a number", []string{"workload", "rate", "fast"}, 2, "not a number"},
		{"workload unknown action", []string{"workload", "jump"}, 2, "unknown action"},
		{"split without tablet", []string{"split"}, 2, "--tablet is required"},
		{"stray argument", []string{"list", "extra"}, 2, "unexpected argument"},
		{"topology down with a server", []string{"fault", "--topology-down", "--server", "zone1-0000000101"}, 2, "--topology-down takes no --server"},
		{"topology down with another fault", []string{"fault", "--topology-down", "--not-serving"}, 2, "--topology-down takes no --not-serving"},
		{"for without topology down", []string{"fault", "--server", "zone1-0000000101", "--down", "--for", "1s"}, 2, "--for needs --topology-down"},
		{"heal topology with a server", []string{"heal", "--topology", "--server", "zone1-0000000101"}, 2, "--topology takes no --server"},
		// Server-side rejections exit 1 with the code and reason.
		{"unknown server", []string{"fault", "--server", "zone9-0000000901", "--down"}, 1, "NotFound UNKNOWN_SERVER"},
		{"bad code", []string{"fault", "--server", "zone1-0000000101", "--code", "OOPS"}, 1, "InvalidArgument BAD_REQUEST"},
		{"topology down for no time", []string{"fault", "--topology-down", "--for", "0s"}, 1, "InvalidArgument BAD_REQUEST: duration"},
		{"unknown tablet", []string{"split", "--tablet", "t-9999"}, 1, "UNKNOWN_TABLET"},
		{"unknown stream", []string{"digest", "--stream", "nope"}, 1, "UNKNOWN_STREAM"},
		{"unknown table", []string{"rows", "--table", "nope"}, 1, "InvalidArgument BAD_REQUEST: table"},
		{"rows of an unknown tablet", []string{"rows", "--tablet", "t-9999"}, 1, "NotFound UNKNOWN_TABLET"},
		{"resync without tablet", []string{"resync", "--stream", "s"}, 2, "--stream and --tablet are required"},
		{"resync of an unknown stream", []string{"resync", "--stream", "nope", "--tablet", "t-0001"}, 1, "NotFound UNKNOWN_STREAM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := ctlRun(t, addr, tt.args...)
			require.Equal(t, tt.code, code, errOut)
			require.Contains(t, errOut, tt.msg)
		})
	}
}

func TestCtlTopologyDownFailsTopologyCommandsUntilHealed(t *testing.T) {
	c := startCluster(t)
	addr := c.Addr()
	for _, fault := range [][]string{{"--topology-down"}, {"--topology-down", "--for", "1h"}} {
		code, out, errOut := ctlRun(t, addr, append([]string{"fault"}, fault...)...)
		require.Zero(t, code, errOut)
		require.Contains(t, out, "topology down (fault injected)")

		code, _, errOut = ctlRun(t, addr, "list")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "Unavailable INJECTED: topology unavailable (fault injected)")
		code, _, errOut = ctlRun(t, addr, "workload", "status")
		require.Zero(t, code, "admin commands still work: %s", errOut)

		code, out, errOut = ctlRun(t, addr, "heal", "--topology")
		require.Zero(t, code, errOut)
		require.Contains(t, out, "healed the topology")
		code, _, errOut = ctlRun(t, addr, "list")
		require.Zero(t, code, errOut)
	}
}

func TestServeRejectsBadFlagsNamingThem(t *testing.T) {
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"--tablets", "0"}, "tablets:"},
		{[]string{"--replicas", "9", "--cells", "a,b", "--servers-per-cell", "1"}, "replicas:"},
		{[]string{"--retention", "0s"}, "retention:"},
		{[]string{"--cells", "a,a"}, "cells:"},
		{[]string{"--rate", "-1"}, "rate:"},
		{[]string{"--log-level", "loud"}, "log-level"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := run(append([]string{"serve", "--listen", "127.0.0.1:0"}, tt.args...), &out, &errb)
		require.Equal(t, 2, code, "%v: %s", tt.args, errb.String())
		require.Contains(t, errb.String(), tt.msg)
	}
}

func TestCtlTailFollowsATabletUntilItSplits(t *testing.T) {
	c := startCluster(t)
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- run([]string{"ctl", "--addr", c.Addr(), "tail", "--tablet", "t-0003", "--from", "1.0"}, pw, &errb)
		_ = pw.Close()
	}()
	require.NoError(t, c.WriteTo("t-0003", 3))
	lines := bufio.NewScanner(pr)
	for i := 1; i <= 3; i++ {
		require.True(t, lines.Scan())
		var rec RecordJSON
		require.NoError(t, json.Unmarshal(lines.Bytes(), &rec))
		require.Equal(t, "t-0003", rec.Tablet)
		require.Equal(t, "1."+string(rune('0'+i)), rec.Position)
		require.Equal(t, "insert", rec.Op)
		require.True(t, strings.HasPrefix(string(rec.Key), `{"id":`))
	}
	_, _, err := c.Split("t-0003")
	require.NoError(t, err)
	select {
	case code := <-done:
		require.Zero(t, code)
		require.Contains(t, errb.String(), "ended (split)")
	case <-time.After(10 * time.Second):
		t.Fatal("tail did not end after the split")
	}
}
