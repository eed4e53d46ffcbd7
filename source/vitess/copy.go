package vitess

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"slices"
	"strings"

	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"
)

// A stream that starts from a snapshot copies each shard's tables with
// the copy phase of the vttablet's own VStream (its uvstreamer, as
// VReplication and vtgate's VStream use it): the tables one at a time in
// name order, each from one consistent snapshot at a GTID position, its
// rows sent in transactions that end with the table's last primary key
// copied (LASTPK); before each next table, the changes since the last
// snapshot of the tables already copied ("catchup"); then COPY_COMPLETED
// and the change stream from the last position.
//
// A checkpoint taken during the copy holds, after the GTID position,
// where the copy stands, so that a read that starts again (after a
// worker's kill, on another vttablet) goes on from there:
//
//	<GTID position>;copy=<table>;after=<last primary key>   inside a table
//	<GTID position>;copied=<table>                           between tables
//	<GTID position>;copy                                     before the first
//
// and, for a resync's copy (resync.go), ";resync=<id>" after that, so
// that the copy's markers are delivered wherever it goes on.
//
// the table's name query-escaped and the primary key a base64 (URL
// alphabet) protobuf QueryResult as Vitess's TableLastPK holds it. A
// copied row is a Read record at the position the copy is at: its Term is
// that position's transaction count, and its Index follows the records
// delivered at that position before, so positions stay unique and
// increasing across the catchup's transactions and the copy's rows.

// copyState is where a shard's copy stands, after the last whole
// transaction.
type copyState struct {
	// table is the table being copied ("": none, between tables or
	// before the first); after is its last primary key copied.
	table string
	after *querypb.QueryResult
	// copied is the last table copied whole ("": none yet).
	copied string
	// resync is the id of the resync whose copy this is ("": the copy of
	// a stream's start): its reader delivers a ResyncBegin marker before
	// the copy's first row and a ResyncEnd marker after its last.
	resync string
}

// begun reports whether the copy has copied anything yet.
func (c *copyState) begun() bool { return c.table != "" || c.copied != "" }

// copyMark separates a checkpoint's GTID position from its copy state.
const copyMark = ";"

// suffix is the copy state as a checkpoint's Opaque part carries it
// after the GTID position.
func (c *copyState) suffix() (string, error) {
	var s string
	switch {
	case c.table != "":
		pk, err := c.after.MarshalVT()
		if err != nil {
			return "", fmt.Errorf("last primary key copied of %s: %w", c.table, err)
		}
		s = copyMark + "copy=" + url.QueryEscape(c.table) + copyMark + "after=" + base64.RawURLEncoding.EncodeToString(pk)
	case c.copied != "":
		s = copyMark + "copied=" + url.QueryEscape(c.copied)
	default:
		s = copyMark + "copy"
	}
	if c.resync != "" {
		s += copyMark + "resync=" + url.QueryEscape(c.resync)
	}
	return s, nil
}

// parseOpaque splits a checkpoint's Opaque part into its GTID position
// and, when it was taken during a copy, the copy state.
func parseOpaque(opaque string) (string, *copyState, error) {
	pos, rest, during := strings.Cut(opaque, copyMark)
	if !during {
		return pos, nil, nil
	}
	bad := func(why string) (string, *copyState, error) {
		return "", nil, fmt.Errorf("copy state %q: %s", rest, why)
	}
	c := &copyState{}
	for _, part := range strings.Split(rest, copyMark) {
		key, value, _ := strings.Cut(part, "=")
		var err error
		switch key {
		case "copy":
			c.table, err = url.QueryUnescape(value)
		case "copied":
			c.copied, err = url.QueryUnescape(value)
		case "resync":
			c.resync, err = url.QueryUnescape(value)
		case "after":
			var b []byte
			if b, err = base64.RawURLEncoding.DecodeString(value); err == nil {
				c.after = &querypb.QueryResult{}
				err = c.after.UnmarshalVT(b)
			}
		default:
			return bad(fmt.Sprintf("unknown part %q", key))
		}
		if err != nil {
			return bad(fmt.Sprintf("%s: %v", key, err))
		}
	}
	if c.table != "" && (c.after == nil || len(c.after.Fields) == 0 || len(c.after.Rows) != 1) {
		return bad("a table being copied needs its last primary key (fields and one row)")
	}
	if c.table == "" && c.after != nil {
		return bad("a last primary key without its table")
	}
	return pos, c, nil
}

// advance takes a LASTPK event: the table's copy went on to its last
// primary key, or (Completed) ended.
func (c *copyState) advance(ev *binlogdatapb.LastPKEvent) {
	t := ev.GetTableLastPK().GetTableName()
	if ev.GetCompleted() {
		c.table, c.after, c.copied = "", nil, t
		return
	}
	c.table, c.after = t, ev.GetTableLastPK().GetLastpk().CloneVT()
}

// toCopy is what is left to copy after state, of the stream's tables
// (the keyspace's, when the stream names none) in the order the copy
// takes them: the table in progress from after its last primary key,
// then every later one.
func (c *copyState) toCopy(tables []string) []string {
	var out []string
	for _, t := range slices.Sorted(slices.Values(tables)) {
		switch {
		case c.table != "" && t >= c.table:
			out = append(out, t)
		case c.table == "" && t > c.copied:
			out = append(out, t)
		}
	}
	return out
}
