package postgres

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
)

// Config is the sink section of a stream that writes into PostgreSQL
// (docs/sinks.md).
type Config struct {
	Kind string `json:"kind"`
	// DSNEnv names the environment variable holding the database's DSN.
	DSNEnv string `json:"dsnEnv"`
	// Mode: "changelog" (every record appended to <schema>.changes) or
	// "apply" (mirror tables of the source's rows). Absent: changelog.
	Mode string `json:"mode,omitempty"`
	// Schema of the sink's tables. Absent: DefaultSchema.
	Schema string `json:"schema,omitempty"`
	// Tables maps a source table ("public.orders"; tabletd's "orders") to
	// an existing table of the sink's database ("app.orders") that apply
	// mode writes its rows into, instead of a mirror table it makes: the
	// table's own column types and primary key, each value cast from the
	// record's JSON. Tables not listed get mirror tables in Schema.
	Tables map[string]string `json:"tables,omitempty"`
	// MirrorTypes: the column types of the mirror tables apply mode
	// makes: "jsonb" (every column jsonb, as every earlier version made
	// them) or "source" (each column the source's type, where the source
	// declares types: docs/sinks.md#typed-mirror-tables). Absent: jsonb.
	// A mirror table already there keeps its columns' types.
	MirrorTypes string `json:"mirrorTypes,omitempty"`
}

// MirrorTypes values.
const (
	MirrorJSONB  = "jsonb"
	MirrorSource = "source"
)

// DefaultSchema is sink.schema when the config leaves it out.
const DefaultSchema = "tabletflow"

// MaxTables bounds sink.tables (the config rides in every workflow's
// history).
const MaxTables = 1000

// openTimeout bounds connecting and setting up the sink's tables.
const openTimeout = 30 * time.Second

// Adapter is the PostgreSQL sink's kind "postgres".
var Adapter = sink.Adapter{
	Kind: config.NewKind("postgres", ParseConfig),
	Open: func(cfg config.Sink, stream string) (sink.Sink, error) {
		c, err := ParseConfig(cfg.Spec)
		if err != nil {
			return nil, config.InSection("sink", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		defer cancel()
		return New(ctx, c, stream, nil)
	},
}

var (
	identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	// sourceTableRe: a source's table name, with or without its schema.
	sourceTableRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)
	// sinkTableRe: a table of the sink's database, schema.table, each of
	// identRe (PostgreSQL's unquoted, lower-case form).
	sinkTableRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}\.[a-z_][a-z0-9_]{0,62}$`)
)

// ParseConfig decodes a sink section strictly, fills its defaults and
// validates it; errors name the field within the section.
func ParseConfig(section []byte) (Config, error) {
	var c Config
	// path: a postgres sink of an older tabletflow may carry it empty.
	if err := config.DecodeStrict(config.DropLegacy(section, "path"), &c); err != nil {
		return Config{}, err
	}
	if c.Mode == "" {
		c.Mode = "changelog"
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.MirrorTypes == "" {
		c.MirrorTypes = MirrorJSONB
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c Config) validate() error {
	switch {
	case c.DSNEnv == "":
		return config.FieldErr("dsnEnv", "must name the environment variable holding the postgres sink's DSN")
	case !config.ValidEnvName(c.DSNEnv):
		return config.FieldErr("dsnEnv", "%q is not an environment variable name", c.DSNEnv)
	case c.Mode != "changelog" && c.Mode != "apply":
		return config.FieldErr("mode", "%q: want \"changelog\" or \"apply\"", c.Mode)
	case !identRe.MatchString(c.Schema):
		return config.FieldErr("schema", "%q: want 1 to 63 of a-z, 0-9, _, not starting with a digit", c.Schema)
	case c.MirrorTypes != "" && c.MirrorTypes != MirrorJSONB && c.MirrorTypes != MirrorSource: // "": jsonb
		return config.FieldErr("mirrorTypes", "%q: want %q or %q", c.MirrorTypes, MirrorJSONB, MirrorSource)
	case c.MirrorTypes == MirrorSource && c.Mode != "apply":
		return config.FieldErr("mirrorTypes", "only for mode \"apply\" (changelog mode makes no mirror tables)")
	}
	return c.validateTables()
}

// validateTables checks the given tables: apply mode only, each source
// table (with or without its schema) to a schema.table of the sink's
// database, no two to the same one, none the sink's own tables. Keys are
// checked in sorted order, so the first error is always the same.
func (c Config) validateTables() error {
	if c.Tables == nil {
		return nil
	}
	switch {
	case c.Mode != "apply":
		return config.FieldErr("tables", "only for mode \"apply\" (changelog mode writes every record to %s.changes)", c.Schema)
	case len(c.Tables) == 0:
		return config.FieldErr("tables", "empty: leave it out, or map a source table to a table of the sink's database")
	case len(c.Tables) > MaxTables:
		return config.FieldErr("tables", "%d tables: at most %d", len(c.Tables), MaxTables)
	}
	targets := map[string]string{}
	for _, src := range slices.Sorted(maps.Keys(c.Tables)) {
		f, dst := fmt.Sprintf("tables[%q]", src), c.Tables[src]
		switch {
		case !sourceTableRe.MatchString(src):
			return config.FieldErr(f, "%q is not a source table: want table or schema.table (letters, digits, _)", src)
		case !sinkTableRe.MatchString(dst):
			return config.FieldErr(f, "%q: want schema.table of the sink's database, each 1 to 63 of a-z, 0-9, _, not starting with a digit", dst)
		case dst == c.Schema+".changes" || dst == c.Schema+".checkpoints":
			return config.FieldErr(f, "%q is one of the sink's own tables", dst)
		case targets[dst] != "":
			return config.FieldErr(f, "%q is also the table of sink.%s: one source table per table", dst, targets[dst])
		}
		targets[dst] = f
	}
	return nil
}
