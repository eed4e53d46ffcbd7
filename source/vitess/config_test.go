package vitess_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	_ "github.com/tabletflow/tabletflow/adapters" // registers every kind, as the worker does
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source/vitess"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// vtSource is the example: a keyspace and two of its tables.
const vtSource = `"source": {"kind": "vitess", "vtctld": "127.0.0.1:15999", "keyspace": "commerce", "tables": ["customer", "corder"]},
  "sink": {"kind": "jsonl", "path": "/var/lib/tabletflow/orders"}, "startFrom": "latest"`

func TestDecodeAcceptsAVitessSource(t *testing.T) {
	got, err := config.Decode([]byte("{" + vtSource + "}"))
	require.NoError(t, err)
	require.Equal(t, "vitess", got.Source.Kind)
	require.Equal(t, []string{"customer", "corder"}, got.Source.Tables)
	c, err := vitess.ParseConfig(got.Source.Spec)
	require.NoError(t, err)
	require.Equal(t, vitess.Config{Kind: "vitess", VTCtld: "127.0.0.1:15999", Keyspace: "commerce", Tables: []string{"customer", "corder"}}, c)
	snap, err := config.Decode([]byte("{" + strings.Replace(vtSource, `"latest"`, `"snapshot"`, 1) + "}"))
	require.NoError(t, err, "a vitess stream may start from a copy of its tables")
	require.Equal(t, "snapshot", snap.StartFrom)

	// Tables are optional (every table of the keyspace); TLS and static
	// auth name files and a variable.
	full := `{"source": {"kind": "vitess", "vtctld": "vtctld:15999", "keyspace": "commerce",
	  "tls": {"ca": "/ca.pem", "cert": "/c.pem", "key": "/k.pem"},
	  "staticAuth": {"username": "tabletflow", "passwordEnv": "VITESS_PASSWORD"}},
	  "sink": {"kind": "jsonl", "path": "/x"}, "startFrom": "latest"}`
	got, err = config.Decode([]byte(full))
	require.NoError(t, err)
	c, err = vitess.ParseConfig(got.Source.Spec)
	require.NoError(t, err)
	require.Equal(t, vitess.Config{Kind: "vitess", VTCtld: "vtctld:15999", Keyspace: "commerce",
		TLS:        &tlsfiles.Files{CA: "/ca.pem", Cert: "/c.pem", Key: "/k.pem"},
		StaticAuth: &vitess.StaticAuth{Username: "tabletflow", PasswordEnv: "VITESS_PASSWORD"}}, c)
}

func TestDecodeRejectsBadVitessSourcesNamingTheField(t *testing.T) {
	// edit replaces old with new in vtSource.
	edit := func(old, new string) string {
		require.Contains(t, vtSource, old)
		return "{" + strings.Replace(vtSource, old, new, 1) + "}"
	}
	tests := []struct {
		name, in, wantPrefix string
	}{
		// vtctld is where the topology is read: required, host:port.
		{name: "no vtctld", in: edit(`"vtctld": "127.0.0.1:15999", `, ``), wantPrefix: "source.vtctld: must not be empty"},
		{name: "vtctld without port", in: edit(`"127.0.0.1:15999"`, `"vtctld"`), wantPrefix: `source.vtctld: "vtctld": want host:port`},
		// tabletd's name for it is not this source's.
		{name: "address instead of vtctld", in: edit(`"vtctld": "127.0.0.1:15999"`, `"address": "127.0.0.1:15999"`), wantPrefix: "source.address: unknown field"},
		{name: "no keyspace", in: edit(`"keyspace": "commerce", `, ``), wantPrefix: "source.keyspace: must not be empty"},
		{name: "keyspace with a slash", in: edit(`"commerce"`, `"com/merce"`), wantPrefix: `source.keyspace: "com/merce": want 1 to 64 of`},
		// A table is named as the keyspace names it, without a schema.
		{name: "qualified table", in: edit(`"corder"`, `"commerce.corder"`), wantPrefix: `source.tables[1]: "commerce.corder": want a table of the keyspace by name`},
		{name: "table twice", in: edit(`"corder"`, `"customer"`), wantPrefix: `source.tables[1]: "customer"`},
		{name: "empty table", in: edit(`"corder"`, `""`), wantPrefix: `source.tables[1]: ""`},
		// A client certificate without its key cannot do mutual TLS.
		{name: "tls cert without key", in: edit(`"keyspace": "commerce",`, `"keyspace": "commerce", "tls": {"cert": "/c.pem"},`), wantPrefix: "source.tls: cert and key go together"},
		{name: "tls unknown field", in: edit(`"keyspace": "commerce",`, `"keyspace": "commerce", "tls": {"caFile": "/ca.pem"},`), wantPrefix: "source.tls.caFile: unknown field"},
		// The password itself never goes in the config.
		{name: "password", in: edit(`"keyspace": "commerce",`, `"keyspace": "commerce", "staticAuth": {"username": "u", "password": "pw"},`),
			wantPrefix: "source.staticAuth.password: unknown field"},
		{name: "passwordEnv not a name", in: edit(`"keyspace": "commerce",`, `"keyspace": "commerce", "staticAuth": {"username": "u", "passwordEnv": "s3cr3t pw"},`),
			wantPrefix: `source.staticAuth.passwordEnv: "s3cr3t pw": want the name of the environment variable`},
		{name: "no username", in: edit(`"keyspace": "commerce",`, `"keyspace": "commerce", "staticAuth": {"passwordEnv": "PW"},`),
			wantPrefix: "source.staticAuth.username: must not be empty"},
		// A postgres source's fields are not this one's.
		{name: "shards", in: edit(`"keyspace": "commerce",`, `"keyspace": "commerce", "shards": [],`), wantPrefix: "source.shards: unknown field"},
		{name: "tokenEnv", in: edit(`"keyspace": "commerce",`, `"keyspace": "commerce", "tokenEnv": "T",`), wantPrefix: "source.tokenEnv: unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Decode([]byte(tt.in))
			require.Error(t, err)
			require.Truef(t, strings.HasPrefix(err.Error(), tt.wantPrefix), "error %q does not start with %q", err, tt.wantPrefix)
		})
	}
}

func TestOpeningNamesAPasswordVariableThatIsNotSet(t *testing.T) {
	c := vitess.Config{Kind: "vitess", VTCtld: "127.0.0.1:1", Keyspace: "k", StaticAuth: &vitess.StaticAuth{Username: "u", PasswordEnv: "TABLETFLOW_TEST_UNSET_PW"}}
	_, err := vitess.New(c, func(string) string { return "" })
	require.EqualError(t, err, "source.staticAuth.passwordEnv: TABLETFLOW_TEST_UNSET_PW is not set in the worker's environment")
	s, err := vitess.New(c, func(string) string { return "pw" })
	require.NoError(t, err)
	require.NoError(t, s.Close())
}
