package workflows

import (
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
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

// reportLog holds the reports a tablet under test sent its stream.
type reportLog struct{ got []TabletStatus }

// recordReports makes the environment's tablet reports to the stream
// "orders" succeed, recording each.
func recordReports(env *testsuite.TestWorkflowEnvironment) *reportLog {
	r := &reportLog{}
	env.OnSignalExternalWorkflow(mock.Anything, "orders", "", SignalTabletReport, mock.Anything).Return(
		func(_, _, _, _ string, arg any) error {
			r.got = append(r.got, arg.(TabletStatus))
			return nil
		}).Maybe()
	return r
}
