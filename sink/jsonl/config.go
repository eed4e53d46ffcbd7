package jsonl

import (
	"fmt"

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
	Kind: config.Kind{Name: "jsonl", Config: Config{}, Check: config.Checker(ParseConfig)},
	Open: func(cfg config.Sink, stream string) (sink.Sink, error) {
		c, err := ParseConfig(cfg.Spec)
		if err != nil {
			return nil, fmt.Errorf("sink: %w", err)
		}
		return New(c.Path, stream)
	},
}

// ParseConfig decodes a sink section strictly and validates it; errors
// name the field within the section.
func ParseConfig(section []byte) (Config, error) {
	var c Config
	if err := config.DecodeStrict(section, &c); err != nil {
		return Config{}, err
	}
	if c.Path == "" {
		return Config{}, config.FieldErr("path", "must not be empty for the jsonl sink")
	}
	return c, nil
}

// Section is the sink section that c encodes to.
func (c Config) Section() config.Sink {
	c.Kind = Adapter.Name
	s, err := config.SinkSection(c)
	if err != nil {
		panic(fmt.Sprintf("jsonl: encode config: %v", err)) // plain strings: it always encodes
	}
	return s
}
