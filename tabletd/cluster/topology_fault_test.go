package cluster_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// topologyCalls makes one call of every Topology RPC.
func topologyCalls(t *testing.T, topo sourcepb.TopologyClient) map[string]func() error {
	return map[string]func() error{
		"ListTablets": func() error {
			_, err := topo.ListTablets(ctx(t), &sourcepb.ListTabletsRequest{})
			return err
		},
		"GetTablet": func() error {
			_, err := topo.GetTablet(ctx(t), &sourcepb.GetTabletRequest{Tablet: "t-0001"})
			return err
		},
		"CreateStream": func() error {
			_, err := topo.CreateStream(ctx(t), &sourcepb.CreateStreamRequest{Stream: "s", StartFrom: sourcepb.StartFrom_EARLIEST})
			return err
		},
		"DescribeStream": func() error {
			_, err := topo.DescribeStream(ctx(t), &sourcepb.DescribeStreamRequest{Stream: "s"})
			return err
		},
		"DeleteStream": func() error {
			_, err := topo.DeleteStream(ctx(t), &sourcepb.DeleteStreamRequest{Stream: "other"})
			return err
		},
	}
}

func TestTopologyDownFailsEveryTopologyRPCWhileAdminAndReplicasServeUntilHealed(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 10))
	r := tc.replica(t, "t-0001", source.TypeReplica)
	rd := tc.reader(t, r)
	topo := tc.client.Topology()
	calls := topologyCalls(t, topo)

	_, err = tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{TopologyDown: true})
	require.NoError(t, err)
	for name, call := range calls {
		err := call()
		requireStatus(t, err, codes.Unavailable, sourcepb.Reason_INJECTED)
		require.Equal(t, "topology unavailable (fault injected)", status.Convert(err).Message(), name)
	}
	_, err = tc.client.ListTablets(ctx(t))
	require.Error(t, err)
	require.Equal(t, source.RetrySame, tc.client.Classify(err).Action, "a topology outage is transient")

	// Admin, on the same listener, keeps working.
	w, err := tc.admin.Workload(ctx(t), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_STATUS})
	require.NoError(t, err)
	require.Equal(t, "paused", w.State)
	d, err := tc.admin.Digest(ctx(t), &sourcepb.DigestRequest{Stream: "s"})
	require.NoError(t, err)
	require.Equal(t, uint64(10), d.Records)
	// So do the tablet servers.
	b, err := rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 100})
	require.NoError(t, err)
	require.Len(t, b.Records, 10)
	require.NoError(t, rd.Ack(ctx(t), "s", "t-0001", b.Checkpoint))

	_, err = tc.admin.Heal(ctx(t), &sourcepb.HealRequest{Topology: true})
	require.NoError(t, err)
	for name, call := range calls {
		require.NoError(t, call(), name)
	}
	s, err := topo.DescribeStream(ctx(t), &sourcepb.DescribeStreamRequest{Stream: "s"})
	require.NoError(t, err)
	for _, st := range s.Tablets {
		if st.Tablet == "t-0001" {
			require.Equal(t, b.Checkpoint.String(), st.Acked, "the ack made during the outage stuck")
		}
	}
	// Healing a healthy topology is a no-op.
	_, err = tc.admin.Heal(ctx(t), &sourcepb.HealRequest{Topology: true})
	require.NoError(t, err)
}

func TestTopologyDownForADurationHealsByItself(t *testing.T) {
	tc := start(t, nil)
	topo := tc.client.Topology()
	_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{TopologyDown: true, Duration: durationpb.New(2 * time.Second)})
	require.NoError(t, err)
	_, err = topo.ListTablets(ctx(t), &sourcepb.ListTabletsRequest{})
	requireStatus(t, err, codes.Unavailable, sourcepb.Reason_INJECTED)
	eventually(t, "the topology serves again without a heal", 15*time.Second, func() bool {
		_, err := topo.ListTablets(ctx(t), &sourcepb.ListTabletsRequest{})
		return err == nil
	})
}

func TestTopologyDownAgainReplacesItsDuration(t *testing.T) {
	tc := start(t, nil)
	topo := tc.client.Topology()
	_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{TopologyDown: true, Duration: durationpb.New(time.Hour)})
	require.NoError(t, err)
	_, err = tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{TopologyDown: true, Duration: durationpb.New(time.Second)})
	require.NoError(t, err)
	eventually(t, "the shorter duration given last ends the fault", 15*time.Second, func() bool {
		_, err := topo.ListTablets(ctx(t), &sourcepb.ListTabletsRequest{})
		return err == nil
	})
}

func TestTopologyFaultRejectsServerTabletAndOtherFaults(t *testing.T) {
	tc := start(t, nil)
	alias := tc.replica(t, "t-0001", source.TypePrimary).Alias
	faults := []struct {
		name string
		req  *sourcepb.FaultRequest
	}{
		{"with a server", &sourcepb.FaultRequest{TopologyDown: true, Server: alias}},
		{"with a tablet", &sourcepb.FaultRequest{TopologyDown: true, Tablet: "t-0001"}},
		{"with down", &sourcepb.FaultRequest{TopologyDown: true, Down: true}},
		{"with a code", &sourcepb.FaultRequest{TopologyDown: true, Code: "UNAVAILABLE"}},
		{"with latency", &sourcepb.FaultRequest{TopologyDown: true, Latency: durationpb.New(time.Second)}},
		{"zero duration", &sourcepb.FaultRequest{TopologyDown: true, Duration: durationpb.New(0)}},
		{"negative duration", &sourcepb.FaultRequest{TopologyDown: true, Duration: durationpb.New(-time.Second)}},
		{"absurd duration", &sourcepb.FaultRequest{TopologyDown: true, Duration: durationpb.New(48 * time.Hour)}},
		{"duration without topology down", &sourcepb.FaultRequest{Server: alias, NotServing: true, Duration: durationpb.New(time.Second)}},
	}
	for _, tt := range faults {
		t.Run("Fault/"+tt.name, func(t *testing.T) {
			_, err := tc.admin.Fault(ctx(t), tt.req)
			requireStatus(t, err, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST)
		})
	}
	_, err := tc.admin.Heal(ctx(t), &sourcepb.HealRequest{Topology: true, Server: alias})
	requireStatus(t, err, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST)
	// Nothing rejected took effect.
	_, err = tc.client.Topology().ListTablets(ctx(t), &sourcepb.ListTabletsRequest{})
	require.NoError(t, err)
	_, err = tc.reader(t, tc.replica(t, "t-0001", source.TypePrimary)).GetChanges(ctx(t),
		source.ChangesRequest{Stream: "none", Tablet: "t-0001", MaxRecords: 1})
	requireStatus(t, err, codes.NotFound, sourcepb.Reason_UNKNOWN_STREAM)
}
