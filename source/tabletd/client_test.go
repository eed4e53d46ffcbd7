package tabletd

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// A reader's Lost fires when its tablet server stops (a server down),
// not while the server is up: a lingering tablet then reads at once.
func TestAReadersConnectionIsLostWhenItsServerStops(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	sourcepb.RegisterTabletServerServer(srv, sourcepb.UnimplementedTabletServerServer{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	c, err := Dial("127.0.0.1:1", "ks", Options{})
	require.NoError(t, err)
	defer c.Close()
	rd, err := c.OpenReplica(context.Background(), source.Replica{Tablet: "t-0001", Alias: "zone1-0001", Address: lis.Addr().String()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A call connects (tabletd's answer does not matter here).
	call := func() {
		_, _ = rd.GetChanges(ctx, source.ChangesRequest{Stream: "s", Tablet: "t-0001", MaxRecords: 1, MaxWait: time.Millisecond})
	}
	call()
	lost := rd.(source.LossWatcher).Lost(ctx)
	// Calls answered after the watch began: a watch that reported a
	// connection in use as lost would have done so by their end.
	for range 20 {
		call()
	}
	select {
	case <-lost:
		t.Fatal("lost while the server is up")
	default:
	}
	srv.Stop()
	select {
	case <-lost:
	case <-ctx.Done():
		t.Fatal("the connection to a stopped server was not reported lost")
	}
}
