package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/tabletd/cluster"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// TestClusterServesMutualTLSToCertifiedClientsOnly runs the topology and
// every tablet server with mutual TLS: the source adapter with the client
// certificate lists tablets and reads changes from a tablet server, while a
// plaintext client, a client without a certificate and one that does not
// trust the cluster's CA are refused.
func TestClusterServesMutualTLSToCertifiedClientsOnly(t *testing.T) {
	certs, err := testbed.MakeCerts(t.TempDir())
	require.NoError(t, err)
	serverTLS, err := certs.Server(true).Server()
	require.NoError(t, err)
	tc := start(t, func(c *cluster.Config) { c.TLS = serverTLS })
	require.NoError(t, tc.WriteTo("t-0001", 25))

	client, err := tabletd.Dial(tc.Addr(), "commerce", tabletd.Options{TLS: certs.Client(true)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	_, n := readThrough(t, client, "t-0001")
	require.Equal(t, 25, n, "read from a tablet server over mutual TLS")

	refused := map[string]tlsfiles.Files{
		"plaintext":           {},
		"no certificate":      certs.Client(false),
		"unknown CA":          {CA: certs.ClientCert, Cert: certs.ClientCert, Key: certs.ClientKey},
		"certificate, no key": {CA: certs.CA, Cert: certs.ClientCert},
	}
	for name, files := range refused {
		t.Run(name, func(t *testing.T) {
			cl, err := tabletd.Dial(tc.Addr(), "commerce", tabletd.Options{TLS: files})
			if err != nil {
				require.Contains(t, err.Error(), "source.tls", "a bad pair fails at dial, naming the field")
				return
			}
			t.Cleanup(func() { _ = cl.Close() })
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = cl.ListTablets(cctx)
			require.Error(t, err, "the cluster must refuse this client")
		})
	}
}

// TestClusterRequiresItsBearerToken: with a token, the topology and every
// tablet server answer only calls that carry it; a missing or wrong token
// is UNAUTHENTICATED, which the adapter classifies as fatal (retrying
// cannot fix a credential).
func TestClusterRequiresItsBearerToken(t *testing.T) {
	tc := start(t, func(c *cluster.Config) { c.Token = "s3cret-token" })
	require.NoError(t, tc.WriteTo("t-0002", 5))

	good, err := tabletd.Dial(tc.Addr(), "commerce", tabletd.Options{Token: "s3cret-token"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = good.Close() })
	replica, n := readThrough(t, good, "t-0002")
	require.Equal(t, 5, n)

	for name, token := range map[string]string{"no token": "", "wrong token": "guess"} {
		t.Run(name, func(t *testing.T) {
			cl, err := tabletd.Dial(tc.Addr(), "commerce", tabletd.Options{Token: token})
			require.NoError(t, err)
			t.Cleanup(func() { _ = cl.Close() })
			_, err = cl.ListTablets(ctx(t))
			require.Equal(t, codes.Unauthenticated, status.Code(err), "topology: %v", err)
			require.Equal(t, source.Fatal, cl.Classify(err).Action)
			rd, err := cl.OpenReplica(ctx(t), replica)
			require.NoError(t, err)
			_, err = rd.GetChanges(ctx(t), source.ChangesRequest{Stream: "s", Tablet: "t-0002", MaxRecords: 10})
			require.Equal(t, codes.Unauthenticated, status.Code(err), "tablet server: %v", err)
		})
	}
}

// readThrough creates stream "s" with client and reads tablet from its
// first replica to the end: the replica read and the records it gave.
func readThrough(t *testing.T, client *tabletd.Client, tablet string) (source.Replica, int) {
	t.Helper()
	_, err := client.EnsureStream(ctx(t), source.StreamSpec{ID: "s"})
	require.NoError(t, err)
	replica := tabletOf(t, client, tablet).Replicas[0]
	rd, err := client.OpenReplica(ctx(t), replica)
	require.NoError(t, err)
	c := newConsumer("s")
	_, err = c.drain(ctx(t), rd, tablet, source.Checkpoint{})
	require.NoError(t, err)
	return replica, len(c.records)
}
