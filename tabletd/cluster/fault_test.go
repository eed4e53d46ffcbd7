package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

func TestEveryFaultMapsToItsCodeReasonAndAction(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 10))
	primary := tc.replica(t, "t-0001", source.TypePrimary)
	req := source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 100}

	tests := []struct {
		name   string
		fault  *sourcepb.FaultRequest
		code   codes.Code
		reason sourcepb.Reason
		action source.Action
	}{
		// Not serving, server-wide: FAILED_PRECONDITION, retried on the replica.
		{"not serving", &sourcepb.FaultRequest{NotServing: true}, codes.FailedPrecondition, sourcepb.Reason_NOT_SERVING, source.RetrySame},
		// Not serving, one replica only.
		{"replica not serving", &sourcepb.FaultRequest{Tablet: "t-0001", NotServing: true}, codes.FailedPrecondition, sourcepb.Reason_NOT_SERVING, source.RetrySame},
		// Lost history (Vitess's GTIDSet Mismatch): try another replica.
		{"position mismatch", &sourcepb.FaultRequest{Tablet: "t-0001", PositionMismatch: true}, codes.InvalidArgument, sourcepb.Reason_POSITION_MISMATCH, source.RetryElsewhere},
		// An injected code at rate 1: that code, retried on the replica.
		{"code unavailable", &sourcepb.FaultRequest{Code: "UNAVAILABLE"}, codes.Unavailable, sourcepb.Reason_INJECTED, source.RetrySame},
		// An injected auth error is fatal.
		{"code permission denied", &sourcepb.FaultRequest{Code: "PERMISSION_DENIED", ErrorRate: 1}, codes.PermissionDenied, sourcepb.Reason_INJECTED, source.Fatal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fault.Server = primary.Alias
			_, err := tc.admin.Fault(ctx(t), tt.fault)
			require.NoError(t, err)
			_, err = tc.reader(t, primary).GetChanges(ctx(t), req)
			requireStatus(t, err, tt.code, tt.reason)
			require.Equal(t, tt.action, tc.client.Classify(err).Action)

			_, err = tc.admin.Heal(ctx(t), &sourcepb.HealRequest{Server: primary.Alias})
			require.NoError(t, err)
			b, err := tc.reader(t, primary).GetChanges(ctx(t), req)
			require.NoError(t, err, "healed")
			require.Len(t, b.Records, 10)
		})
	}
}

func TestPositionMismatchOnOneReplicaLeavesTheOthersServing(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 10))
	bad := tc.replica(t, "t-0001", source.TypeReplica)
	_, err = tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: bad.Alias, Tablet: "t-0001", PositionMismatch: true})
	require.NoError(t, err)
	req := source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 100}
	_, err = tc.reader(t, bad).GetChanges(ctx(t), req)
	require.Equal(t, source.RetryElsewhere, tc.client.Classify(err).Action)
	for _, typ := range []source.TabletType{source.TypePrimary, source.TypeRDOnly} {
		b, err := tc.reader(t, tc.replica(t, "t-0001", typ)).GetChanges(ctx(t), req)
		require.NoError(t, err, typ)
		require.Len(t, b.Records, 10)
	}
	// The same server's replicas of other tablets are not affected.
	for _, tab := range []string{"t-0002", "t-0003", "t-0004"} {
		for _, r := range tc.tablet(t, tab).Replicas {
			if r.Alias == bad.Alias {
				_, err := tc.reader(t, r).GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: tab, MaxRecords: 1})
				require.NoError(t, err, tab)
			}
		}
	}
}

func TestDownServerIsUnreachableAndUnhealthyUntilHealed(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 10))
	r := tc.replica(t, "t-0001", source.TypePrimary)
	rd := tc.reader(t, r)
	req := source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 100}
	_, err = rd.GetChanges(ctx(t), req) // a live connection exists before the fault
	require.NoError(t, err)

	_, err = tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: r.Alias, Down: true})
	require.NoError(t, err)
	_, err = rd.GetChanges(ctx(t), req)
	requireStatus(t, err, codes.Unavailable, sourcepb.Reason_REASON_UNSPECIFIED)
	require.Equal(t, source.RetrySame, tc.client.Classify(err).Action)
	down := tc.replica(t, "t-0001", source.TypePrimary)
	require.False(t, down.Healthy, "the topology reports a down server unhealthy")
	require.False(t, down.Serving)
	require.Equal(t, r.Address, down.Address)

	_, err = tc.admin.Heal(ctx(t), &sourcepb.HealRequest{Server: r.Alias})
	require.NoError(t, err)
	require.True(t, tc.replica(t, "t-0001", source.TypePrimary).Healthy)
	// The same reader reconnects (backoff capped near 1 s).
	eventually(t, "the healed server serves the same reader again", 10*time.Second, func() bool {
		b, err := rd.GetChanges(ctx(t), req)
		return err == nil && len(b.Records) == 10
	})
}

func TestLatencyLagAndUnhealthyFaults(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 10))
	r := tc.replica(t, "t-0001", source.TypeReplica)

	// Latency: a request with a shorter deadline than the latency times out.
	_, err = tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: r.Alias, Latency: durationpb.New(time.Hour)})
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
	defer cancel()
	_, err = tc.reader(t, r).GetChanges(short, source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 10})
	requireStatus(t, err, codes.DeadlineExceeded, sourcepb.Reason_REASON_UNSPECIFIED)
	require.Equal(t, source.RetrySame, tc.client.Classify(err).Action)
	_, err = tc.admin.Heal(ctx(t), &sourcepb.HealRequest{Server: r.Alias})
	require.NoError(t, err)

	// Lag: the replica reports it, and serves only what it applied.
	_, err = tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: r.Alias, Tablet: "t-0001", Lag: durationpb.New(time.Hour)})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 1))
	require.Greater(t, tc.replica(t, "t-0001", source.TypeReplica).Lag, time.Duration(0))
	b, err := tc.reader(t, r).GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 100})
	require.NoError(t, err)
	require.Empty(t, b.Records, "an hour behind: nothing applied yet")

	// Unhealthy: reported in the topology, the server still answers.
	_, err = tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: r.Alias, Tablet: "t-0001", Unhealthy: true})
	require.NoError(t, err)
	got := tc.replica(t, "t-0001", source.TypeReplica)
	require.False(t, got.Healthy)
	require.True(t, got.Serving)
	_, err = tc.admin.Heal(ctx(t), &sourcepb.HealRequest{Server: r.Alias, Tablet: "t-0001"})
	require.NoError(t, err)
	require.True(t, tc.replica(t, "t-0001", source.TypeReplica).Healthy)
}

func TestErrorRateFailsAboutThatFractionOfRequests(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	r := tc.replica(t, "t-0001", source.TypePrimary)
	_, err = tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: r.Alias, Code: "UNAVAILABLE", ErrorRate: 0.5})
	require.NoError(t, err)
	rd := tc.reader(t, r)
	failed := 0
	for range 400 {
		if _, err := rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 1}); err != nil {
			failed++
		}
	}
	// Binomial(400, 0.5): 150..250 holds with overwhelming probability.
	require.InDelta(t, 200, failed, 50)
}
