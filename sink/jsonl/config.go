package jsonl

import (
	"encoding/json"
	"path/filepath"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
)

// Config is the sink section of a stream that writes JSONL files
// (docs/sinks.md).
type Config struct {
	Kind string `json:"kind"`
	// Path is the directory the stream's files go in.
	Path string `json:"path"`
}

// Adapter is the JSONL sink's kind "jsonl".
var Adapter = sink.Adapter{
	Kind: config.NewKind("jsonl", ParseConfig),
	Open: func(cfg config.Sink, stream string) (sink.Sink, error) {
		c, err := ParseConfig(cfg.Spec)
		if err != nil {
			return nil, config.InSection("sink", err)
		}
		return New(c.Path, stream)
	},
}

// ParseConfig decodes a sink section strictly and validates it; errors
// name the field within the section.
func ParseConfig(section []byte) (Config, error) {
	var c Config
	// mode, schema, tables: a jsonl stream of an older tabletflow may
	// carry them empty (one struct held every kind's fields).
	section = config.DropLegacy(section, "mode", "schema", "tables")
	// dsnEnv: an older tabletflow took (and ignored) an environment
	// variable's name here, so a running stream may carry one; it is
	// ignored still. Anything else is an unknown field, as it was an error.
	section = dropEnvName(section, "dsnEnv")
	if err := config.DecodeStrict(section, &c); err != nil {
		return Config{}, err
	}
	if c.Path == "" {
		return Config{}, config.FieldErr("path", "must not be empty for the jsonl sink")
	}
	c.Path = filepath.Clean(c.Path)
	return c, nil
}

// dropEnvName returns section without key if key holds an environment
// variable's name.
func dropEnvName(section []byte, key string) []byte {
	var fields map[string]json.RawMessage
	if json.Unmarshal(section, &fields) != nil {
		return section
	}
	var name string
	if json.Unmarshal(fields[key], &name) != nil || !config.ValidEnvName(name) {
		return section
	}
	delete(fields, key)
	b, err := json.Marshal(fields)
	if err != nil {
		return section
	}
	return b
}
