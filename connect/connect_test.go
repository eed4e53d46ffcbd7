package connect_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/tabletflow/tabletflow/connect"
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
	var flags connect.Flags
	opts, err := flags.Options(connect.Quiet{})
	require.NoError(t, err)
	require.Equal(t, "tabletflow.a1b2c", opts.Namespace)
	c, err := client.Dial(opts)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, []string{"Bearer key-from-the-environment"}, <-f.auth)
}
