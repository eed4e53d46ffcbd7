package tabletd_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/tabletd/cluster"
)

// The adapter resyncs a tablet whose stream expired past the retention:
// read from the checkpoint Resync returns, the tablet gives a ResyncBegin
// marker, its rows as Read records, a ResyncEnd marker, then Insert,
// Update and Delete records written after, at increasing positions; the
// same id again gives the same checkpoint; an unknown stream or tablet is
// a Fatal error naming why. The kind says it resyncs.
func TestResyncGivesAnExpiredTabletItsRowsBetweenMarkersThenItsChanges(t *testing.T) {
	require.True(t, tabletd.Adapter.Resync, "kind tabletd is registered WithResync")
	var _ source.Resyncer = (*tabletd.Client)(nil)

	cfg := cluster.DefaultConfig()
	cfg.Listen, cfg.Rate, cfg.Tablets, cfg.Lag, cfg.Seed = "127.0.0.1:0", 0, 2, 0, 7
	cfg.Retention = 300 * time.Millisecond
	cl, err := cluster.New(cfg)
	require.NoError(t, err)
	require.NoError(t, cl.Start())
	t.Cleanup(cl.Close)
	c, err := tabletd.Dial(cl.Addr(), cfg.Keyspace, tabletd.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)

	_, err = c.EnsureStream(ctx, source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	cl.Write(1000)
	tablets, err := c.ListTablets(ctx)
	require.NoError(t, err)
	rd, err := c.OpenReplica(ctx, tablets[0].Replicas[0])
	require.NoError(t, err)
	read := func(from source.Checkpoint) ([]source.Record, error) {
		var out []source.Record
		for {
			b, err := rd.GetChanges(ctx, source.ChangesRequest{Stream: "s", Tablet: "t-0001", From: from, MaxRecords: 50})
			if err != nil {
				return out, err
			}
			out, from = append(out, b.Records...), b.Checkpoint
			if b.CaughtUp && len(b.Records) == 0 {
				return out, nil
			}
		}
	}
	expired := func() bool { // asks the topology only: a read would keep the tablet active
		d, err := c.Topology().DescribeStream(ctx, &sourcepb.DescribeStreamRequest{Stream: "s"})
		require.NoError(t, err)
		return d.Tablets[0].Tablet == "t-0001" && d.Tablets[0].Expired
	}
	for deadline := time.Now().Add(10 * time.Second); !expired() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	_, err = rd.GetChanges(ctx, source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 1})
	require.Equal(t, source.Expired, c.Classify(err).Action, "the stream expired on t-0001: %v", err)

	cp, err := c.Resync(ctx, "s", "t-0001", "r1", source.Checkpoint{})
	require.NoError(t, err)
	again, err := c.Resync(ctx, "s", "t-0001", "r1", source.Checkpoint{})
	require.NoError(t, err)
	require.Equal(t, cp, again, "the same id: the same checkpoint")
	cl.Write(1000)

	recs, err := read(cp)
	require.NoError(t, err)
	require.Equal(t, source.ResyncBegin, recs[0].Op)
	ops := map[source.Op]int{}
	end := -1
	prev := cp
	for i, r := range recs {
		ops[r.Op]++
		require.Equal(t, 1, r.Position.Compare(prev), "positions increase")
		prev = r.Position
		if r.Op == source.ResyncEnd {
			end = i
		}
		if i > 0 && end < 0 {
			require.Equal(t, source.Read, r.Op, "only reads inside the copy")
		}
	}
	require.Equal(t, 1, ops[source.ResyncBegin])
	require.Equal(t, 1, ops[source.ResyncEnd])
	require.Equal(t, end-1, ops[source.Read])
	for _, op := range []source.Op{source.Read, source.Insert, source.Update, source.Delete} {
		require.NotZero(t, ops[op], "some %s", op)
	}

	for _, tt := range []struct {
		stream, tablet string
		reason         sourcepb.Reason
	}{
		{"nope", "t-0001", sourcepb.Reason_UNKNOWN_STREAM},
		{"s", "t-0099", sourcepb.Reason_UNKNOWN_TABLET},
	} {
		_, err := c.Resync(ctx, tt.stream, tt.tablet, "x", source.Checkpoint{})
		require.Error(t, err)
		require.Contains(t, err.Error(), "resync stream "+tt.stream+" on tablet "+tt.tablet)
		cls := c.Classify(err)
		require.Equal(t, source.Fatal, cls.Action, "%v", err)
		require.Equal(t, tt.reason.String(), cls.Reason)
		st, _ := status.FromError(err)
		require.NotNil(t, st)
	}
}
