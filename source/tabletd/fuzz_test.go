package tabletd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// wireServer answers GetChanges with a response decoded from raw wire
// bytes, as gRPC would decode a tablet server's reply; a reply that does
// not decode is the error gRPC would return.
type wireServer struct {
	sourcepb.TabletServerClient // only GetChanges is called
	reply                       []byte
}

func (s wireServer) GetChanges(context.Context, *sourcepb.GetChangesRequest, ...grpc.CallOption) (*sourcepb.GetChangesResponse, error) {
	out := new(sourcepb.GetChangesResponse)
	if err := proto.Unmarshal(s.reply, out); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return out, nil
}

// getChangesSeeds are GetChanges replies on the wire: records of every op,
// empty ones, malformed checkpoints and positions, an unknown op, a lag
// at its limit, and a record longer than the reply.
func getChangesSeeds(tb testing.TB) [][]byte {
	at := timestamppb.New(time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC))
	rec := func(pos string, op sourcepb.Op) *sourcepb.Record {
		return &sourcepb.Record{Tablet: "t-0001", Position: pos, CommitTime: at, Table: "orders", Op: op,
			Key: []byte(`{"id":1}`), After: []byte(`{"id":1,"note":"x"}`)}
	}
	var out [][]byte
	for _, resp := range []*sourcepb.GetChangesResponse{
		{Records: []*sourcepb.Record{rec("1.1", sourcepb.Op_INSERT), rec("1.2", sourcepb.Op_UPDATE), rec("2.1", sourcepb.Op_DELETE)},
			Checkpoint: "2.1", CaughtUp: true, ReplicaLag: durationpb.New(time.Second)},
		{Checkpoint: "7.3", CaughtUp: true},
		{},
		{Checkpoint: "x"},
		{Records: []*sourcepb.Record{rec("1.x", sourcepb.Op_INSERT)}, Checkpoint: "1.1"},
		{Records: []*sourcepb.Record{rec("1.1", sourcepb.Op(42))}, Checkpoint: "1.1",
			ReplicaLag: &durationpb.Duration{Seconds: -1 << 63, Nanos: -1}},
	} {
		b, err := proto.Marshal(resp)
		require.NoError(tb, err)
		out = append(out, b)
	}
	return append(out, []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
}

// FuzzTabletdGetChanges feeds arbitrary bytes, as a tablet server's
// GetChanges reply on the wire, through the adapter's conversion to a
// source.Batch. It must not panic. A reply that does not decode is an
// error; one with a malformed checkpoint or position is an error wrapping
// ErrBadCheckpoint (Fatal for Classify) and the zero Batch. Otherwise the
// batch carries every wire record, its position and the checkpoint parsed
// from the wire strings, and key, before and after as sent.
func FuzzTabletdGetChanges(f *testing.F) {
	for _, reply := range getChangesSeeds(f) {
		f.Add(reply)
	}
	f.Fuzz(func(t *testing.T, reply []byte) {
		r := &replicaReader{alias: "zone1-0000000101", client: wireServer{reply: reply}}
		b, err := r.GetChanges(context.Background(), source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 10, MaxWait: time.Second})
		var resp sourcepb.GetChangesResponse
		if proto.Unmarshal(reply, &resp) != nil {
			require.Error(t, err)
			require.Zero(t, b)
			return
		}
		if err != nil {
			require.True(t, errors.Is(err, source.ErrBadCheckpoint), "error %q is not a bad checkpoint", err)
			require.Equal(t, source.Fatal, Classify(err).Action)
			require.Zero(t, b)
			return
		}
		cp, perr := source.ParseCheckpoint(resp.Checkpoint)
		require.NoError(t, perr)
		require.Equal(t, cp, b.Checkpoint)
		require.Equal(t, resp.CaughtUp, b.CaughtUp)
		require.Len(t, b.Records, len(resp.Records))
		for i, w := range resp.Records {
			got := b.Records[i]
			pos, perr := source.ParseCheckpoint(w.Position)
			require.NoError(t, perr)
			require.Equal(t, pos, got.Position)
			require.Equal(t, w.Tablet, got.Tablet)
			require.Equal(t, w.Table, got.Table)
			require.NotEmpty(t, got.Op, "an op, or the wire op's name for the sink to refuse")
			require.Equal(t, w.Key, []byte(got.Key))
			require.Equal(t, w.Before, []byte(got.Before))
			require.Equal(t, w.After, []byte(got.After))
		}
	})
}
