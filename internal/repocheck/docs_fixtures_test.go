package repocheck

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/config"
)

// Each docs check over a small repository written here: whole, it passes;
// broken on purpose (a dead link, a missing make target, an undocumented
// config field, command or metric), it names every problem.

func TestMakefileTargets(t *testing.T) {
	targets := makefileTargets(`# a comment: not: a rule
SHELL := /bin/bash
X = a:b
Y ?= $(if $(wildcard /x),/x,/y)
export PATH := $(BIN):$(PATH)
LIST := \
	./config:FuzzDecodeConfig \
	./source:FuzzParseCheckpoint
.PHONY: all build test

all: build

build: ## the binaries: into ./bin
	go build -o bin/ ./...

test bench: build $(BIN)/temporal
	go test ./...
	echo "fake: rule"

$(BIN)/temporal:
	go install x
%.o: %.c
define RECIPE
inside: define
endef
ifeq ($(X),y)
cond: ; echo
endif
dbl:: ; echo
`)
	require.Equal(t, map[string]bool{"all": true, "build": true, "test": true, "bench": true, "cond": true, "dbl": true}, targets)
}

func TestMakeMentions(t *testing.T) {
	d := parseMarkdown("x.md", "Run `make demo`, `make bench FUZZTIME=5m` and `X=1 make -j 4 build test`.\n"+
		"Then run make stop; make sure the tables fit, and make inconsistent data fit, or\nmake clean.\n"+
		"The `make` targets; `cd x && make lint`; `make -C other all`; `go test` and `make <target>`.\n"+
		"```sh\n"+
		"$ make demo-postgres   # then make pg, or make chaos\n"+
		"TABLETFLOW_DEMO_SINK_DSN=postgres://… make fuzz FUZZTIME=5m && make soak\n"+
		"echo make not-a-command-here\n"+
		"```\n")
	var got []string
	for _, m := range makeMentions(d) {
		kind := ""
		if m.prose {
			kind = " (prose)"
		}
		got = append(got, fmt.Sprintf("%d %s%s", m.line, m.target, kind))
	}
	require.Equal(t, []string{
		"1 demo", "1 bench", "1 build", "1 test",
		"2 stop (prose)", "2 inconsistent (prose)", "3 clean (prose)", // a wrapped line: make on line 3
		"4 lint",
		"6 demo-postgres", "6 pg (prose)", "6 chaos (prose)",
		"7 fuzz", "7 soak",
		"8 not-a-command-here (prose)",
	}, got)
}

// writeTree writes files (slash paths to contents) under a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return root
}

// fixtureRepo is a repository whose docs pass every check: its
// operating.md and production.md list the real config fields, commands
// and metrics.
func fixtureRepo(t *testing.T) map[string]string {
	_, fields := configFields(configRoots())
	var operating strings.Builder
	operating.WriteString("# Operating\n\n## Operator commands\n\n")
	for _, c := range operatorCommands() {
		fmt.Fprintf(&operating, "### `%s`\n\nWhat it does.\n\n", c)
	}
	operating.WriteString("## Setup\n\n## Setup\n\n## Config reference\n\n| field | meaning |\n| --- | --- |\n")
	for _, f := range fields {
		fmt.Fprintf(&operating, "| `%s` | %s |\n", f.path, f.goName)
	}
	m := workerMetrics(t)
	var production strings.Builder
	production.WriteString("# Production\n\n## Metrics\n\n| metric | meaning |\n| --- | --- |\n")
	for _, n := range m.names {
		fmt.Fprintf(&production, "| `%s` | ... |\n", n)
	}
	for _, p := range m.patterns {
		fmt.Fprintf(&production, "| `%s` | ... |\n", p)
	}
	production.WriteString("\nThe SDK's `temporal_request_latency_seconds`, say, and `tabletflow_commit_lag_seconds_bucket`.\n\n## Sizing\n")
	return map[string]string{
		"Makefile": ".PHONY: all demo test\nall: demo\ndemo: ## run it\n\techo demo\ntest:\n\tgo test ./...\n",
		"README.md": "# Fixture\n\n## Quick start\n\n`make demo`, then `make test`; make sure it stops. See\n" +
			"[the config\nreference](docs/operating.md#config-reference), [metrics](docs/production.md#metrics),\n" +
			"[the second Setup](docs/operating.md#setup-1), ![ui](docs/ui.png), [the code](go.mod#L3),\n" +
			"[the docs](docs/), [web](https://example.com/x.md) and [top](#fixture).\n\n" +
			"```md\n[in a fence](nowhere.md) make nothing\n```\n`[in code](nowhere.md)`\n",
		"go.mod":             "module x\n",
		"docs/ui.png":        "png",
		"docs/operating.md":  operating.String(),
		"docs/production.md": production.String(),
	}
}

func TestDocsChecksPassOnAWholeFixture(t *testing.T) {
	root := writeTree(t, fixtureRepo(t))
	require.Empty(t, checkLinks(root))
	require.Empty(t, checkMakeTargets(root))
	require.Empty(t, checkConfigReference(root, configRoots()))
	require.Empty(t, checkOperatorCommands(root, operatorCommands()))
	require.Empty(t, checkMetrics(root, workerMetrics(t)))
}

func TestLinkCheckFindsDeadLinksAndAnchors(t *testing.T) {
	files := fixtureRepo(t)
	files["README.md"] += "\nA [gone page](docs/gone.md) and a [bad anchor](docs/operating.md#config-refrence);\n" +
		"[no such heading](#nowhere), [absolute](/docs/operating.md), [outside](../outside.md).\n"
	files["docs/sub/page.md"] = "# Page\n\n[up](../operating.md#operator-commands) [wrong level](operating.md)\n"
	root := writeTree(t, files)
	require.Equal(t, []string{
		`README.md:16: link "docs/gone.md": no file or directory docs/gone.md in the repository`,
		`README.md:16: link "docs/operating.md#config-refrence": no heading of docs/operating.md has the anchor #config-refrence (did you mean #config-reference?)`,
		`README.md:17: link "#nowhere": no heading of README.md has the anchor #nowhere`,
		`README.md:17: link "/docs/operating.md": an absolute path; link relative to this file`,
		`README.md:17: link "../outside.md": points outside the repository`,
		`docs/sub/page.md:3: link "operating.md": no file or directory docs/sub/operating.md in the repository`,
	}, checkLinks(root))
}

func TestMakeCheckFindsMissingTargets(t *testing.T) {
	files := fixtureRepo(t)
	files["docs/development.md"] = "# Development\n\n`make bench FUZZTIME=5m` runs the benchmarks; make sure\n" +
		"you run make demo-pg first, which may make inconsistent data fit.\n\n" +
		"```sh\n$ make demo nosuch   # make lint\nmake test\n```\n"
	root := writeTree(t, files)
	require.Equal(t, []string{
		`docs/development.md:3: make bench: the Makefile has no target "bench"`,
		`docs/development.md:4: make demo-pg: the Makefile has no target "demo-pg" (if this is the verb, reword it or add "demo-pg" to englishAfterMake in internal/repocheck)`,
		`docs/development.md:7: make nosuch: the Makefile has no target "nosuch"`,
	}, checkMakeTargets(root))
}

func TestConfigCheckFindsUndocumentedAndUnknownFields(t *testing.T) {
	files := fixtureRepo(t)
	op := files["docs/operating.md"]
	op = strings.Replace(op, "| `batch.maxWait` | config.Batch.MaxWait |\n", "", 1)
	op = strings.Replace(op, "| `exclude[].alias` | config.Exclusion.Alias |\n", "", 1)
	op += "| `batch.maxWaits` | a typo |\n| `reportRate` | twice |\n| batch.linger | no backticks |\n" +
		"\n### Exclude (a per-kind sub-section)\n\n| field | meaning |\n| --- | --- |\n| `exclude[].alias` | here |\n| `exclude[]` | the array itself |\n"
	files["docs/operating.md"] = op
	root := writeTree(t, files)
	problems := checkConfigReference(root, configRoots())
	sectionLine := strings.Count(op[:strings.Index(op, "## Config reference")], "\n") + 1
	rowLine := func(row string) int { return strings.Count(op[:strings.Index(op, row)], "\n") + 1 }
	require.Equal(t, []string{
		fmt.Sprintf("docs/operating.md:%d: `batch.maxWaits`: no field of the config types (configRoots in internal/repocheck) has this path", rowLine("| `batch.maxWaits`")),
		fmt.Sprintf("docs/operating.md:%d: `reportRate`: a second row in this section (the first is on line %d)", rowLine("| `reportRate` | twice"), rowLine("| `reportRate` |")),
		fmt.Sprintf("docs/operating.md:%d: row's first cell \"batch.linger\" is not a field's dotted JSON path in backticks", rowLine("| batch.linger")),
		fmt.Sprintf("docs/operating.md:%d: `batch.maxWait` (config.Batch.MaxWait) has no row in \"## Config reference\"", sectionLine),
	}, problems)
}

// Types of a config tree with every shape configFields reads.
type (
	fixtureLeafy struct {
		A       string          `json:"a"`
		Skipped string          `json:"-"`
		D       config.Duration `json:"d,omitempty"`
	}
	fixtureEmbedded struct {
		E int `json:"e"`
	}
	fixtureStream struct {
		fixtureEmbedded
		In       fixtureLeafy             `json:"in"`
		Ptr      *fixtureLeafy            `json:"ptr,omitempty"`
		List     []fixtureLeafy           `json:"list"`
		PtrList  []*fixtureLeafy          `json:"ptrList"`
		Map      map[string]fixtureLeafy  `json:"map"`
		When     time.Time                `json:"when"`
		Strings  []string                 `json:"strings"`
		NoTag    int                      // encoding/json's name: NoTag
		Section  config.Duration          `json:"section"` // a value here, a section of another root
		Override map[string]*fixtureLeafy `json:"-"`
	}
	fixtureSection struct {
		Kind  string `json:"kind"`
		Inner struct {
			X int `json:"x"`
		} `json:"inner"`
	}
)

func TestConfigFieldsFollowEncodingJSON(t *testing.T) {
	all, required := configFields([]configRoot{
		{"", reflect.TypeFor[fixtureStream]()},
		{"section", reflect.TypeFor[fixtureSection]()},
	})
	var paths []string
	for _, f := range required {
		paths = append(paths, f.path)
	}
	require.Equal(t, []string{"NoTag", "e", "in.a", "in.d", "list[].a", "list[].d", "map", "ptr.a", "ptr.d",
		"ptrList[].a", "ptrList[].d", "section.inner.x", "section.kind", "strings", "when"}, paths)
	for _, p := range []string{"in", "ptr", "list", "ptrList", "section", "section.inner"} {
		require.Contains(t, all, p, "an object or array of objects may have a row")
		require.False(t, all[p].leaf && p != "section", p)
	}
	require.NotContains(t, all, "in.Skipped")
	require.NotContains(t, all, "Override")
	require.Equal(t, "repocheck.fixtureLeafy.D", all["list[].d"].goName)
}

func TestOperatorCommandCheckFindsUndocumentedCommands(t *testing.T) {
	files := fixtureRepo(t)
	op := files["docs/operating.md"]
	op = strings.Replace(op, "### `pause`\n", "### Pausing\n", 1)
	op = strings.Replace(op, "## Setup\n\n## Setup", "### `bogus`\n\n### `stop`\n\n## Setup\n\n## Setup", 1)
	files["docs/operating.md"] = op
	root := writeTree(t, files)
	line := func(s string, nth int) int {
		i := -1
		for range nth {
			i += 1 + strings.Index(op[i+1:], s)
		}
		return strings.Count(op[:i], "\n") + 1
	}
	require.Equal(t, []string{
		fmt.Sprintf("docs/operating.md:%d: ### `bogus`: the workflows accept no command or query \"bogus\"", line("### `bogus`", 1)),
		fmt.Sprintf("docs/operating.md:%d: ### `stop`: a second heading for it (the first is on line %d)", line("### `stop`", 2), line("### `stop`", 1)),
		"docs/operating.md:3: no \"### `pause`\" heading in \"## Operator commands\"",
	}, checkOperatorCommands(root, operatorCommands()))
}

func TestMetricsCheckFindsUndocumentedMetrics(t *testing.T) {
	files := fixtureRepo(t)
	prod := files["docs/production.md"]
	prod = strings.Replace(prod, "| `tabletflow_acks_total` | ... |\n", "", 1)
	prod = strings.Replace(prod, "| `temporal_*` | ... |\n", "", 1)
	prod = strings.Replace(prod, "## Sizing", "Also `tabletflow_nope_total`, `temporal_nope`, `temporal_request_seconds`; a label `stream`.\n\n## Sizing", 1)
	files["docs/production.md"] = prod
	root := writeTree(t, files)
	line := strings.Count(prod[:strings.Index(prod, "Also `tabletflow_nope_total`")], "\n") + 1
	require.Equal(t, []string{
		fmt.Sprintf("docs/production.md:%d: `tabletflow_nope_total`: the worker exposes no such metric", line),
		fmt.Sprintf("docs/production.md:%d: `temporal_nope`: the worker exposes no such metric", line),
		fmt.Sprintf("docs/production.md:%d: `temporal_request_seconds`: the worker exposes no such metric", line),
		"docs/production.md:3: `tabletflow_acks_total` is registered by the worker but not named in \"## Metrics\"",
		"docs/production.md:3: the metrics `temporal_*` are registered by the worker but the pattern is not named in \"## Metrics\"",
	}, checkMetrics(root, workerMetrics(t)))
}
