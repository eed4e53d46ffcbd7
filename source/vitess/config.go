package vitess

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// Config is the source section of a stream that reads a Vitess keyspace
// (docs/sources/vitess.md).
type Config struct {
	Kind string `json:"kind"`
	// VTCtld is vtctld's gRPC address, host:port: where the topology
	// (shards, tablets and their addresses) is read.
	VTCtld string `json:"vtctld"`
	// Keyspace is the keyspace the stream reads.
	Keyspace string `json:"keyspace"`
	// Tables the stream reads, by name; empty: every table of the keyspace.
	Tables []string `json:"tables,omitempty"`
	// TLS names the PEM files (on the worker's machine) the worker dials
	// vtctld and the vttablets with: the CA that signed their
	// certificates, and a client certificate and key for mutual TLS
	// (Vitess's --grpc-auth-mode mtls). Absent: plaintext.
	TLS *tlsfiles.Files `json:"tls,omitempty"`
	// StaticAuth is a user of Vitess's static gRPC authentication
	// (--grpc-auth-mode static), sent with every call. Absent: none.
	StaticAuth *StaticAuth `json:"staticAuth,omitempty"`
}

// StaticAuth is a user of Vitess's static gRPC authentication: the
// username, and the environment variable the worker reads the password
// from (never the password itself).
type StaticAuth struct {
	Username    string `json:"username"`
	PasswordEnv string `json:"passwordEnv"`
}

// Adapter is the Vitess source's kind "vitess".
var Adapter = source.Adapter{
	Kind: config.NewKind("vitess", ParseConfig).WithSnapshot().WithResync().WithTablesInClient(),
	Open: source.OpenParsed(ParseConfig, func(c Config) (source.Source, error) { return New(c, nil) }),
}

var (
	// tableRe: a MySQL table name as the keyspace's tables are named
	// (unquoted identifiers: letters, digits, _ and $).
	tableRe = regexp.MustCompile(`^[A-Za-z0-9_$]{1,64}$`)
	// keyspaceRe: what Vitess allows in a keyspace name, short of the
	// characters no name needs (/, spaces, control characters).
	keyspaceRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

// ParseConfig decodes a source section strictly and validates it; errors
// name the field within the section.
func ParseConfig(section []byte) (Config, error) {
	var c Config
	if err := config.DecodeStrict(section, &c); err != nil {
		return Config{}, err
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c Config) validate() error {
	switch {
	case c.VTCtld == "":
		return config.FieldErr("vtctld", "must not be empty (host:port of vtctld's gRPC service)")
	case !strings.Contains(c.VTCtld, ":"):
		return config.FieldErr("vtctld", "%q: want host:port", c.VTCtld)
	case c.Keyspace == "":
		return config.FieldErr("keyspace", "must not be empty")
	case !keyspaceRe.MatchString(c.Keyspace):
		return config.FieldErr("keyspace", "%q: want 1 to 64 of letters, digits, _, ., -", c.Keyspace)
	}
	for i, t := range c.Tables {
		if !tableRe.MatchString(t) || slices.Index(c.Tables, t) != i {
			return config.FieldErr(fmt.Sprintf("tables[%d]", i), "%q: want a table of the keyspace by name (letters, digits, _, $), each once", t)
		}
	}
	if c.TLS != nil {
		if err := c.TLS.Check(); err != nil {
			return config.FieldErr("tls", "%v", err)
		}
	}
	if a := c.StaticAuth; a != nil {
		switch {
		case a.Username == "":
			return config.FieldErr("staticAuth.username", "must not be empty")
		case !config.ValidEnvName(a.PasswordEnv):
			return config.FieldErr("staticAuth.passwordEnv", "%q: want the name of the environment variable holding the password", a.PasswordEnv)
		}
	}
	return nil
}

// options are what a Source dials with, read from a config and the
// environment.
func (c Config) options(getenv func(string) string) (dialOptions, error) {
	var o dialOptions
	if c.TLS != nil {
		o.tls = *c.TLS
	}
	if a := c.StaticAuth; a != nil {
		if getenv == nil {
			getenv = os.Getenv
		}
		pw := getenv(a.PasswordEnv)
		if pw == "" {
			return o, fmt.Errorf("source.staticAuth.passwordEnv: %s is not set in the worker's environment", a.PasswordEnv)
		}
		o.username, o.password = a.Username, pw
	}
	return o, nil
}
