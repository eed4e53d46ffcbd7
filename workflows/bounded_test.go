package workflows

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/proto"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// bigStreamState is a stream of n tablets in every state, whose reasons,
// last errors and exclusions are long: text(i, what) makes tablet i's.
func bigStreamState(n int, text func(i int, what string) string) *StreamState {
	states := []State{Streaming, Retrying, NoEligibleReplica, Paused, Split, Stopped, Failed, Expired, Streaming, Retrying}
	st := &StreamState{Tablets: map[string]*TabletStatus{}, Intents: true}
	for i := range n {
		id := fmt.Sprintf("t-%05d", i)
		row := &TabletStatus{ID: id, State: states[i%len(states)], Replica: fmt.Sprintf("zone%d-%010d", i%3+1, 100+i%7),
			Checkpoint: cp(uint64(1000 + i)), Records: int64(1000 + i), Batches: int64(10 + i%100), Attempt: 1,
			LagSeconds: 0.25, Updated: time.Date(2026, 11, 30, 10, 0, 0, i, time.UTC), Seq: int64(i%50 + 1)}
		switch row.State {
		case Streaming, Paused:
		case Split:
			row.Children = []string{id + "a", id + "b"}
			row.Handoff = cp(uint64(2000 + i))
			row.Reason = text(i, "split")
		default:
			row.Reason, row.LastError = text(i, "reason"), text(i, "error")
			row.Attempt = int32(i%9 + 1)
			row.Excluded = config.ExcludeList{
				{Alias: fmt.Sprintf("zone2-%010d", 200+i%5), Tablet: id, Reason: "POSITION_MISMATCH", Expires: row.Updated.Add(5 * time.Minute)},
				{Alias: fmt.Sprintf("zone3-%010d", 300+i%5), Tablet: id, Reason: "RETRIES_EXHAUSTED", Expires: row.Updated.Add(5 * time.Minute)},
			}
		}
		if row.State == Paused {
			row.PausedAt = row.Updated
			st.Paused = append(st.Paused, id)
		}
		st.Tablets[id] = row
	}
	for i := range 3 * 7 {
		st.Aliases = append(st.Aliases, fmt.Sprintf("zone%d-%010d", i%3+1, 100+i%7))
	}
	return st
}

// templated reasons, as the tablets write them: the same words, with the
// tablet's replicas, positions and numbers in them; each 500 bytes.
func templated(i int, what string) string {
	s := fmt.Sprintf("%s of t-%05d: replica zone1-%010d cannot serve position 1.%d: lagging %ds behind (maxLag 30s); "+
		"zone2-%010d: excluded by the operator (maintenance of the cell, ticket OPS-%d) until 2026-11-30T12:00:00Z; "+
		"zone3-%010d: POSITION_MISMATCH: the replica's history starts at 1.%d, after the checkpoint; ",
		what, i, 100+i%7, 1000+i, i%97, 200+i%5, 4000+i%13, 300+i%5, 900+i)
	for len(s) < 500 {
		s += "the tablet selects again with backoff; "
	}
	return s[:500]
}

// random reasons: 500 bytes no compression shrinks.
func random(i int, what string) string {
	r := rand.New(rand.NewPCG(uint64(i), uint64(len(what))))
	b := make([]byte, 500)
	for j := range b {
		b[j] = byte('!' + r.IntN(94))
	}
	return string(b)
}

// A stream of 10,000 tablets, many of them with long reasons and last
// errors, continues as new with a payload well under the server's 2 MB
// limit (above it, Temporal fails the workflow task, and the stream with
// it); and the next run has every tablet, with what the status needs.
func TestAStreamOfTenThousandTabletsContinuesAsNewWellUnder2MB(t *testing.T) {
	const tablets = 10000
	const budget = 1 << 20 // well under 2 MB: the config rides beside it
	for _, tt := range []struct {
		name string
		text func(int, string) string
		shed bool // the rows' texts are shed to fit
	}{
		{"templated reasons", templated, false},
		{"random reasons", random, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			st := bigStreamState(tablets, tt.text)
			var listed []source.Tablet
			for id, row := range st.Tablets {
				if row.State != Split {
					listed = append(listed, source.Tablet{ID: id})
				}
			}
			w := &streamWith{lists: [][]source.Tablet{listed}}
			w.mock(env)
			env.SetTestTimeout(2 * time.Minute)
			env.RegisterDelayedCallback(func() { env.SetContinueAsNewSuggested(true) }, 5*time.Second)
			env.ExecuteWorkflow(StreamWorkflow, streamConfig(t), st)

			var can *workflow.ContinueAsNewError
			require.True(t, errors.As(env.GetWorkflowError(), &can), "%v", env.GetWorkflowError())
			size := proto.Size(can.Input)
			t.Logf("continue-as-new payload: %d bytes for %d tablets", size, tablets)
			require.Less(t, size, budget, "the continue-as-new payload")
			var raw json.RawMessage
			var next *StreamState
			require.NoError(t, decodeArgs(can, &raw, &next))
			require.Len(t, next.Tablets, tablets)
			for id, was := range st.Tablets {
				got := next.Tablets[id]
				require.NotNil(t, got, id)
				require.Equal(t, was.State, got.State, id)
				require.Equal(t, was.Checkpoint, got.Checkpoint, id)
				require.Equal(t, was.Records, got.Records, id)
				require.Equal(t, was.Children, got.Children, id)
				require.Equal(t, was.Handoff, got.Handoff, id)
				require.Equal(t, was.Replica, got.Replica, id)
				require.Equal(t, was.PausedAt, got.PausedAt, id)
				require.Equal(t, was.Seq, got.Seq, id)
				if tt.shed {
					continue
				}
				// Texts as real tablets write them fit: nothing shed.
				require.Equal(t, was.Reason, got.Reason, id)
				if !terminal(was.State) {
					require.Equal(t, was.LastError, got.LastError, id)
					require.Equal(t, was.Excluded, got.Excluded, id)
				}
			}
			require.Equal(t, st.Paused, next.Paused)
		})
	}
}

// bigPostgresSource is a postgres source section of n shards, two
// replicas each: about 200 bytes a shard.
func bigPostgresSource(n int) map[string]any {
	var shards []any
	for i := range n {
		id := fmt.Sprintf("s%04d", i)
		shards = append(shards, map[string]any{"id": id, "replicas": []any{
			map[string]any{"alias": "zone1-" + id + "p", "cell": "zone1", "type": "PRIMARY", "dsnEnv": strings.ToUpper(id) + "_PRIMARY_DSN"},
			map[string]any{"alias": "zone2-" + id + "a", "cell": "zone2", "type": "REPLICA", "dsnEnv": strings.ToUpper(id) + "_STANDBY_DSN"},
		}})
	}
	return map[string]any{"kind": "postgres", "tables": []string{"public.orders", "public.items"}, "shards": shards}
}

// A tablet's workflow input carries what the tablet needs, not the whole
// stream config once per tablet: a stream of 1,000 PostgreSQL shards has
// a source section of 200 KB, and its 1,000 tablets' inputs, all in the
// stream's history, were 200 MB of it (the server's history limit is
// 50 MB). The sections ride by reference instead (the stream's ID and
// the config's digest), which the tablet's activities resolve.
func TestATabletsInputCarriesWhatTheTabletNeedsNotTheWholeConfig(t *testing.T) {
	env := newEnv(t)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(goodConfig), &m))
	m["source"] = bigPostgresSource(1000)
	m["batch"] = map[string]any{"maxRecords": 500}
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	require.Greater(t, len(raw), 150<<10)
	sum := sha256.Sum256(raw)
	env.OnActivity(a.EnsureStream, mock.Anything, mock.Anything).Return(source.Stream{ID: "orders"}, nil)
	env.OnActivity(a.ReadTopology, mock.Anything, mock.Anything).Return(
		activities.TopologyOf([]source.Tablet{{ID: "s0000"}, {ID: "s0001"}, {ID: "s0002"}}), nil)
	var mu sync.Mutex
	inputs := map[string]TabletInput{}
	sizes := map[string]int{}
	env.OnWorkflow(TabletWorkflow, mock.Anything, mock.Anything, mock.Anything).Return(
		func(_ workflow.Context, in TabletInput, _ *TabletState) error {
			p, err := converter.GetDefaultDataConverter().ToPayload(in)
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			inputs[in.Tablet], sizes[in.Tablet] = in, proto.Size(p)
			return nil
		})
	var config string
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(activities.QueryConfig)
		require.NoError(t, err)
		require.NoError(t, v.Get(&config))
		env.CancelWorkflow()
	}, 5*time.Second)
	env.ExecuteWorkflow(StreamWorkflow, json.RawMessage(raw), (*StreamState)(nil))

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, inputs, 3)
	for id, in := range inputs {
		require.Less(t, sizes[id], 4<<10, "%s's input: %d bytes for a config of %d", id, sizes[id], len(raw))
		require.Equal(t, &activities.ConfigRef{Stream: "orders", Digest: hex.EncodeToString(sum[:])}, in.Sections, id)
		require.Equal(t, "postgres", in.Config.Source.Kind)
		require.Equal(t, 500, in.Config.Batch.MaxRecords, "the tunables ride as they are")
	}
	require.Equal(t, string(raw), config, "the stream answers its config, for the tablets' activities")
}

// A tablet passes its sections' reference to its activities, which read
// the stream's config with it.
func TestATabletPassesItsConfigReferenceToItsActivities(t *testing.T) {
	env := newEnv(t)
	env.SetStartWorkflowOptions(clientOptions(TabletWorkflowID("orders", "t-0001")))
	ref := &activities.ConfigRef{Stream: "orders", Digest: "abc"}
	var picked, read []*activities.ConfigRef
	env.OnActivity(a.SelectReplica, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.SelectReplicaInput) (activities.Selection, error) {
			picked = append(picked, in.Sections)
			return activities.Selection{Replica: replica("t-0001", "zone1-0000000101"), Candidates: 1}, nil
		})
	env.OnActivity(a.GetChanges, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.GetChangesInput) (activities.GetChangesResult, error) {
			read = append(read, in.Sections)
			return activities.GetChangesResult{}, nonRetryable(activities.ErrFatal, "done")
		})
	recordReports(env)
	env.ExecuteWorkflow(TabletWorkflow, TabletInput{Stream: "orders", Tablet: "t-0001", Config: mustConfig(t), Tablets: 1, Sections: ref}, (*TabletState)(nil))
	require.NoError(t, env.GetWorkflowError())
	require.Equal(t, []*activities.ConfigRef{ref}, picked)
	require.Equal(t, []*activities.ConfigRef{ref}, read)
}

// An ended tablet's row keeps what its status shows across
// continue-as-new: not its exclusions, last error or slot statistics, nor
// a pause intent, unless it can be retried (Failed).
func TestCompactKeepsAnEndedTabletsRowToWhatItsStatusShows(t *testing.T) {
	slot := &source.SlotStats{LagBytes: 10, SafeWALBytes: -1}
	excluded := config.ExcludeList{{Alias: "zone1-0000000101", Reason: "POSITION_MISMATCH"}}
	st := &StreamState{Tablets: map[string]*TabletStatus{}}
	for i, state := range []State{Split, Stopped, Expired, Failed, Paused, Streaming} {
		id := fmt.Sprintf("t-%04d", i)
		st.Tablets[id] = &TabletStatus{ID: id, State: state, Reason: "why", LastError: "what", Excluded: excluded, Slot: slot, Checkpoint: cp(7)}
		st.Paused = append(st.Paused, id)
	}
	s := &stream{st: st}
	s.compact()
	for _, id := range s.tabletIDs() {
		row := st.Tablets[id]
		ended := terminal(row.State)
		require.Equal(t, "why", row.Reason, id)
		require.Equal(t, cp(7), row.Checkpoint, id)
		require.Equal(t, ended, row.LastError == "" && row.Excluded == nil && row.Slot == nil, "%s %s: %+v", id, row.State, row)
	}
	require.Equal(t, []string{"t-0003", "t-0004", "t-0005"}, st.Paused, "the pause of a Failed tablet and of the running ones")
}
