// Package tlsfiles builds TLS configurations from PEM files, the same way
// for every connection tabletflow makes or serves: the worker and starter
// to Temporal, the tabletd source adapter and `tabletd ctl` to tabletd, and
// `tabletd serve` itself. Keys stay in files the process reads; configs and
// workflow histories hold only their paths.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files names the PEM files of one side of a TLS connection. For a client,
// CA verifies the server (empty: the system roots) and Cert/Key are its
// certificate for mutual TLS. For a server, Cert/Key are its certificate
// and a CA requires every client to present a certificate signed by it.
type Files struct {
	CA   string `json:"ca,omitempty"`
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// ServerName, for a client, overrides the name the server's
	// certificate is checked against (default: the dialled host).
	ServerName string `json:"serverName,omitempty"`
}

// IsZero reports whether no file is named: the connection is plaintext.
func (f Files) IsZero() bool { return f == Files{} }

// Check reports a missing half of a certificate pair without reading
// anything, so a config can be validated where the files do not live.
func (f Files) Check() error {
	if (f.Cert == "") != (f.Key == "") {
		return errors.New("cert and key go together")
	}
	return nil
}

// Client returns the config for dialling with these files.
func (f Files) Client() (*tls.Config, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pool, err := readPool(f.CA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("cert/key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Server returns the config for serving with these files: Cert and Key are
// required; with CA, clients must present a certificate it signed.
func (f Files) Server() (*tls.Config, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("a server needs both cert and key")
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("cert/key: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if f.CA != "" {
		pool, err := readPool(f.CA)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func readPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ca: no certificate in %s", path)
	}
	return pool, nil
}
