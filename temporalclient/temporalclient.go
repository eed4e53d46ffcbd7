// Package temporalclient is how tabletflow's binaries reach Temporal: the SDK's
// standard environment variables and config file (TEMPORAL_ADDRESS,
// TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS_*, the envconfig
// profile), with command-line flags that override them.
package temporalclient

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"strings"

	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"
	"go.temporal.io/sdk/log"

	"github.com/tabletflow/tabletflow/codec"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// Flags are the connection flags; empty ones leave the environment's value.
type Flags struct {
	Address   string
	Namespace string
	APIKey    string
	TLSCA     string
	TLSCert   string
	TLSKey    string
	// EncryptionKeyFile seals every payload with the codec package
	// (default $TABLETFLOW_ENCRYPTION_KEY_FILE, or the keys themselves in
	// $TABLETFLOW_ENCRYPTION_KEYS; neither: payloads are not encrypted).
	EncryptionKeyFile string
	// Compression is the gRPC compression of calls to Temporal: "none"
	// (the default: tabletflow's payloads are small checkpoints and
	// reports, and gzip cost every poll and heartbeat CPU on the worker
	// and the server) or "gzip" (the SDK's default, for a slow link).
	Compression string

	codec     *codec.Codec
	codecRead bool
}

// Environment variables of the encryption key set.
const (
	EnvEncryptionKeyFile = "TABLETFLOW_ENCRYPTION_KEY_FILE"
	EnvEncryptionKeys    = "TABLETFLOW_ENCRYPTION_KEYS"
)

// Register adds the flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Address, "address", "", "Temporal frontend host:port (default: $TEMPORAL_ADDRESS, the envconfig profile, then localhost:7233)")
	fs.StringVar(&f.Namespace, "namespace", "", "Temporal namespace (default: $TEMPORAL_NAMESPACE, the profile, then default)")
	fs.StringVar(&f.APIKey, "api-key", "", "API key, e.g. for Temporal Cloud (default: $TEMPORAL_API_KEY)")
	fs.StringVar(&f.TLSCA, "tls-ca", "", "CA certificate file to verify the server")
	fs.StringVar(&f.TLSCert, "tls-cert", "", "client certificate file (mTLS)")
	fs.StringVar(&f.TLSKey, "tls-key", "", "client key file (mTLS)")
	fs.StringVar(&f.Compression, "grpc-compression", "none",
		"compression of gRPC calls to Temporal: none, or gzip for a slow link")
	fs.StringVar(&f.EncryptionKeyFile, "encryption-key-file", os.Getenv(EnvEncryptionKeyFile),
		"encrypt every payload with AES-256-GCM: base64 keys one a line, the first seals, all open (default: $"+EnvEncryptionKeyFile+", or the keys in $"+EnvEncryptionKeys+")")
}

// Codec is the payload codec of the configured key set, nil when
// payloads are not encrypted.
func (f *Flags) Codec() (*codec.Codec, error) {
	if !f.codecRead {
		c, err := codec.Load(f.EncryptionKeyFile, EnvEncryptionKeys)
		if err != nil {
			return nil, err
		}
		f.codec, f.codecRead = c, true
	}
	return f.codec, nil
}

// Options loads the client options: envconfig first, then the flags.
func (f *Flags) Options(logger log.Logger) (client.Options, error) {
	opts, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		return client.Options{}, fmt.Errorf("temporal client config: %w", err)
	}
	if f.Address != "" {
		opts.HostPort = f.Address
	}
	if f.Namespace != "" {
		opts.Namespace = f.Namespace
	}
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	if f.APIKey != "" {
		opts.Credentials = client.NewAPIKeyStaticCredentials(f.APIKey)
	}
	if f.TLSCA != "" || f.TLSCert != "" || f.TLSKey != "" {
		cfg, err := f.tlsConfig()
		if err != nil {
			return client.Options{}, err
		}
		opts.ConnectionOptions.TLS = cfg
	}
	switch f.Compression {
	case "", "none":
		opts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
	case "gzip":
		opts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionGzip{}
	default:
		return client.Options{}, fmt.Errorf("grpc-compression: %q: want none or gzip", f.Compression)
	}
	c, err := f.Codec()
	if err != nil {
		return client.Options{}, err
	}
	if c != nil {
		opts.DataConverter = c.DataConverter()
		opts.FailureConverter = c.FailureConverter()
	}
	opts.Logger = logger
	return opts, nil
}

func (f *Flags) tlsConfig() (*tls.Config, error) {
	cfg, err := tlsfiles.Files{CA: f.TLSCA, Cert: f.TLSCert, Key: f.TLSKey}.Client()
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return cfg, nil
}

// CheckSearchAttributes returns an error naming the missing search
// attributes and the commands that create them.
func CheckSearchAttributes(ctx context.Context, c client.Client, namespace string, names []string) error {
	resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("list search attributes: %w", err)
	}
	var missing, cmds []string
	for _, n := range names {
		if _, ok := resp.GetCustomAttributes()[n]; !ok {
			missing = append(missing, n)
			cmds = append(cmds, fmt.Sprintf("  temporal operator search-attribute create --namespace %s --name %s --type Keyword", namespace, n))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("search attributes missing in namespace %s: %s; create them with:\n%s\n(the dev server: temporal server start-dev --search-attribute %s=Keyword ...)",
			namespace, strings.Join(missing, ", "), strings.Join(cmds, "\n"), missing[0])
	}
	return nil
}
