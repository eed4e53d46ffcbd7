package cluster_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

func TestBadRequestsGetAClearStatusNeverAPanic(t *testing.T) {
	tc := start(t, nil)
	_, err := tc.client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	require.NoError(t, tc.WriteTo("t-0001", 5))
	primary := tc.replica(t, "t-0001", source.TypePrimary)
	other := tc.replica(t, "t-0002", source.TypePrimary)
	conn := adminConn(t, primary.Address)
	ts := sourcepb.NewTabletServerClient(conn)
	topo := tc.client.Topology()

	ok := func() *sourcepb.GetChangesRequest {
		return &sourcepb.GetChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 10}
	}
	with := func(f func(*sourcepb.GetChangesRequest)) *sourcepb.GetChangesRequest {
		r := ok()
		f(r)
		return r
	}
	getChanges := []struct {
		name   string
		req    *sourcepb.GetChangesRequest
		code   codes.Code
		reason sourcepb.Reason
	}{
		{"unknown stream", with(func(r *sourcepb.GetChangesRequest) { r.Stream = "nope" }), codes.NotFound, sourcepb.Reason_UNKNOWN_STREAM},
		{"empty stream", with(func(r *sourcepb.GetChangesRequest) { r.Stream = "" }), codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"unknown tablet", with(func(r *sourcepb.GetChangesRequest) { r.Tablet = "t-9999" }), codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET},
		{"empty tablet", with(func(r *sourcepb.GetChangesRequest) { r.Tablet = "" }), codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		// A tablet that exists but has no replica on this server.
		{"tablet not on this server", with(func(r *sourcepb.GetChangesRequest) { r.Tablet = firstNotOn(t, tc, primary.Alias) }), codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET},
		{"malformed checkpoint", with(func(r *sourcepb.GetChangesRequest) { r.FromCheckpoint = "one.two" }), codes.InvalidArgument, sourcepb.Reason_BAD_CHECKPOINT},
		{"checkpoint without index", with(func(r *sourcepb.GetChangesRequest) { r.FromCheckpoint = "17" }), codes.InvalidArgument, sourcepb.Reason_BAD_CHECKPOINT},
		{"checkpoint beyond the end", with(func(r *sourcepb.GetChangesRequest) { r.FromCheckpoint = "1.999999" }), codes.InvalidArgument, sourcepb.Reason_BAD_CHECKPOINT},
		{"checkpoint of a later term", with(func(r *sourcepb.GetChangesRequest) { r.FromCheckpoint = "7.1" }), codes.InvalidArgument, sourcepb.Reason_BAD_CHECKPOINT},
		{"zero batch", with(func(r *sourcepb.GetChangesRequest) { r.MaxRecords = 0 }), codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"negative batch", with(func(r *sourcepb.GetChangesRequest) { r.MaxRecords = -5 }), codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"absurd batch", with(func(r *sourcepb.GetChangesRequest) { r.MaxRecords = 2_000_000_000 }), codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"negative wait", with(func(r *sourcepb.GetChangesRequest) { r.MaxWait = durationpb.New(-time.Second) }), codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"absurd wait", with(func(r *sourcepb.GetChangesRequest) { r.MaxWait = durationpb.New(24 * time.Hour) }), codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"invalid duration", with(func(r *sourcepb.GetChangesRequest) { r.MaxWait = &durationpb.Duration{Seconds: 1, Nanos: -5} }), codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
	}
	for _, tt := range getChanges {
		t.Run("GetChanges/"+tt.name, func(t *testing.T) {
			_, err := ts.GetChanges(ctx(t), tt.req)
			requireStatus(t, err, tt.code, tt.reason)
		})
	}

	acks := []struct {
		name   string
		req    *sourcepb.AckRequest
		code   codes.Code
		reason sourcepb.Reason
	}{
		{"empty checkpoint", &sourcepb.AckRequest{Stream: "s", Tablet: "t-0001"}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"malformed checkpoint", &sourcepb.AckRequest{Stream: "s", Tablet: "t-0001", Checkpoint: "x"}, codes.InvalidArgument, sourcepb.Reason_BAD_CHECKPOINT},
		{"beyond the end", &sourcepb.AckRequest{Stream: "s", Tablet: "t-0001", Checkpoint: "1.100"}, codes.InvalidArgument, sourcepb.Reason_BAD_CHECKPOINT},
		{"unknown stream", &sourcepb.AckRequest{Stream: "x", Tablet: "t-0001", Checkpoint: "1.1"}, codes.NotFound, sourcepb.Reason_UNKNOWN_STREAM},
		{"unknown tablet", &sourcepb.AckRequest{Stream: "s", Tablet: "zzz", Checkpoint: "1.1"}, codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET},
	}
	for _, tt := range acks {
		t.Run("Ack/"+tt.name, func(t *testing.T) {
			_, err := ts.Ack(ctx(t), tt.req)
			requireStatus(t, err, tt.code, tt.reason)
		})
	}

	admin := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason sourcepb.Reason
	}{
		{"create stream without id", func() error {
			_, err := topo.CreateStream(ctx(t), &sourcepb.CreateStreamRequest{})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"create stream over an unknown table", func() error {
			_, err := topo.CreateStream(ctx(t), &sourcepb.CreateStreamRequest{Stream: "x", Tables: []string{"nope"}})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"create stream in another keyspace", func() error {
			_, err := topo.CreateStream(ctx(t), &sourcepb.CreateStreamRequest{Stream: "x", Keyspace: "other"})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"create stream with a bad start", func() error {
			_, err := topo.CreateStream(ctx(t), &sourcepb.CreateStreamRequest{Stream: "x", StartFrom: 99})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"describe an unknown stream", func() error {
			_, err := topo.DescribeStream(ctx(t), &sourcepb.DescribeStreamRequest{Stream: "x"})
			return err
		}, codes.NotFound, sourcepb.Reason_UNKNOWN_STREAM},
		{"get an unknown tablet", func() error {
			_, err := topo.GetTablet(ctx(t), &sourcepb.GetTabletRequest{Tablet: "x"})
			return err
		}, codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET},
		{"fault an unknown server", func() error {
			_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: "zone9-1", Down: true})
			return err
		}, codes.NotFound, sourcepb.Reason_UNKNOWN_SERVER},
		{"fault a tablet the server does not hold", func() error {
			_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: primary.Alias, Tablet: firstNotOn(t, tc, primary.Alias), NotServing: true})
			return err
		}, codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET},
		{"fault with no fault", func() error {
			_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: primary.Alias})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"fault with a bad code", func() error {
			_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: primary.Alias, Code: "SOMETIMES"})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"fault with a rate above 1", func() error {
			_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: primary.Alias, Code: "UNAVAILABLE", ErrorRate: 3})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"fault down for one tablet", func() error {
			_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: primary.Alias, Tablet: "t-0001", Down: true})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"fault with negative latency", func() error {
			_, err := tc.admin.Fault(ctx(t), &sourcepb.FaultRequest{Server: primary.Alias, Latency: durationpb.New(-time.Second)})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"heal an unknown server", func() error {
			_, err := tc.admin.Heal(ctx(t), &sourcepb.HealRequest{Server: "x"})
			return err
		}, codes.NotFound, sourcepb.Reason_UNKNOWN_SERVER},
		{"split an unknown tablet", func() error {
			_, err := tc.admin.Split(ctx(t), &sourcepb.SplitRequest{Tablet: "x"})
			return err
		}, codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET},
		{"digest of an unknown stream", func() error {
			_, err := tc.admin.Digest(ctx(t), &sourcepb.DigestRequest{Stream: "x"})
			return err
		}, codes.NotFound, sourcepb.Reason_UNKNOWN_STREAM},
		{"workload without action", func() error {
			_, err := tc.admin.Workload(ctx(t), &sourcepb.WorkloadRequest{})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"workload with a negative rate", func() error {
			_, err := tc.admin.Workload(ctx(t), &sourcepb.WorkloadRequest{Action: sourcepb.WorkloadRequest_RATE, Rate: -1})
			return err
		}, codes.InvalidArgument, sourcepb.Reason_BAD_REQUEST},
		{"tail an unknown tablet", func() error {
			s, err := tc.admin.Tail(ctx(t), &sourcepb.TailRequest{Tablet: "x"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.NotFound, sourcepb.Reason_UNKNOWN_TABLET},
	}
	for _, tt := range admin {
		t.Run("Admin/"+tt.name, func(t *testing.T) {
			requireStatus(t, tt.call(), tt.code, tt.reason)
		})
	}

	// After all that, every server still serves.
	for _, r := range []source.Replica{primary, other} {
		_, err := tc.reader(t, r).GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: r.Tablet, MaxRecords: 1})
		require.NoError(t, err)
	}
}

// firstNotOn returns a tablet with no replica on the server.
func firstNotOn(t *testing.T, tc *testCluster, alias string) string {
	t.Helper()
	tablets, err := tc.client.ListTablets(ctx(t))
	require.NoError(t, err)
next:
	for _, tab := range tablets {
		for _, r := range tab.Replicas {
			if r.Alias == alias {
				continue next
			}
		}
		return tab.ID
	}
	t.Fatalf("every tablet has a replica on %s", alias)
	return ""
}
