// Package adapters is the one place the programs that run streams learn
// their sources and sinks: each kind is one line below. Importing it
// registers every kind's config with package config, so config.Decode
// checks a source or sink section with its own adapter; OpenSource and
// OpenSink build one. The activities and workflows know only the source
// and sink interfaces.
//
// Adding a source: write its package (a Config type, ParseConfig, an
// Adapter), add it to Sources, and give it a page under docs/sources
// (docs/development.md, "Adding a source or a sink").
package adapters

import (
	"fmt"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/source/vitess"
)

// Sources and Sinks are every kind this build has.
var (
	Sources = []source.Adapter{
		tabletd.Adapter,
		postgres.Adapter,
		vitess.Adapter,
	}
	Sinks = []sink.Adapter{
		jsonl.Adapter,
		pgsink.Adapter,
	}
)

func init() {
	for _, a := range Sources {
		config.RegisterSource(a.Kind)
	}
	for _, a := range Sinks {
		config.RegisterSink(a.Kind)
	}
}

// OpenSource builds the source a checked source section names.
func OpenSource(cfg config.Source) (source.Source, error) {
	for _, a := range Sources {
		if a.Name == cfg.Kind {
			return a.Open(cfg)
		}
	}
	return nil, fmt.Errorf("source.kind: %w %q", config.ErrUnknownKind, cfg.Kind)
}

// OpenSink builds a stream's sink from a checked sink section.
func OpenSink(cfg config.Sink, stream string) (sink.Sink, error) {
	for _, a := range Sinks {
		if a.Name == cfg.Kind {
			return a.Open(cfg, stream)
		}
	}
	return nil, fmt.Errorf("sink.kind: %w %q", config.ErrUnknownKind, cfg.Kind)
}
