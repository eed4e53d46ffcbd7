package adapters_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/adapters"
	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink/postgres"
	pgsource "github.com/tabletflow/tabletflow/source/postgres"
)

// pgSource is the postgres source of the example: one shard with a
// primary and a standby.
const pgSource = `"source": {"kind": "postgres", "tables": ["public.orders", "public.items"], "shards": [
  {"id": "s1", "replicas": [
    {"alias": "zone1-s1", "cell": "zone1", "type": "PRIMARY", "dsnEnv": "S1_PRIMARY_DSN"},
    {"alias": "zone2-s1", "cell": "zone2", "type": "REPLICA", "dsnEnv": "S1_STANDBY_DSN"}]}]},
  "sink": {"kind": "jsonl", "path": "/var/lib/tabletflow/orders"}`

func TestDecodeAcceptsAPostgresSource(t *testing.T) {
	got, err := config.Decode([]byte("{" + pgSource + "}"))
	require.NoError(t, err)
	require.Equal(t, "postgres", got.Source.Kind)
	require.Equal(t, []string{"public.orders", "public.items"}, got.Source.Tables)
	c, err := pgsource.ParseConfig(got.Source.Spec)
	require.NoError(t, err)
	require.Equal(t, pgsource.Config{Kind: "postgres", Tables: []string{"public.orders", "public.items"}, Shards: []pgsource.Shard{{
		ID: "s1", Replicas: []pgsource.ShardReplica{
			{Alias: "zone1-s1", Cell: "zone1", Type: "PRIMARY", DSNEnv: "S1_PRIMARY_DSN"},
			{Alias: "zone2-s1", Cell: "zone2", Type: "REPLICA", DSNEnv: "S1_STANDBY_DSN"},
		}}}}, c)
}

func TestDecodeRejectsBadPostgresSourcesNamingTheField(t *testing.T) {
	// edit replaces old with new in pgSource.
	edit := func(old, new string) string {
		require.Contains(t, pgSource, old)
		return "{" + strings.Replace(pgSource, old, new, 1) + "}"
	}
	// pg is a config whose postgres source has just the fields given.
	pg := func(fields string) string {
		return `{"source": {"kind": "postgres", ` + fields + `}, "sink": {"kind": "jsonl", "path": "/x"}}`
	}
	tests := []struct {
		name, in, wantPrefix string
	}{
		// The DSN itself in the config: a secret would be stored.
		{name: "dsn instead of dsnEnv", in: edit(`"dsnEnv": "S1_STANDBY_DSN"`, `"dsn": "postgres://u:pw@h/db"`),
			wantPrefix: `source.shards[0].replicas[1].dsn: unknown field`},
		// dsnEnv holding a DSN rather than a variable's name.
		{name: "dsnEnv not a name", in: edit(`"S1_STANDBY_DSN"`, `"postgres://h/db"`),
			wantPrefix: `source.shards[0].replicas[1].dsnEnv: "postgres://h/db": want the name of the environment variable`},
		{name: "no tables", in: edit(`"tables": ["public.orders", "public.items"], `, ``), wantPrefix: "source.tables: must list the tables"},
		{name: "table without schema", in: edit(`"public.items"`, `"items"`), wantPrefix: `source.tables[1]: "items": want schema.table`},
		{name: "table twice", in: edit(`"public.items"`, `"public.orders"`), wantPrefix: `source.tables[1]: "public.orders"`},
		{name: "no shards", in: pg(`"tables": ["public.a"], "shards": []`), wantPrefix: "source.shards: must list at least one shard"},
		{name: "shard id with a dash", in: edit(`"id": "s1"`, `"id": "s-1"`), wantPrefix: `source.shards[0].id: "s-1": want 1 to 32 of a-z, 0-9, _`},
		{name: "no replicas", in: pg(`"tables": ["public.a"], "shards": [{"id": "s1", "replicas": []}]`), wantPrefix: "source.shards[0].replicas: must list the shard's primary"},
		{name: "bad alias", in: edit(`"zone2-s1"`, `"zone2"`), wantPrefix: `source.shards[0].replicas[1].alias: "zone2": want <cell>-<name>`},
		{name: "alias twice", in: edit(`"zone2-s1"`, `"zone1-s1"`), wantPrefix: `source.shards[0].replicas[1].alias: "zone1-s1" repeats source.shards[0].replicas[0]`},
		{name: "no cell", in: edit(`"cell": "zone2"`, `"cell": ""`), wantPrefix: "source.shards[0].replicas[1].cell: must not be empty"},
		{name: "bad type", in: edit(`"type": "REPLICA"`, `"type": "STANDBY"`), wantPrefix: `source.shards[0].replicas[1].type: "STANDBY": want PRIMARY, REPLICA or RDONLY`},
		{name: "two primaries", in: edit(`"type": "REPLICA"`, `"type": "PRIMARY"`), wantPrefix: "source.shards[0].replicas: 2 of type PRIMARY: want exactly one"},
		{name: "no primary", in: edit(`"type": "PRIMARY"`, `"type": "REPLICA"`), wantPrefix: "source.shards[0].replicas: 0 of type PRIMARY"},
		{name: "tabletd address on postgres", in: edit(`"kind": "postgres",`, `"kind": "postgres", "address": "h:1",`), wantPrefix: "source.address: unknown field"},
		{name: "tls on postgres", in: edit(`"kind": "postgres",`, `"kind": "postgres", "tls": {"ca": "/ca.pem"},`), wantPrefix: "source.tls: unknown field"},
		{name: "shards on tabletd", in: `{"source": {"kind": "tabletd", "address": "h:1", "keyspace": "k", "shards": [{"id": "s1", "replicas": []}]}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: "source.shards: unknown field"},
		{name: "unknown kind", in: edit(`"kind": "postgres"`, `"kind": "mysql"`), wantPrefix: `source.kind: "mysql": want "postgres" or "tabletd" or "vitess"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { requireRejected(t, tt.in, tt.wantPrefix) })
	}
}

func TestDecodeRejectsARepeatedShard(t *testing.T) {
	in := strings.Replace("{"+pgSource+"}", `"shards": [`, `"shards": [{"id": "s1", "replicas": [{"alias": "zone1-a", "cell": "zone1", "type": "PRIMARY", "dsnEnv": "A"}]}, `, 1)
	_, err := config.Decode([]byte(in))
	require.ErrorContains(t, err, `source.shards[1].id: "s1" repeats source.shards[0]`)
}

func TestDecodeAPostgresSinkFillsDefaultsAndRejectsWhatDoesNotFit(t *testing.T) {
	src := `"source": {"kind": "tabletd", "address": "h:1", "keyspace": "k"}`
	got, err := config.Decode([]byte(`{` + src + `, "sink": {"kind": "postgres", "dsnEnv": "TABLETFLOW_SINK_DSN"}}`))
	require.NoError(t, err)
	c, err := postgres.ParseConfig(got.Sink.Spec)
	require.NoError(t, err)
	require.Equal(t, postgres.Config{Kind: "postgres", DSNEnv: "TABLETFLOW_SINK_DSN", Mode: "changelog", Schema: "tabletflow", MirrorTypes: "jsonb"}, c)

	for _, tt := range []struct{ name, sink, wantPrefix string }{
		{"no dsnEnv", `{"kind": "postgres"}`, "sink.dsnEnv: must name the environment variable"},
		{"a DSN in dsnEnv", `{"kind": "postgres", "dsnEnv": "postgres://u:pw@h/db"}`, `sink.dsnEnv: "postgres://u:pw@h/db" is not an environment variable name`},
		{"a path", `{"kind": "postgres", "dsnEnv": "D", "path": "/x"}`, "sink.path: unknown field"},
		{"unknown mode", `{"kind": "postgres", "dsnEnv": "D", "mode": "mirror"}`, `sink.mode: "mirror": want "changelog" or "apply"`},
		{"schema with a capital", `{"kind": "postgres", "dsnEnv": "D", "schema": "Tf"}`, `sink.schema: "Tf": want 1 to 63 of a-z`},
		{"mode on jsonl", `{"kind": "jsonl", "path": "/x", "mode": "changelog"}`, "sink.mode: unknown field"},
		{"unknown mirror types", `{"kind": "postgres", "dsnEnv": "D", "mode": "apply", "mirrorTypes": "typed"}`, `sink.mirrorTypes: "typed": want "jsonb" or "source"`},
		{"mirror types in changelog mode", `{"kind": "postgres", "dsnEnv": "D", "mirrorTypes": "source"}`, `sink.mirrorTypes: only for mode "apply"`},
		{"unknown kind", `{"kind": "kafka"}`, `sink.kind: "kafka": want "jsonl" or "postgres"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Decode([]byte(`{` + src + `, "sink": ` + tt.sink + `}`))
			require.Error(t, err)
			require.Truef(t, strings.HasPrefix(err.Error(), tt.wantPrefix), "error %q does not start with %q", err, tt.wantPrefix)
		})
	}
}

func TestDecodeAPostgresSinksGivenTablesNamingTheFieldAtFault(t *testing.T) {
	src := `"source": {"kind": "tabletd", "address": "h:1", "keyspace": "k"}`
	apply := func(tables string) string {
		return `{` + src + `, "sink": {"kind": "postgres", "dsnEnv": "D", "mode": "apply", "tables": ` + tables + `}}`
	}
	got, err := config.Decode([]byte(apply(`{"public.orders": "app.orders", "items": "app.items"}`)))
	require.NoError(t, err)
	c, err := postgres.ParseConfig(got.Sink.Spec)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"public.orders": "app.orders", "items": "app.items"}, c.Tables)

	for _, tt := range []struct{ name, in, wantPrefix string }{
		// Changelog mode writes every record to one change table.
		{"changelog mode", `{` + src + `, "sink": {"kind": "postgres", "dsnEnv": "D", "tables": {"public.a": "app.a"}}}`,
			`sink.tables: only for mode "apply"`},
		{"jsonl sink", `{` + src + `, "sink": {"kind": "jsonl", "path": "/x", "tables": {"public.a": "app.a"}}}`,
			"sink.tables: unknown field"},
		{"empty", apply(`{}`), "sink.tables: empty"},
		{"not an object", apply(`["app.a"]`), "sink.tables: wrong type: got JSON array"},
		{"target not a string", apply(`{"public.a": "app.a", "public.b": 1}`), `sink.tables["public.b"]: wrong type: got JSON number, want string`},
		// A target without its schema would depend on the role's search_path.
		{"target without schema", apply(`{"public.a": "a"}`), `sink.tables["public.a"]: "a": want schema.table`},
		{"target in capitals", apply(`{"public.a": "App.a"}`), `sink.tables["public.a"]: "App.a": want schema.table`},
		{"target quoted", apply(`{"public.a": "\"app\".a"}`), `sink.tables["public.a"]: "\"app\".a": want schema.table`},
		{"source with two dots", apply(`{"db.public.a": "app.a"}`), `sink.tables["db.public.a"]: "db.public.a" is not a source table`},
		{"source empty", apply(`{"": "app.a"}`), `sink.tables[""]: "" is not a source table`},
		// Two source tables in one table: their keys could collide.
		{"one target twice", apply(`{"public.a": "app.x", "public.b": "app.x"}`), `sink.tables["public.b"]: "app.x" is also the table of sink.tables["public.a"]`},
		{"the sink's checkpoints", apply(`{"public.a": "tabletflow.checkpoints"}`), `sink.tables["public.a"]: "tabletflow.checkpoints" is one of the sink's own tables`},
		{"the sink's changes", apply(`{"public.a": "tabletflow.changes"}`), `sink.tables["public.a"]: "tabletflow.changes" is one of the sink's own tables`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Decode([]byte(tt.in))
			require.Error(t, err)
			require.Truef(t, strings.HasPrefix(err.Error(), tt.wantPrefix), "error %q does not start with %q", err, tt.wantPrefix)
		})
	}
}

// TestDecodeRejectsBadTabletdAndJSONLSectionsNamingTheField: each adapter
// checks its own section, and the error names the field in the stream's
// config.
func TestDecodeRejectsBadTabletdAndJSONLSectionsNamingTheField(t *testing.T) {
	tests := []struct {
		name, in, wantPrefix string
	}{
		// A source kind the worker has no adapter for.
		{name: "unknown source kind", in: `{"source": {"kind": "kafka", "address": "a:1", "keyspace": "k"}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: `source.kind: "kafka": want "postgres" or "tabletd" or "vitess"`},
		// The topology address is required.
		{name: "missing source address", in: `{"source": {"kind": "tabletd", "keyspace": "k"}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: "source.address:"},
		// ... and must be host:port.
		{name: "source address without port", in: `{"source": {"kind": "tabletd", "address": "localhost", "keyspace": "k"}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: "source.address:"},
		// The keyspace is required.
		{name: "missing keyspace", in: `{"source": {"kind": "tabletd", "address": "a:1"}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: "source.keyspace:"},
		// tokenEnv names a variable; it is not the token.
		{name: "token instead of env name", in: `{"source": {"kind": "tabletd", "address": "a:1", "keyspace": "k", "tokenEnv": "s3cr3t token"}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: "source.tokenEnv:"},
		// A client certificate without its key (or the reverse) cannot do mutual TLS.
		{name: "tls cert without key", in: `{"source": {"kind": "tabletd", "address": "a:1", "keyspace": "k", "tls": {"ca": "/ca.pem", "cert": "/c.pem"}}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: "source.tls: cert and key go together"},
		// TLS files are paths, named by fields the decoder knows.
		{name: "tls unknown field", in: `{"source": {"kind": "tabletd", "address": "a:1", "keyspace": "k", "tls": {"caFile": "/ca.pem"}}, "sink": {"kind": "jsonl", "path": "/x"}}`,
			wantPrefix: "source.tls.caFile: unknown field"},
		// A sink kind there is no adapter for.
		{name: "unknown sink kind", in: `{"source": {"kind": "tabletd", "address": "a:1", "keyspace": "k"}, "sink": {"kind": "kafka"}}`,
			wantPrefix: `sink.kind: "kafka": want "jsonl" or "postgres"`},
		// No sink at all.
		{name: "missing sink", in: `{"source": {"kind": "tabletd", "address": "a:1", "keyspace": "k"}}`, wantPrefix: "sink.kind:"},
		// The JSONL sink needs a directory.
		{name: "jsonl without path", in: `{"source": {"kind": "tabletd", "address": "a:1", "keyspace": "k"}, "sink": {"kind": "jsonl"}}`,
			wantPrefix: "sink.path:"},
		// dsnEnv names a variable; a DSN in the config would leak into histories.
		{name: "dsn instead of env name", in: `{"source": {"kind": "tabletd", "address": "a:1", "keyspace": "k"}, "sink": {"kind": "jsonl", "path": "/x", "dsnEnv": "postgres://u:p@h/db"}}`,
			wantPrefix: "sink.dsnEnv: unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { requireRejected(t, tt.in, tt.wantPrefix) })
	}
}

// TestEveryAdapterIsRegisteredAndOpensOnlyItsKind: the lists are what
// config.Decode checks with, and a kind no adapter has is a config error.
func TestEveryAdapterIsRegisteredAndOpensOnlyItsKind(t *testing.T) {
	for _, a := range adapters.Sources {
		require.Contains(t, config.SourceKinds(), a.Name)
	}
	for _, a := range adapters.Sinks {
		require.Contains(t, config.SinkKinds(), a.Name)
	}
	_, err := adapters.OpenSource(config.Source{Kind: "kafka"})
	require.ErrorIs(t, err, config.ErrUnknownKind)
	_, err = adapters.OpenSink(config.Sink{Kind: "kafka"}, "s")
	require.ErrorIs(t, err, config.ErrUnknownKind)
}

// requireRejected decodes a stream config and requires an error that
// starts with wantPrefix (the field at fault) and the zero Stream.
func requireRejected(t *testing.T, in, wantPrefix string) {
	t.Helper()
	got, err := config.Decode([]byte(in))
	require.Error(t, err)
	require.Truef(t, strings.HasPrefix(err.Error(), wantPrefix), "error %q does not start with %q", err, wantPrefix)
	require.Zero(t, got)
}
