package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/tabletflow/tabletflow/bench/internal/publish"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

// checkPass checks a pair's two outputs against the reference (the first
// raw pass's), then removes them unless they are the reference or the
// first tabletflow pass's (which verifyReplay replays).
func (b *bench) checkPass(ref, rawDir, flowDir string, w written, p *pair) error {
	for _, dir := range []string{rawDir, flowDir} {
		if err := b.checkOutput(ref, dir, w); err != nil {
			return err
		}
	}
	for _, dir := range []string{rawDir, flowDir} {
		if dir != ref && filepath.Base(dir) != "flow-1" {
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkOutput checks that dir's shard file holds the reference's lines,
// the stream name aside, and the backlog's count; a sink's directory
// (with a manifest) also that its digest finds no position twice.
func (b *bench) checkOutput(ref, dir string, w written) error {
	if _, err := os.Stat(filepath.Join(dir, shardID+".manifest.json")); err == nil {
		r, err := jsonl.DigestDir(dir)
		if err != nil {
			return err
		}
		if r.Total.Records != w.records || len(r.Duplicates) > 0 {
			return fmt.Errorf("%s: %d records, %d positions stored twice; want %d records, none twice",
				dir, r.Total.Records, len(r.Duplicates), w.records)
		}
	}
	if dir == ref {
		return nil
	}
	file := func(d string) string { return filepath.Join(d, shardID+".jsonl") }
	n, err := sameLines(file(ref), file(dir))
	if err != nil {
		return err
	}
	if n != w.records {
		return fmt.Errorf("%s: %d lines, want %d", dir, n, w.records)
	}
	return nil
}

// sameLines reads two JSONL files side by side and checks that they hold
// the same lines once each line's stream name is cut off; it returns the
// number of lines.
func sameLines(a, b string) (uint64, error) {
	paths := []string{a, b}
	scanners := make([]*bufio.Scanner, 2)
	for i, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		scanners[i] = bufio.NewScanner(f)
		scanners[i].Buffer(make([]byte, 0, 1<<20), 64<<20)
	}
	for n := uint64(0); ; n++ {
		moreA, moreB := scanners[0].Scan(), scanners[1].Scan()
		if err := errors.Join(scanners[0].Err(), scanners[1].Err()); err != nil {
			return n, err
		}
		switch {
		case moreA != moreB:
			return n, fmt.Errorf("%s and %s differ in length: one ends after %d lines", a, b, n)
		case !moreA:
			return n, nil
		case !bytes.Equal(afterStream(scanners[0].Bytes()), afterStream(scanners[1].Bytes())):
			return n, fmt.Errorf("line %d differs:\n%s: %s\n%s: %s", n+1, a, scanners[0].Bytes(), b, scanners[1].Bytes())
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

// recordsUpTo counts the lines of a JSONL file whose position's term is
// at most term.
func recordsUpTo(path string, term uint64) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var n uint64
	for sc.Scan() {
		const key = `"position":"`
		line := sc.Bytes()
		i := bytes.Index(line, []byte(key))
		if i < 0 {
			return n, fmt.Errorf("%s: a line without a position", path)
		}
		rest := line[i+len(key):]
		j := bytes.IndexByte(rest, '.')
		if j < 0 {
			return n, fmt.Errorf("%s: a position without an index", path)
		}
		t, err := strconv.ParseUint(string(rest[:j]), 10, 64)
		if err != nil {
			return n, fmt.Errorf("%s: %w", path, err)
		}
		if t > term {
			break
		}
		n++
	}
	return n, sc.Err()
}

// verifyReplay replays the shard's records in dir onto empty tables and
// compares the result with the tables in the shard's primary.
func (b *bench) verifyReplay(ctx context.Context, dir string, w written) (string, error) {
	lines, err := jsonl.ReadDir(dir)
	if err != nil {
		return "", err
	}
	recs := make([]source.Record, 0, len(lines[shardID]))
	for _, l := range lines[shardID] {
		r, err := l.Record()
		if err != nil {
			return "", err
		}
		recs = append(recs, r)
	}
	got, err := vitessbed.Replay(recs)
	if err != nil {
		return "", fmt.Errorf("replay tabletflow's records: %w", err)
	}
	want, err := b.bed.Primary(shardID).Rows(ctx)
	if err != nil {
		return "", err
	}
	if d := vitessbed.Diff(want, got); d != "" {
		return "", fmt.Errorf("replaying tabletflow's records does not give the tables of %s's primary: %s", shardID, d)
	}
	s := fmt.Sprintf("%d records in every output, the same lines (stream name aside) in every raw and tabletflow pass and the adapter loop; "+
		"no position twice in any sink; replaying tabletflow's records gives %s's tables (%d customers, %d orders)",
		w.records, shardID, len(want["customer"]), len(want["corder"]))
	publish.Logf("verify: %s", s)
	return s, nil
}
