package tabletd

import (
	"fmt"
	"os"
	"strings"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// Config is the source section of a stream that reads a tabletd cluster
// (docs/sources/tabletd.md).
type Config struct {
	Kind string `json:"kind"`
	// Address is the cluster's topology service, host:port.
	Address string `json:"address"`
	// Keyspace is the keyspace the stream reads.
	Keyspace string `json:"keyspace"`
	// Tables the stream reads; empty: every table.
	Tables []string `json:"tables,omitempty"`
	// TokenEnv names the environment variable holding the bearer token
	// (tabletd serve --token-env); never the token itself.
	TokenEnv string `json:"tokenEnv,omitempty"`
	// TLS names the PEM files (on the worker's machine) the worker dials
	// tabletd with: the CA that signed tabletd's certificate, and a client
	// certificate and key for mutual TLS. Absent: plaintext.
	TLS *tlsfiles.Files `json:"tls,omitempty"`
}

// Adapter is the tabletd source's kind "tabletd"; it resyncs a tablet
// (Client.Resync).
var Adapter = source.Adapter{
	Kind: config.NewKind("tabletd", ParseConfig).WithResync(),
	Open: func(cfg config.Source) (source.Source, error) { return Open(cfg) },
}

// ParseConfig decodes a source section strictly and validates it; errors
// name the field within the section.
func ParseConfig(section []byte) (Config, error) {
	var c Config
	// shards: a tabletd stream of an older tabletflow may carry it empty.
	if err := config.DecodeStrict(config.DropLegacy(section, "shards"), &c); err != nil {
		return Config{}, err
	}
	switch {
	case c.Address == "":
		return Config{}, config.FieldErr("address", "must not be empty (host:port of the topology service)")
	case !strings.Contains(c.Address, ":"):
		return Config{}, config.FieldErr("address", "%q: want host:port", c.Address)
	case c.Keyspace == "":
		return Config{}, config.FieldErr("keyspace", "must not be empty")
	case c.TokenEnv != "" && !config.ValidEnvName(c.TokenEnv):
		return Config{}, config.FieldErr("tokenEnv", "%q is not an environment variable name", c.TokenEnv)
	case c.TLS != nil:
		if err := c.TLS.Check(); err != nil {
			return Config{}, config.FieldErr("tls", "%v", err)
		}
	}
	return c, nil
}

// Open dials the cluster a source section names, reading the token from
// the environment variable it names.
func Open(cfg config.Source) (*Client, error) {
	c, err := ParseConfig(cfg.Spec)
	if err != nil {
		return nil, config.InSection("source", err)
	}
	var opts Options
	if c.TLS != nil {
		opts.TLS = *c.TLS
	}
	if c.TokenEnv != "" {
		if opts.Token = os.Getenv(c.TokenEnv); opts.Token == "" {
			return nil, fmt.Errorf("source.tokenEnv: %s is not set in the worker's environment", c.TokenEnv)
		}
	}
	return Dial(c.Address, c.Keyspace, opts)
}
