package repocheck

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goList returns the import paths `go list` prints for args, run from the
// module's root.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	require.NoError(t, err, "go list %v", args)
	return strings.Fields(string(out))
}

const module = "github.com/tabletflow/tabletflow/"

// isAdapter reports whether an import path is a source or sink adapter
// (a package below source/ or sink/, but for the sink contract suite) or
// the registry that lists them.
func isAdapter(path string) bool {
	rel, ok := strings.CutPrefix(path, module)
	if !ok {
		return false
	}
	switch {
	case rel == "adapters":
		return true
	case rel == "sink/sinktest":
		return false
	case strings.HasPrefix(rel, "source/"), strings.HasPrefix(rel, "sink/"):
		return true
	}
	return false
}

// TestActivitiesAndWorkflowsKnowOnlyTheInterfaces: adding a source or a
// sink touches its own package and one line of package adapters, never
// the activities or the workflows (docs/development.md, "Adding a source
// or a sink").
func TestActivitiesAndWorkflowsKnowOnlyTheInterfaces(t *testing.T) {
	var bad []string
	for _, p := range goList(t, "-deps", "./activities", "./workflows") {
		if isAdapter(p) {
			bad = append(bad, p)
		}
	}
	require.Empty(t, bad, "activities and workflows must depend on the source and sink interfaces only")
}

// TestNoSinkDependsOnTheSimulator: the sinks share the record digest
// (package digest) with tabletd, not tabletd itself.
func TestNoSinkDependsOnTheSimulator(t *testing.T) {
	for _, sink := range goList(t, "./sink/...") {
		for _, dep := range goList(t, "-deps", sink) {
			require.Falsef(t, strings.HasPrefix(dep, module+"tabletd"), "%s depends on %s", sink, dep)
		}
	}
}

func TestIsAdapter(t *testing.T) {
	for path, want := range map[string]bool{
		module + "source/postgres": true,
		module + "sink/jsonl":      true,
		module + "adapters":        true,
		module + "source":          false,
		module + "sink":            false,
		module + "sink/sinktest":   false,
		module + "config":          false,
		"example.com/source/x":     false,
	} {
		require.Equal(t, want, isAdapter(path), path)
	}
}
