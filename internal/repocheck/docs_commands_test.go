package repocheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/workflows"
)

// Check 4: every operator command the workflows accept has its heading
// in docs/operating.md.

// operatorCommands are the names an operator sends a stream workflow:
// its signals (each also an update), configure (an update only), and its
// queries.
func operatorCommands() []string {
	names := append(slices.Clone(workflows.SignalCommands), workflows.CmdConfigure,
		workflows.QueryStatus, activities.QueryExclusions, activities.QueryConfig)
	slices.Sort(names)
	return slices.Compact(names)
}

// internalCommands are the signals and commands the workflows send each
// other, which an operator never sends: they are not documented as
// operator commands.
var internalCommands = map[string]string{
	workflows.SignalTabletReport:  "a tablet's report to its stream",
	workflows.SignalTabletCommand: "the stream's command to one tablet",
	workflows.CmdRecheck:          "a stream-to-tablet command only (an exclusion ended)",
	workflows.CmdReopen:           "a stream-to-tablet command only (a snapshot was recorded)",
	activities.SignalProgress:     "a GetChanges activity's progress to its tablet",
}

// TestOperatorCommandNamesAreClassified keeps operatorCommands honest: every
// string constant named Cmd*, Signal* or Query* in package workflows or
// activities is an operator command or listed in internalCommands, so a
// new command cannot slip past the docs check by not being listed.
func TestOperatorCommandNamesAreClassified(t *testing.T) {
	ops := operatorCommands()
	for _, dir := range []string{"workflows", "activities"} {
		for name, value := range commandConstants(t, filepath.Join(repoRoot, dir)) {
			_, internal := internalCommands[value]
			assert.True(t, slices.Contains(ops, value) || internal,
				"%s.%s = %q: add it to operatorCommands (and the docs) or to internalCommands", dir, name, value)
		}
	}
}

var commandConstRe = regexp.MustCompile(`^(Cmd|Signal|Query)[A-Z]`)

// commandConstants returns the string constants of the Go package in dir
// (its tests aside) whose names start with Cmd, Signal or Query.
func commandConstants(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i >= len(vs.Values) || !commandConstRe.MatchString(id.Name) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						out[id.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
		}
	}
	require.NotEmpty(t, out, "no Cmd/Signal/Query constants in %s: has the package moved?", dir)
	return out
}

// checkOperatorCommands checks docs/operating.md's "## Operator commands":
// each command has a "### `name`" heading, once, and no such heading
// names a command the workflows do not accept.
func checkOperatorCommands(root string, commands []string) []string {
	const file, title = "docs/operating.md", "Operator commands"
	var p problems
	d, from, to, ok := loadSection(root, file, title, &p)
	if !ok {
		return p
	}
	found := map[string]int{}
	for _, h := range d.headingsIn(from, to) {
		m := codePathRe.FindStringSubmatch(strings.TrimSpace(h.raw))
		if h.level != 3 || m == nil {
			continue
		}
		switch name := m[1]; {
		case !slices.Contains(commands, name):
			p.add(file, h.line, "### `%s`: the workflows accept no command or query %q", name, name)
		case found[name] > 0:
			p.add(file, h.line, "### `%s`: a second heading for it (the first is on line %d)", name, found[name])
		default:
			found[name] = h.line
		}
	}
	for _, c := range commands {
		if found[c] == 0 {
			p.add(file, from+1, "no \"### `%s`\" heading in \"## %s\"", c, title)
		}
	}
	return p
}
