package workflows

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// tabletCommands records the tablet commands a stream signals, by tablet
// workflow ID, in order.
type tabletCommands struct {
	mu  sync.Mutex
	got map[string][]TabletCommand
	n   int
}

func (c *tabletCommands) mock(env *testsuite.TestWorkflowEnvironment) {
	c.got = map[string][]TabletCommand{}
	env.OnSignalExternalWorkflow(mock.Anything, mock.Anything, "", SignalTabletCommand, mock.Anything).Return(
		func(_, id, _, _ string, arg any) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.got[id] = append(c.got[id], arg.(TabletCommand))
			c.n++
			return nil
		}).Maybe()
}

// commandStream is a stream of tablets t-0001 and t-0002, both
// streaming (in its state), whose replicas are the aliases.
func commandStream(env *testsuite.TestWorkflowEnvironment, aliases ...string) *StreamState {
	rows := map[string]*TabletStatus{}
	var listed []source.Tablet
	for _, id := range []string{"t-0001", "t-0002"} {
		rows[id] = &TabletStatus{ID: id, State: Streaming, Replica: aliases[0], Checkpoint: cp(7), Seq: 1}
		var replicas []source.Replica
		for _, a := range aliases {
			replicas = append(replicas, replica(id, a))
		}
		listed = append(listed, source.Tablet{ID: id, Replicas: replicas})
	}
	w := &streamWith{lists: [][]source.Tablet{listed}}
	w.mock(env)
	return &StreamState{Tablets: rows, Aliases: slices.Clone(aliases)}
}

// repeated is a JSON list of s, n times.
func repeated(s string, n int) string {
	return `["` + strings.Repeat(s+`", "`, n-1) + s + `"]`
}

// A command naming a tablet many times tells it once: a pause signal of
// 13 KB naming t-0001 1500 times is one signal to t-0001, not 1500 (each
// a few events in the stream's history), and an update likewise.
func TestACommandNamingATabletManyTimesTellsItOnce(t *testing.T) {
	for _, how := range []string{"signal", "update"} {
		t.Run(how, func(t *testing.T) {
			env := newEnv(t)
			st := commandStream(env, "zone1-0000000101")
			var cmds tabletCommands
			cmds.mock(env)
			payload := json.RawMessage(`{"tablets": ` + repeated("t-0001", 1500) + `}`)
			require.Less(t, len(payload), maxUpdateBytes)
			env.RegisterDelayedCallback(func() {
				if how == "signal" {
					env.SignalWorkflow(CmdPause, payload)
					return
				}
				env.UpdateWorkflow(CmdPause, "p", &testsuite.TestUpdateCallback{
					OnReject: func(err error) { t.Errorf("pause rejected: %v", err) }, OnAccept: func() {}, OnComplete: func(any, error) {},
				}, payload)
			}, 5*time.Second)
			env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), st)

			cmds.mu.Lock()
			defer cmds.mu.Unlock()
			require.Equal(t, 1, cmds.n, "one signal in all: %d to t-0001, %d to t-0002",
				len(cmds.got[TabletWorkflowID("orders", "t-0001")]), len(cmds.got[TabletWorkflowID("orders", "t-0002")]))
			require.Equal(t, []TabletCommand{{Kind: CmdPause}}, cmds.got[TabletWorkflowID("orders", "t-0001")])
		})
	}
}

// A signal over the bound an update has (maxUpdateBytes) is rejected as
// the update would be: shown in the status, nothing applied, no tablet
// told. (A pause of 300 KB naming one tablet 30,000 times grew a stream's
// history by 48,000 events.)
func TestASignalOverTheUpdateBoundIsRejected(t *testing.T) {
	env := newEnv(t)
	st := commandStream(env, "zone1-0000000101")
	var cmds tabletCommands
	cmds.mock(env)
	payload := json.RawMessage(`{"tablets": ` + repeated("t-0001", 2000) + `}`)
	require.Greater(t, len(payload), maxUpdateBytes)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdPause, payload) }, 5*time.Second)
	var status StreamStatus
	env.RegisterDelayedCallback(func() { status = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 10*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), st)

	cmds.mu.Lock()
	defer cmds.mu.Unlock()
	require.Zero(t, cmds.n, "no tablet was told")
	require.Len(t, status.Rejected, 1, "the signal is rejected: %+v", status.Rejected)
	require.Equal(t, CmdPause, status.Rejected[0].Signal)
	require.Contains(t, status.Rejected[0].Reason, "at most 16384")
}

// An include tells each tablet it concerns only the aliases it holds:
// its own automatic exclusions of them, and the operator's exclusions it
// lifts that apply to that tablet; not the request's whole list, once per
// tablet.
func TestIncludeTellsEachTabletOnlyTheAliasesThatConcernIt(t *testing.T) {
	aliases := []string{"zone1-0000000101", "zone1-0000000102", "zone1-0000000103", "zone1-0000000104", "zone1-0000000105", "zone1-0000000106"}
	env := newEnv(t)
	st := commandStream(env, aliases...)
	// t-0001 streams, holding an automatic exclusion of 102; t-0002 waits
	// for an eligible replica. The operator excluded 103 on every tablet
	// and 104 on t-0002.
	st.Tablets["t-0001"].Excluded = config.ExcludeList{{Alias: aliases[1], Tablet: "t-0001", Reason: "POSITION_MISMATCH"}}
	st.Tablets["t-0002"].State = NoEligibleReplica
	st.Exclude = config.ExcludeList{{Alias: aliases[2], Reason: "maintenance"}, {Alias: aliases[3], Tablet: "t-0002", Reason: "slow"}}
	var cmds tabletCommands
	cmds.mock(env)
	// The request names every alias, some twice.
	req, err := json.Marshal(IncludeRequest{Aliases: append(slices.Clone(aliases), aliases...)})
	require.NoError(t, err)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(CmdInclude, json.RawMessage(req)) }, 5*time.Second)
	var status StreamStatus
	env.RegisterDelayedCallback(func() { status = queryStatus[StreamStatus](t, env); env.CancelWorkflow() }, 10*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), st)

	cmds.mu.Lock()
	defer cmds.mu.Unlock()
	require.Equal(t, map[string][]TabletCommand{
		TabletWorkflowID("orders", "t-0001"): {{Kind: CmdInclude, Aliases: []string{aliases[1], aliases[2]}}},
		TabletWorkflowID("orders", "t-0002"): {{Kind: CmdInclude, Aliases: []string{aliases[2], aliases[3]}}},
	}, cmds.got)
	require.Empty(t, status.Exclude, "the operator's exclusions are lifted")
}
