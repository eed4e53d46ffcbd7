package repocheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The docs drift checks: README.md and docs/**/*.md against the
// repository and the code, one check a file (docs_links, docs_make,
// docs_config, docs_commands, docs_metrics), over the markdown reader of
// markdown_test.go. Each check returns every problem it finds, as
// "file:line: what"; the tests below run them over the real docs, those
// of docs_fixtures_test.go over small trees broken on purpose.

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

func TestDocsLinksResolve(t *testing.T) { report(t, checkLinks(repoRoot)) }

func TestDocsMakeTargetsExist(t *testing.T) { report(t, checkMakeTargets(repoRoot)) }

func TestDocsConfigReferenceIsComplete(t *testing.T) {
	report(t, checkConfigReference(repoRoot, configRoots()))
}

func TestDocsOperatorCommandsAreDocumented(t *testing.T) {
	report(t, checkOperatorCommands(repoRoot, operatorCommands()))
}

func TestDocsMetricsAreDocumented(t *testing.T) {
	report(t, checkMetrics(repoRoot, workerMetrics(t)))
}

// report fails t with each problem on a line of its own.
func report(t *testing.T, found []string) {
	t.Helper()
	for _, p := range found {
		t.Error(p)
	}
	if len(found) > 1 {
		t.Logf("%d problems", len(found))
	}
}

// problems collects "file:line: what" lines.
type problems []string

func (p *problems) add(file string, line int, format string, args ...any) {
	where := file
	if line > 0 {
		where = fmt.Sprintf("%s:%d", file, line)
	}
	*p = append(*p, where+": "+fmt.Sprintf(format, args...))
}

// docSet reads the markdown files of a repository at root, each once.
type docSet struct {
	root string
	docs map[string]*mdDoc
}

func newDocSet(root string) *docSet { return &docSet{root: root, docs: map[string]*mdDoc{}} }

// load reads the file at rel (slash-separated, relative to the root).
func (s *docSet) load(rel string) (*mdDoc, error) {
	if d, ok := s.docs[rel]; ok {
		return d, nil
	}
	b, err := os.ReadFile(filepath.Join(s.root, filepath.FromSlash(rel)))
	if err != nil {
		return nil, err
	}
	d := parseMarkdown(rel, string(b))
	s.docs[rel] = d
	return d, nil
}

// docFiles returns README.md and every .md file under docs/, relative to
// root, sorted. A missing docs/ is no error (the checks that need a page
// say so).
func docFiles(root string) ([]string, error) {
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == filepath.Join(root, "docs") {
			return fs.SkipAll
		}
		if err != nil || e.IsDir() || !strings.EqualFold(filepath.Ext(p), ".md") {
			return err
		}
		rel, err := filepath.Rel(root, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	slices.Sort(files[1:])
	return files, err
}

// loadDocs reads every doc file; a file that cannot be read is a problem.
func loadDocs(root string, p *problems) (*docSet, []*mdDoc) {
	set := newDocSet(root)
	files, err := docFiles(root)
	if err != nil {
		p.add("docs", 0, "%v", err)
	}
	var docs []*mdDoc
	for _, f := range files {
		d, err := set.load(f)
		if err != nil {
			p.add(f, 0, "%v", err)
			continue
		}
		docs = append(docs, d)
	}
	return set, docs
}

// loadSection loads file under root and finds its "## title" section; what
// stops it is added to p.
func loadSection(root, file, title string, p *problems) (d *mdDoc, from, to int, ok bool) {
	d, err := newDocSet(root).load(file)
	if err != nil {
		p.add(file, 0, "%v", err)
		return nil, 0, 0, false
	}
	if from, to, ok = d.section(2, title); !ok {
		p.add(file, 0, "no \"## %s\" section", title)
	}
	return d, from, to, ok
}
