package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// verified is what the checks found.
type verified struct {
	summary string
	// flowFirstAck: tabletflow's records at or below its first confirmed
	// position.
	flowFirstAck uint64
}

// verify checks the three outputs: the sinks hold want records with no
// position twice, the three files hold the same lines but for the stream
// name, and replaying tabletflow's records gives the primary's tables.
func (b *bench) verify(ctx context.Context, want uint64, rawDir, readerDir, flowDir string, firstAck pglogrepl.LSN) (verified, error) {
	var v verified
	for _, dir := range []string{readerDir, flowDir} {
		r, err := jsonl.DigestDir(dir)
		if err != nil {
			return v, err
		}
		if r.Total.Records != want || len(r.Duplicates) > 0 {
			return v, fmt.Errorf("%s: %d records, %d positions stored twice; want %d records, none twice",
				dir, r.Total.Records, len(r.Duplicates), want)
		}
	}
	file := func(dir string) string { return filepath.Join(dir, shardID+".jsonl") }
	n, firstCount, err := sameLines(file(flowDir), firstAck, file(rawDir), file(readerDir))
	if err != nil {
		return v, err
	}
	if n != want {
		return v, fmt.Errorf("%d lines, want %d", n, want)
	}
	v.flowFirstAck = firstCount

	lines, err := jsonl.ReadDir(flowDir)
	if err != nil {
		return v, err
	}
	recs := make([]source.Record, 0, len(lines[shardID]))
	for _, l := range lines[shardID] {
		r, err := l.Record()
		if err != nil {
			return v, err
		}
		recs = append(recs, r)
	}
	got, err := pgbed.Replay(recs)
	if err != nil {
		return v, fmt.Errorf("replay tabletflow's records: %w", err)
	}
	tables, err := b.shard().Primary.TextTables(ctx)
	if err != nil {
		return v, err
	}
	for _, t := range pgbed.Tables {
		if !reflect.DeepEqual(got[t], tables[t]) {
			return v, fmt.Errorf("%s: replaying tabletflow's records gives %d rows, the primary has %d", t, len(got[t]), len(tables[t]))
		}
	}
	v.summary = fmt.Sprintf("%d records in each output, identical lines (stream name aside) in raw, reader and tabletflow; "+
		"no position twice in either sink; replaying tabletflow's records gives the primary's tables (%d orders, %d items)",
		want, len(tables["public.orders"]), len(tables["public.items"]))
	publish.Logf("verify: %s", v.summary)
	return v, nil
}

// sameLines reads the JSONL file ref and the others side by side and
// checks that they hold the same lines once each line's stream name is
// cut off. It returns the lines, and how many of ref's have a position
// at or below upTo.
func sameLines(ref string, upTo pglogrepl.LSN, others ...string) (n, below uint64, err error) {
	paths := append([]string{ref}, others...)
	scanners := make([]*bufio.Scanner, len(paths))
	for i, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return 0, 0, err
		}
		defer f.Close()
		scanners[i] = bufio.NewScanner(f)
		scanners[i].Buffer(make([]byte, 0, 1<<20), 64<<20)
	}
	for ; ; n++ {
		var line []byte
		for i, sc := range scanners {
			more := sc.Scan()
			if err := sc.Err(); err != nil {
				return n, below, fmt.Errorf("%s: %w", paths[i], err)
			}
			switch {
			case i == 0 && !more:
				line = nil
			case i == 0:
				line = afterStream(sc.Bytes())
			case (line == nil) != !more:
				return n, below, fmt.Errorf("%s and %s differ in length: one ends after %d lines", ref, paths[i], n)
			case more && !bytes.Equal(line, afterStream(sc.Bytes())):
				return n, below, fmt.Errorf("line %d differs:\n%s: %s\n%s: %s", n+1, ref, line, paths[i], afterStream(sc.Bytes()))
			}
		}
		if line == nil {
			return n, below, nil
		}
		term, err := positionTerm(line)
		if err != nil {
			return n, below, fmt.Errorf("%s line %d: %w", ref, n+1, err)
		}
		if term <= uint64(upTo) {
			below++
		}
	}
}

// afterStream is a line from its "tablet" field on.
func afterStream(line []byte) []byte {
	if i := bytes.Index(line, []byte(`"tablet":`)); i >= 0 {
		return line[i:]
	}
	return line
}

// positionTerm reads the term of a line's position, "term.index".
func positionTerm(line []byte) (uint64, error) {
	const key = `"position":"`
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return 0, errors.New("no position")
	}
	rest := line[i+len(key):]
	j := bytes.IndexByte(rest, '.')
	if j < 0 {
		return 0, errors.New("position without an index")
	}
	return strconv.ParseUint(string(rest[:j]), 10, 64)
}
