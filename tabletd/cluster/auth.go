package cluster

import (
	"context"
	"crypto/subtle"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// serverOptions are every server's options (the topology and admin
// server's, each tablet server's): TLS and the token check when
// configured, then extra interceptors.
func (c *Cluster) serverOptions(unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) []grpc.ServerOption {
	// Fixed flow-control windows turn off gRPC's bandwidth-delay
	// estimate, which pings the client on every request received (the
	// client's windows are fixed likewise: source/tabletd).
	opts := []grpc.ServerOption{grpc.InitialWindowSize(streamWindow), grpc.InitialConnWindowSize(connWindow)}
	if c.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(c.cfg.TLS)))
	}
	if c.cfg.Token != "" {
		unary = append([]grpc.UnaryServerInterceptor{c.tokenUnary}, unary...)
		stream = append([]grpc.StreamServerInterceptor{c.tokenStream}, stream...)
	}
	return append(opts, grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
}

// The flow-control windows of a call and of a connection.
const (
	streamWindow = 8 << 20
	connWindow   = 32 << 20
)

// checkToken accepts a call carrying "authorization: Bearer <Token>".
func (c *Cluster) checkToken(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if subtle.ConstantTimeCompare([]byte(v), []byte("Bearer "+c.cfg.Token)) == 1 {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "missing or wrong bearer token")
}

func (c *Cluster) tokenUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := c.checkToken(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (c *Cluster) tokenStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := c.checkToken(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}
