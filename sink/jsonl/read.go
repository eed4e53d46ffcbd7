package jsonl

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/segmentio/encoding/json"
	"golang.org/x/sync/errgroup"

	"github.com/tabletflow/tabletflow/digest"
)

// ReadDir parses the committed lines of every <tablet>.jsonl file in dir,
// keyed by tablet, in file order. Only the first manifest offset bytes of a
// file are committed: an uncommitted tail (a writer mid-commit, or a crash)
// is ignored. An empty data file without a manifest (a tablet being opened)
// holds nothing; one with bytes is ErrCorrupt, as Open says. So ReadDir is
// safe to run while a writer is appending.
func ReadDir(dir string) (map[string][]Line, error) {
	out := map[string][]Line{}
	err := scanDir(dir, func(tablet string, l Line) error {
		out[tablet] = append(out[tablet], l)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Report is the digest of a sink directory's committed lines.
type Report struct {
	// Tablets is each tablet's digest, duplicates counted.
	Tablets map[string]digest.Digest `json:"tablets"`
	// Total is the sum of the tablets' digests. It equals the source's
	// digest exactly when the sink holds the same records, each once.
	Total digest.Digest `json:"total"`
	// Duplicates lists every (tablet, position) stored more than once,
	// sorted. It is empty when delivery was exactly-once.
	Duplicates []Duplicate `json:"duplicates"`
}

// Duplicate is a (tablet, position) pair found Count times.
type Duplicate struct {
	Tablet   string `json:"tablet"`
	Position string `json:"position"`
	Count    int    `json:"count"`
}

// DigestDir computes the digest of dir's committed lines the way tabletd
// does (digest.Hash over each line's fields, Key/Before/After as the line's
// raw bytes), and finds duplicate positions. Each data file holds one
// tablet, so the files are digested in parallel, one per core; an error is
// the one the first bad file (by name) gives, as if they were read in turn.
// Lines are parsed with segmentio/encoding/json, encoding/json's drop-in:
// BenchmarkParseLine parses a line in about a fifth of encoding/json's
// time (1,967 against 9,556 ns in one run on the 2-core machine), and the
// benchmarks verify every drain of millions of records with this.
func DigestDir(dir string) (Report, error) {
	names, err := dataNames(dir)
	if err != nil {
		return Report{}, err
	}
	type tabletReport struct {
		d    digest.Digest
		dups []Duplicate
		err  error
	}
	out := make([]tabletReport, len(names))
	var g errgroup.Group // its errors stay nil: each file's is in out
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, tablet := range names {
		g.Go(func() error {
			t := &out[i]
			seen := map[string]int{}
			t.err = scanFile(dir, tablet, func(_ string, l Line) error {
				t.d.Add(l.Hash())
				seen[l.Position]++
				return nil
			})
			for pos, n := range seen {
				if n > 1 {
					t.dups = append(t.dups, Duplicate{Tablet: tablet, Position: pos, Count: n})
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	r := Report{Tablets: map[string]digest.Digest{}, Duplicates: []Duplicate{}}
	for i, t := range out {
		if t.err != nil {
			return Report{}, t.err
		}
		if t.d.Records > 0 {
			r.Tablets[names[i]] = t.d
		}
		r.Total = r.Total.Plus(t.d)
		r.Duplicates = append(r.Duplicates, t.dups...)
	}
	slices.SortFunc(r.Duplicates, func(a, b Duplicate) int {
		return cmp.Or(cmp.Compare(a.Tablet, b.Tablet), cmp.Compare(a.Position, b.Position))
	})
	return r, nil
}

// dataNames lists the tablets of dir's data files, sorted.
func dataNames(dir string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*"+dataExt))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	for i, name := range names {
		names[i] = strings.TrimSuffix(filepath.Base(name), dataExt)
	}
	slices.Sort(names)
	return names, nil
}

// scanDir calls fn for each committed line of each data file in dir, in
// file order, one file after another (sorted by name).
func scanDir(dir string, fn func(tablet string, l Line) error) error {
	names, err := dataNames(dir)
	if err != nil {
		return err
	}
	for _, tablet := range names {
		if err := scanFile(dir, tablet, fn); err != nil {
			return err
		}
	}
	return nil
}

func scanFile(dir, tablet string, fn func(tablet string, l Line) error) error {
	m, err := readManifest(dir, tablet)
	noManifest := errors.Is(err, errNoManifest)
	if err != nil && !noManifest {
		return err
	}
	f, err := os.Open(dataPath(dir, tablet))
	if err != nil {
		return fmt.Errorf("open data: %w", err)
	}
	defer f.Close()
	if noManifest {
		// Open writes the manifest before any data: an empty file is a
		// tablet being opened, anything more is corrupt.
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("stat data: %w", err)
		}
		if fi.Size() > 0 {
			return fmt.Errorf("%w: data file %s holds %d bytes but its manifest %s is missing",
				ErrCorrupt, dataPath(dir, tablet), fi.Size(), manifestPath(dir, tablet))
		}
		return nil
	}
	r := bufio.NewReaderSize(io.LimitReader(f, m.Offset), 1<<16)
	var read int64
	for n := 1; ; n++ {
		b, err := r.ReadBytes('\n')
		read += int64(len(b))
		if errors.Is(err, io.EOF) {
			if len(b) > 0 {
				return fmt.Errorf("%w: %s line %d: committed data ends mid-line", ErrCorrupt, tablet, n)
			}
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", tablet, err)
		}
		var l Line
		if err := json.Unmarshal(b, &l); err != nil {
			return fmt.Errorf("%w: %s line %d: %v", ErrCorrupt, tablet, n, err)
		}
		if l.Tablet != tablet {
			return fmt.Errorf("%w: %s line %d: tablet %q", ErrCorrupt, tablet, n, l.Tablet)
		}
		if err := fn(tablet, l); err != nil {
			return err
		}
	}
	if read != m.Offset {
		return fmt.Errorf("%w: %s: data file has %d committed bytes, manifest says %d", ErrCorrupt, tablet, read, m.Offset)
	}
	return nil
}
