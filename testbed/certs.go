package testbed

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/tabletflow/tabletflow/tlsfiles"
)

// Certs are the PEM files of a throw-away certificate authority made for
// one test: a server certificate for localhost and 127.0.0.1, and a client
// certificate, both signed by the CA.
type Certs struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// Server is the files a TLS server uses; with mutual, clients must present
// a certificate signed by the CA.
func (c Certs) Server(mutual bool) tlsfiles.Files {
	f := tlsfiles.Files{Cert: c.ServerCert, Key: c.ServerKey}
	if mutual {
		f.CA = c.CA
	}
	return f
}

// Client is the files a client uses; with mutual, it presents its own
// certificate.
func (c Certs) Client(mutual bool) tlsfiles.Files {
	f := tlsfiles.Files{CA: c.CA}
	if mutual {
		f.Cert, f.Key = c.ClientCert, c.ClientKey
	}
	return f
}

// MakeCerts writes a new CA and its server and client certificates into
// dir.
func MakeCerts(dir string) (Certs, error) {
	c := Certs{
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return c, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tabletflow test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return c, err
	}
	if err := writePEM(c.CA, "CERTIFICATE", caDER); err != nil {
		return c, err
	}
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage, certPath, keyPath string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			DNSNames:     []string{"localhost"},
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyPath, "PRIVATE KEY", keyDER)
	}
	if err := leaf(2, "localhost", x509.ExtKeyUsageServerAuth, c.ServerCert, c.ServerKey); err != nil {
		return c, fmt.Errorf("server certificate: %w", err)
	}
	if err := leaf(3, "tabletflow test client", x509.ExtKeyUsageClientAuth, c.ClientCert, c.ClientKey); err != nil {
		return c, fmt.Errorf("client certificate: %w", err)
	}
	return c, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
