package repocheck

import (
	"context"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/metrics"
)

// Check 5: every metric the worker registers is named in
// docs/production.md.

// describingRegistry is a registry that also keeps the descriptions of
// what is registered: a metric vector with no labelled child yet (all of
// metrics.New's) is registered but absent from Gather.
type describingRegistry struct {
	*prometheus.Registry
	names map[string]bool
}

var fqNameRe = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *describingRegistry) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqNameRe.FindStringSubmatch(desc.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return r.Registry.Register(c)
}

func (r *describingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// metricSet is what the worker registers (worker/main.go, with
// --metrics-addr), as the docs must name it.
type metricSet struct {
	names      []string // tabletflow's own metrics: each named in the docs
	patterns   []string // named as such: the SDK's (temporal_*), go_*, process_*
	sdkPattern string   // the SDK's pattern, among patterns
	sdkNames   []string // what the SDK's metrics may be named, through the adapter
}

// workerMetrics returns what the worker registers.
//
// What is checkable: tabletflow's own metrics (metrics.New,
// metrics.SinkSyncs and metrics.Streams) by name, every one of them. The Temporal SDK's
// metrics are made lazily, by name, as the SDK first records each
// (metrics/sdk.go); which exist depends on what the worker has done, so
// the docs name them by pattern, and the check derives that pattern by
// passing a probe named as the SDK names its metrics ("temporal_" + name)
// through the adapter, so that a prefix the adapter adds shows in the
// pattern required. The docs may list SDK metrics by name too; each such
// name must be one the SDK of go.mod defines: its metric names (an
// internal package, read from its source) go through the adapter as
// timers when the SDK calls them latencies, else as counters. The Go
// runtime and process collectors the worker also registers are named by
// pattern (go_*, process_*), derived from the collectors' own metrics.
func workerMetrics(t *testing.T) metricSet {
	t.Helper()
	var m metricSet
	reg := &describingRegistry{Registry: prometheus.NewRegistry(), names: map[string]bool{}}
	metrics.New(reg)
	metrics.SinkSyncs(reg, func() (uint64, uint64) { return 0, 0 })
	metrics.Streams(reg, func(context.Context) (map[string]int, error) { return nil, nil })
	m.names = gatheredNames(t, reg.Registry)
	for n := range reg.names {
		m.names = append(m.names, n)
	}
	slices.Sort(m.names)
	m.names = slices.Compact(m.names)
	require.NotEmpty(t, m.names)

	const probe = "temporal_repocheck_probe"
	sdk := prometheus.NewRegistry()
	metrics.NewSDKHandler(sdk).Counter(probe).Inc(1)
	got := gatheredNames(t, sdk)
	require.Len(t, got, 1)
	prefix, _, ok := strings.Cut(got[0], probe)
	require.True(t, ok, "the SDK adapter names %q %q", probe, got[0])
	m.sdkPattern = prefix + "temporal_*"
	m.patterns = append(m.patterns, m.sdkPattern)

	sdk = prometheus.NewRegistry()
	h := metrics.NewSDKHandler(sdk)
	for name, timer := range sdkMetricNames(t) {
		if timer {
			h.Timer(name).Record(time.Millisecond)
		} else {
			h.Counter(name).Inc(1)
		}
	}
	m.sdkNames = gatheredNames(t, sdk)

	runtime := prometheus.NewRegistry()
	runtime.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, n := range gatheredNames(t, runtime) {
		head, _, _ := strings.Cut(n, "_")
		if p := head + "_*"; !slices.Contains(m.patterns, p) {
			m.patterns = append(m.patterns, p)
		}
	}
	return m
}

func gatheredNames(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	var out []string
	for _, f := range families {
		out = append(out, f.GetName())
	}
	return out
}

// sdkMetricNames returns the Temporal SDK's metric names (the constants
// of the block that defines TemporalMetricsPrefix in its
// internal/common/metrics/constants.go), each with whether it is a timer
// (its constant's name ends in Latency).
func sdkMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	const sdkModule, file = "go.temporal.io/sdk", "internal/common/metrics/constants.go"
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", sdkModule).Output()
	require.NoError(t, err, "go list -m %s", sdkModule)
	path := filepath.Join(strings.TrimSpace(string(out)), filepath.FromSlash(file))
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	require.NoError(t, err, "the SDK's metric names are read from %s; if it moved, update sdkMetricNames", file)
	pkg, err := (&types.Config{}).Check("metrics", fset, []*ast.File{f}, nil)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		var idents []string
		for _, spec := range gen.Specs {
			for _, id := range spec.(*ast.ValueSpec).Names {
				idents = append(idents, id.Name)
			}
		}
		if !slices.Contains(idents, "TemporalMetricsPrefix") {
			continue
		}
		for _, id := range idents {
			c, ok := pkg.Scope().Lookup(id).(*types.Const)
			if id == "TemporalMetricsPrefix" || !ok || c.Val().Kind() != constant.String {
				continue
			}
			names[constant.StringVal(c.Val())] = strings.HasSuffix(id, "Latency")
		}
	}
	require.NotEmpty(t, names, "no metric names in the SDK's %s; if they moved, update sdkMetricNames", file)
	return names
}

// checkMetrics checks docs/production.md's "## Metrics" (its
// sub-sections included): every name and pattern of m is named in
// backticks, and no backticked tabletflow_* name, nor any under the SDK's
// pattern, is one the worker cannot expose (a histogram's _bucket, _sum
// and _count series aside).
func checkMetrics(root string, m metricSet) []string {
	const file, title = "docs/production.md", "Metrics"
	var p problems
	d, from, to, ok := loadSection(root, file, title, &p)
	if !ok {
		return p
	}
	sdkPrefix := strings.TrimSuffix(m.sdkPattern, "*")
	named := map[string]bool{}
	for _, sp := range d.codeSpans(from, to) {
		named[sp.text] = true
		var known []string
		switch {
		case !metricNameRe.MatchString(sp.text):
			continue
		case strings.HasPrefix(sp.text, "tabletflow_"):
			known = m.names
		case sdkPrefix != "" && strings.HasPrefix(sp.text, sdkPrefix):
			known = m.sdkNames
		default:
			continue
		}
		base := sp.text
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if slices.Contains(known, strings.TrimSuffix(base, suffix)) {
				base = strings.TrimSuffix(base, suffix)
			}
		}
		if !slices.Contains(known, base) {
			p.add(file, sp.line, "`%s`: the worker exposes no such metric", sp.text)
		}
	}
	for _, n := range m.names {
		if !named[n] {
			p.add(file, from+1, "`%s` is registered by the worker but not named in \"## %s\"", n, title)
		}
	}
	for _, pat := range m.patterns {
		if !named[pat] {
			p.add(file, from+1, "the metrics `%s` are registered by the worker but the pattern is not named in \"## %s\"", pat, title)
		}
	}
	return p
}

var metricNameRe = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
