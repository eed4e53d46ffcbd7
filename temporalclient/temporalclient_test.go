package temporalclient_test

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"

	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/testbed"
)

// frontend is a Temporal frontend that answers only GetSystemInfo (what
// client.Dial calls) and keeps the authorization header it was sent.
type frontend struct {
	workflowservice.UnimplementedWorkflowServiceServer
	auth chan []string
}

func (f *frontend) GetSystemInfo(ctx context.Context, _ *workflowservice.GetSystemInfoRequest) (*workflowservice.GetSystemInfoResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	select {
	case f.auth <- md.Get("authorization"):
	default:
	}
	return &workflowservice.GetSystemInfoResponse{}, nil
}

// TestAPIKeyFromTheEnvironmentReachesTheServerOverTLS sets up the worker's
// and starter's connection the way Temporal Cloud's API-key auth is used:
// the address, the key and the CA only in the environment, no flags. The
// key must arrive as a bearer token over TLS.
func TestAPIKeyFromTheEnvironmentReachesTheServerOverTLS(t *testing.T) {
	certs, err := testbed.MakeCerts(t.TempDir())
	require.NoError(t, err)
	serverTLS, err := certs.Server(false).Server()
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)))
	f := &frontend{auth: make(chan []string, 1)}
	workflowservice.RegisterWorkflowServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	t.Setenv("TEMPORAL_ADDRESS", lis.Addr().String())
	t.Setenv("TEMPORAL_NAMESPACE", "tabletflow.a1b2c")
	t.Setenv("TEMPORAL_API_KEY", "key-from-the-environment")
	t.Setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", certs.CA)
	var flags temporalclient.Flags
	opts, err := flags.Options(temporalclient.Quiet{})
	require.NoError(t, err)
	require.Equal(t, "tabletflow.a1b2c", opts.Namespace)
	c, err := client.Dial(opts)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, []string{"Bearer key-from-the-environment"}, <-f.auth)
}

// countingGzip is gRPC's gzip compressor counting the messages it
// compresses: registered under "gzip", it is what a client asking for gzip
// uses.
type countingGzip struct {
	encoding.Compressor
	compressed atomic.Int64
}

func (c *countingGzip) Compress(w io.Writer) (io.WriteCloser, error) {
	c.compressed.Add(1)
	return c.Compressor.Compress(w)
}

// TestCallsToTemporalAreUncompressedUnlessGzipIsAsked: tabletflow's calls
// to Temporal carry small payloads, so by default they go uncompressed
// (gzip cost every poll and heartbeat CPU on the worker and the server);
// --grpc-compression gzip turns the SDK's gzip back on, and any other value
// is refused naming the flag.
func TestCallsToTemporalAreUncompressedUnlessGzipIsAsked(t *testing.T) {
	gz := &countingGzip{Compressor: encoding.GetCompressor("gzip")}
	encoding.RegisterCompressor(gz)
	t.Cleanup(func() { encoding.RegisterCompressor(gz.Compressor) })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	workflowservice.RegisterWorkflowServiceServer(srv, &frontend{auth: make(chan []string, 1)})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	dial := func(compression string) int64 {
		t.Helper()
		before := gz.compressed.Load()
		flags := temporalclient.Flags{Address: lis.Addr().String(), Compression: compression}
		opts, err := flags.Options(temporalclient.Quiet{})
		require.NoError(t, err)
		c, err := client.Dial(opts)
		require.NoError(t, err)
		defer c.Close()
		// A request with a body (gRPC does not compress an empty one); the
		// fake answers Unimplemented, which does not matter here.
		_, _ = c.WorkflowService().DescribeNamespace(context.Background(), &workflowservice.DescribeNamespaceRequest{Namespace: "default"})
		return gz.compressed.Load() - before
	}
	require.Zero(t, dial(""), "the default compressed a call")
	require.Zero(t, dial("none"), "none compressed a call")
	require.Positive(t, dial("gzip"), "gzip sent no compressed call")

	flags := temporalclient.Flags{Address: lis.Addr().String(), Compression: "zstd"}
	_, err = flags.Options(temporalclient.Quiet{})
	require.ErrorContains(t, err, `grpc-compression: "zstd": want none or gzip`)
}
