package repocheck

import (
	"context"
	"os/exec"
	"slices"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/stretchr/testify/require"
)

// TestDockerComposeFileIsValid loads docker-compose.yml with compose-go,
// the loader `docker compose config` itself runs (schema validation,
// interpolation, normalisation), and checks the services docs/production.md
// promises. Where the docker compose plugin is installed it runs `docker
// compose config` too.
func TestDockerComposeFileIsValid(t *testing.T) {
	opts, err := cli.NewProjectOptions([]string{"../../docker-compose.yml"}, cli.WithWorkingDirectory("../.."), cli.WithName("tabletflow"))
	require.NoError(t, err)
	project, err := opts.LoadProject(context.Background())
	require.NoError(t, err)
	var names []string
	for name := range project.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	require.Equal(t, []string{"postgresql", "start-stream", "tabletd", "temporal", "temporal-schema",
		"temporal-setup", "temporal-ui", "worker"}, names)
	require.NotNil(t, project.Services["tabletd"].Build, "tabletd and the worker are built from this repository")
	require.Contains(t, project.Services["temporal"].Image, "temporalio/server", "the server image, not auto-setup")

	if exec.Command("docker", "compose", "version").Run() == nil {
		out, err := exec.Command("docker", "compose", "-f", "../../docker-compose.yml", "config", "--quiet").CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
}
