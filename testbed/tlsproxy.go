package testbed

import (
	"crypto/tls"
	"io"
	"net"
	"time"
)

// TLSProxy terminates TLS on a loopback port and forwards the plaintext to
// a backend, the way a load balancer fronts a Temporal frontend that has no
// certificate of its own. It offers HTTP/2 by ALPN, which gRPC requires.
type TLSProxy struct {
	// Addr is where clients dial.
	Addr string
	lis  net.Listener
}

// StartTLSProxy listens on a free loopback port with cfg and forwards each
// connection to backend.
func StartTLSProxy(backend string, cfg *tls.Config) (*TLSProxy, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		return nil, err
	}
	p := &TLSProxy{Addr: lis.Addr().String(), lis: lis}
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go forward(conn, backend)
		}
	}()
	return p, nil
}

// Stop closes the listener; connections already forwarded end with their
// peers.
func (p *TLSProxy) Stop() { _ = p.lis.Close() }

func forward(client net.Conn, backend string) {
	defer client.Close()
	// The handshake happens here so that a client refused by it (no
	// certificate, an unknown CA) never reaches the backend.
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	if err := client.(*tls.Conn).Handshake(); err != nil {
		return
	}
	_ = client.SetDeadline(time.Time{})
	server, err := net.Dial("tcp", backend)
	if err != nil {
		return
	}
	defer server.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(server, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, server); done <- struct{}{} }()
	<-done
}
