package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// object is one decoded JSON object. The result files change shape as the
// benchmarks grow (new fields, nested timings, arrays of cases), so they are
// read as generic maps and every lookup says whether the field was there:
// a missing field must become "not measured", never a zero that passes or
// fails a goal by accident.
type object map[string]any

// value walks path through nested objects and returns what is there.
func (o object) value(path ...string) (any, bool) {
	var cur any = map[string]any(o)
	for _, key := range path {
		m, ok := asObject(cur)
		if !ok {
			return nil, false
		}
		cur, ok = m[key]
		if !ok {
			return nil, false
		}
	}
	return cur, true
}

// num returns the JSON number at path. Strings are not converted: a
// benchmark that writes a number as text has usually rounded it already.
func (o object) num(path ...string) (float64, bool) {
	v, ok := o.value(path...)
	if !ok {
		return 0, false
	}
	f, ok := v.(float64)
	return f, ok
}

// str returns the JSON string at path.
func (o object) str(path ...string) (string, bool) {
	v, ok := o.value(path...)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

// boolean returns the JSON boolean at path.
func (o object) boolean(path ...string) (bool, bool) {
	v, ok := o.value(path...)
	if !ok {
		return false, false
	}
	b, ok := v.(bool)
	return b, ok
}

// obj returns the JSON object at path.
func (o object) obj(path ...string) (object, bool) {
	v, ok := o.value(path...)
	if !ok {
		return nil, false
	}
	return asObject(v)
}

// objects returns the JSON objects in the array at path, skipping anything
// else the array holds.
func (o object) objects(path ...string) []object {
	v, _ := o.value(path...)
	list, _ := v.([]any)
	var out []object
	for _, item := range list {
		if m, ok := asObject(item); ok {
			out = append(out, m)
		}
	}
	return out
}

// numbers returns the JSON numbers in the array at path.
func (o object) numbers(path ...string) []float64 {
	v, _ := o.value(path...)
	list, _ := v.([]any)
	var out []float64
	for _, item := range list {
		if f, ok := item.(float64); ok {
			out = append(out, f)
		}
	}
	return out
}

func asObject(v any) (object, bool) {
	switch m := v.(type) {
	case map[string]any:
		return object(m), true
	case object:
		return m, true
	}
	return nil, false
}

// resultFile is one bench/results/*.json file as read from disk.
type resultFile struct {
	Name string // base name, e.g. "throughput.json"
	Data object // nil when the file is missing or unreadable
	Err  error  // why Data is nil
}

// missing reports whether the file does not exist at all (as opposed to
// existing but not being valid JSON).
func (f *resultFile) missing() bool { return errors.Is(f.Err, fs.ErrNotExist) }

// date returns the file's "date" field parsed as RFC 3339.
func (f *resultFile) date() (time.Time, bool) {
	if f.Data == nil {
		return time.Time{}, false
	}
	s, ok := f.Data.str("date")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, s)
	return t, err == nil
}

// results holds every result file the report reads, by base name.
type results struct {
	Dir   string
	Files map[string]*resultFile
}

// The result files the goals come from. The expected ones are always
// looked up, so a missing one shows up as "not measured" and in the list of
// files; reaction-exclude.json is read when there (only a separate
// exclusion run writes it).
const (
	throughputFile      = "throughput.json"
	reactionFile        = "reaction.json"
	reactionExcludeFile = "reaction-exclude.json"
	scaleFile           = "scale.json"      // 1,000 tablets (make bench)
	scaleFullFile       = "scale-5000.json" // 5,000 tablets (make bench-full)
	getChangesFile      = "getchanges.json"
	pgSourceFile        = "pgsource.json"
	pgSinkFile          = "pgsink.json"
	vitessFile          = "vitess.json"
	soakFile            = "soak.json"
)

var expectedFiles = []string{
	throughputFile, reactionFile, scaleFile, scaleFullFile,
	getChangesFile, pgSourceFile, pgSinkFile, vitessFile, soakFile,
}

// loadResults reads the expected result files and any other *.json in dir.
// A file that is missing or not a JSON object is recorded with its error
// rather than failing the report: the other goals can still be judged.
func loadResults(dir string) (*results, error) {
	names := append([]string(nil), expectedFiles...)
	others, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	for _, path := range others {
		names = append(names, filepath.Base(path))
	}
	r := &results{Dir: dir, Files: map[string]*resultFile{}}
	for _, name := range names {
		if _, done := r.Files[name]; !done {
			r.Files[name] = readResultFile(dir, name)
		}
	}
	return r, nil
}

func readResultFile(dir, name string) *resultFile {
	f := &resultFile{Name: name}
	raw, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		f.Err = err
		return f
	}
	var data map[string]any
	if err := json.Unmarshal(raw, &data); err != nil {
		f.Err = fmt.Errorf("not a JSON object: %w", err)
		return f
	}
	f.Data = object(data)
	return f
}

// file returns the named result file; it is never nil, so callers can ask
// for fields without checking first.
func (r *results) file(name string) *resultFile {
	if f, ok := r.Files[name]; ok {
		return f
	}
	return &resultFile{Name: name, Err: fs.ErrNotExist}
}

// sortedNames lists the result files by name, for a stable report.
func (r *results) sortedNames() []string {
	names := make([]string, 0, len(r.Files))
	for name := range r.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
