// Package activities holds tabletflow's Temporal activities: the I/O that
// workflows orchestrate. They are methods on structs holding their clients;
// register one instance per worker.
package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/source/tabletd"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

// Resources opens sources and sinks from a stream's config and shares them
// across activities, so connections and file handles are reused.
type Resources struct {
	// NewSource and NewSink build a source or a stream's sink the first
	// time one is needed. Nil means the adapters this package knows
	// (tabletd, postgres; jsonl, postgres); tests set fakes.
	NewSource func(cfg config.Source) (source.Source, error)
	NewSink   func(cfg config.Sink, stream string) (sink.Sink, error)

	mu      sync.Mutex
	sources map[sourceKey]source.Source
	sinks   map[sinkKey]sink.Sink
	// listing shares topology reads between tablet pickers (see Tablets).
	listing singleflight.Group
}

// Tablets lists a source's tablets for the tablet picker. Pickers asking
// while a listing is under way share it: when an exclusion moves a hundred
// tablets at once, they wait for one listing of the whole keyspace (a read
// at most one call old) instead of each sending its own.
func (r *Resources) Tablets(ctx context.Context, src source.Source) ([]source.Tablet, error) {
	ch := r.listing.DoChan(fmt.Sprintf("%p", src), func() (any, error) {
		// Not the first caller's context: its cancellation would fail
		// every caller sharing the call.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return src.ListTablets(lctx)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return slices.Clone(res.Val.([]source.Tablet)), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// errUnknownKind: a config names an adapter this worker does not have, a
// config error rather than trouble with the source or sink.
var errUnknownKind = errors.New("unknown kind")

// sourceKey is what identifies a connection (tables do not); shards is a
// postgres source's servers, as JSON.
type sourceKey struct {
	kind, address, keyspace, tokenEnv, shards string
	tls                                       tlsfiles.Files
}

type sinkKey struct {
	kind, path, dsnEnv, schema, mode, stream string
	// tables is the postgres sink's sink.tables as JSON (map keys sorted):
	// a stream started again with other given tables gets a sink of its
	// own.
	tables string
}

// NewResources returns an empty cache.
func NewResources() *Resources {
	return &Resources{sources: map[sourceKey]source.Source{}, sinks: map[sinkKey]sink.Sink{}}
}

// Source returns the shared client for a source config.
func (r *Resources) Source(cfg config.Source) (source.Source, error) {
	key := sourceKey{kind: cfg.Kind, address: cfg.Address, keyspace: cfg.Keyspace, tokenEnv: cfg.TokenEnv}
	if len(cfg.Shards) > 0 {
		b, _ := json.Marshal(cfg.Shards)
		key.shards = string(b)
	}
	if cfg.TLS != nil {
		key.tls = *cfg.TLS
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sources[key]; s != nil {
		return s, nil
	}
	open := r.NewSource
	if open == nil {
		open = newSource
	}
	s, err := open(cfg)
	if err != nil {
		return nil, err
	}
	if r.sources == nil {
		r.sources = map[sourceKey]source.Source{}
	}
	r.sources[key] = s
	return s, nil
}

// Sink returns the shared sink of a stream.
func (r *Resources) Sink(cfg config.Sink, stream string) (sink.Sink, error) {
	key := sinkKey{kind: cfg.Kind, path: filepath.Clean(cfg.Path), dsnEnv: cfg.DSNEnv, schema: cfg.Schema, mode: cfg.Mode, stream: stream}
	if len(cfg.Tables) > 0 {
		b, _ := json.Marshal(cfg.Tables)
		key.tables = string(b)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sinks[key]; s != nil {
		return s, nil
	}
	open := r.NewSink
	if open == nil {
		open = newSink
	}
	s, err := open(cfg, stream)
	if err != nil {
		return nil, err
	}
	if r.sinks == nil {
		r.sinks = map[sinkKey]sink.Sink{}
	}
	r.sinks[key] = s
	return s, nil
}

// newSource builds a source with the adapters this package knows.
func newSource(cfg config.Source) (source.Source, error) {
	switch cfg.Kind {
	case "tabletd":
		var opts tabletd.Options
		if cfg.TLS != nil {
			opts.TLS = *cfg.TLS
		}
		if cfg.TokenEnv != "" {
			if opts.Token = os.Getenv(cfg.TokenEnv); opts.Token == "" {
				return nil, fmt.Errorf("source.tokenEnv: %s is not set in the worker's environment", cfg.TokenEnv)
			}
		}
		c, err := tabletd.Dial(cfg.Address, cfg.Keyspace, opts)
		if err != nil {
			return nil, err
		}
		return c, nil
	case "postgres":
		s, err := postgres.New(cfg, nil)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	return nil, fmt.Errorf("source.kind: %w %q", errUnknownKind, cfg.Kind)
}

// newSink builds a sink with the adapters this package knows.
func newSink(cfg config.Sink, stream string) (sink.Sink, error) {
	switch cfg.Kind {
	case "jsonl":
		s, err := jsonl.New(cfg.Path, stream)
		if err != nil {
			return nil, err
		}
		return s, nil
	case "postgres":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := pgsink.New(ctx, cfg, stream, nil)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	return nil, fmt.Errorf("sink.kind: %w %q", errUnknownKind, cfg.Kind)
}

// Close closes every source and sink.
func (r *Resources) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, s := range r.sources {
		_ = s.Close()
		delete(r.sources, k)
	}
	for k, s := range r.sinks {
		_ = s.Close()
		delete(r.sinks, k)
	}
	return nil
}
