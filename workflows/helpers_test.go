package workflows

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/config"
)

type startOptions = client.StartWorkflowOptions

func mustConfig(t *testing.T) config.Stream {
	t.Helper()
	c, err := config.Decode([]byte(goodConfig))
	require.NoError(t, err)
	return c
}

// decodeArgs decodes a continue-as-new error's arguments.
func decodeArgs(can *workflow.ContinueAsNewError, into ...any) error {
	return converter.GetDefaultDataConverter().FromPayloads(can.Input, into...)
}
