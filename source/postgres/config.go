package postgres

import (
	"fmt"
	"regexp"
	"slices"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// Config is the source section of a stream that reads sharded PostgreSQL
// (docs/sources/postgres.md).
type Config struct {
	Kind string `json:"kind"`
	// Tables to publish, as schema.table.
	Tables []string `json:"tables"`
	// Shards are the stream's tablets.
	Shards []Shard `json:"shards"`
}

// Shard is one PostgreSQL shard: a tablet of the stream.
type Shard struct {
	ID       string         `json:"id"`
	Replicas []ShardReplica `json:"replicas"`
}

// ShardReplica is one server of a shard. Its DSN is read by the worker
// from the environment variable DSNEnv, never stored in the config.
type ShardReplica struct {
	Alias  string `json:"alias"`
	Cell   string `json:"cell"`
	Type   string `json:"type"`
	DSNEnv string `json:"dsnEnv"`
}

// Adapter is the PostgreSQL source's kind "postgres".
var Adapter = source.Adapter{
	Kind: config.NewKind("postgres", ParseConfig).WithSnapshot().WithResync().WithAdhocSnapshot().WithTableChange(),
	Open: source.OpenParsed(ParseConfig, func(c Config) (source.Source, error) { return New(c, nil) }),
}

var (
	tableRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$`)
	shardRe = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)
)

// ParseConfig decodes a source section strictly and validates it: published
// tables named schema.table, shards with unique IDs, each with one primary
// and replicas of unique aliases whose DSNs come from environment
// variables. Errors name the field within the section.
func ParseConfig(section []byte) (Config, error) {
	var c Config
	// address, keyspace, tokenEnv, tls: every postgres stream of an older
	// tabletflow carries the first two empty (one struct held every kind's
	// fields), and it took the others empty.
	if err := config.DecodeStrict(config.DropLegacy(section, "address", "keyspace", "tokenEnv", "tls"), &c); err != nil {
		return Config{}, err
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c Config) validate() error {
	if err := validateTables(c.Tables); err != nil {
		return err
	}
	if len(c.Shards) == 0 {
		return config.FieldErr("shards", "must list at least one shard")
	}
	aliases := map[string]string{}
	for i, sh := range c.Shards {
		f := fmt.Sprintf("shards[%d]", i)
		if !shardRe.MatchString(sh.ID) {
			return config.FieldErr(f+".id", "%q: want 1 to 32 of a-z, 0-9, _ (it names the shard's replication slots)", sh.ID)
		}
		for j := range i {
			if c.Shards[j].ID == sh.ID {
				return config.FieldErr(f+".id", "%q repeats source.shards[%d]", sh.ID, j)
			}
		}
		if len(sh.Replicas) == 0 {
			return config.FieldErr(f+".replicas", "must list the shard's primary and its standbys")
		}
		primaries := 0
		for j, r := range sh.Replicas {
			rf := fmt.Sprintf("%s.replicas[%d]", f, j)
			switch {
			case !config.ValidAlias(r.Alias):
				return config.FieldErr(rf+".alias", "%q: want <cell>-<name>", r.Alias)
			case aliases[r.Alias] != "":
				return config.FieldErr(rf+".alias", "%q repeats source.%s", r.Alias, aliases[r.Alias])
			case r.Cell == "":
				return config.FieldErr(rf+".cell", "must not be empty")
			case !config.ValidTabletType(r.Type):
				return config.FieldErr(rf+".type", "%q: want PRIMARY, REPLICA or RDONLY", r.Type)
			case !config.ValidEnvName(r.DSNEnv):
				return config.FieldErr(rf+".dsnEnv", "%q: want the name of the environment variable holding the DSN", r.DSNEnv)
			}
			aliases[r.Alias] = rf
			if r.Type == "PRIMARY" {
				primaries++
			}
		}
		if primaries != 1 {
			return config.FieldErr(f+".replicas", "%d of type PRIMARY: want exactly one (publications are created on it)", primaries)
		}
	}
	return nil
}

// validateTables checks a list of tables to publish: not empty, each
// schema.table, each once.
func validateTables(tables []string) error {
	if len(tables) == 0 {
		return config.FieldErr("tables", "must list the tables to publish, as schema.table")
	}
	for i, t := range tables {
		if !tableRe.MatchString(t) || slices.Index(tables, t) != i {
			return config.FieldErr(fmt.Sprintf("tables[%d]", i), "%q: want schema.table (letters, digits, _), each once", t)
		}
	}
	return nil
}
