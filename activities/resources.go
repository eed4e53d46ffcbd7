// Package activities holds tabletflow's Temporal activities: the I/O that
// workflows orchestrate. They are methods on structs holding their clients;
// register one instance per worker.
package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// Resources opens sources and sinks from a stream's config and shares them
// across activities, so connections and file handles are reused.
type Resources struct {
	// NewSource and NewSink build a source or a stream's sink the first
	// time one is needed: the worker's wiring (adapters.OpenSource and
	// adapters.OpenSink), or fakes in tests. Nil opens nothing: every
	// kind is unknown.
	NewSource func(cfg config.Source) (source.Source, error)
	NewSink   func(cfg config.Sink, stream string) (sink.Sink, error)

	// mu guards the maps; opening makes each source or sink once.
	mu      sync.Mutex
	sources map[sourceKey]source.Source
	sinks   map[sinkKey]sink.Sink
	opening singleflight.Group
	// listing shares topology reads between tablet pickers (see Tablets).
	listing singleflight.Group
	// configs are streams' configs read by digest (see Config).
	configs map[string]config.Stream
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

// sourceKey is what identifies a source client: its section, without the
// tables for kinds that keep a stream's tables on their servers (one
// client serves any tables; config.Kind.TablesInClient).
type sourceKey struct{ kind, spec string }

// sinkKey identifies a stream's sink: its whole section and the stream.
type sinkKey struct{ kind, spec, stream string }

// sectionKey is what identifies a section's client: the section as its
// kind's parser reads it (defaults filled, paths cleaned, so a stream's
// section as an older worker wrote it and as the operator gave it share
// one), with the keys of every object sorted and the named top-level keys
// left out. A kind this program has no parser for keys by its JSON as
// given.
func sectionKey(kinds map[string]config.Kind, kind string, spec json.RawMessage, drop ...string) string {
	if k, ok := kinds[kind]; ok {
		if v, err := k.Parse(spec); err == nil {
			if b, err := json.Marshal(v); err == nil {
				spec = b
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(spec))
	dec.UseNumber()
	var fields map[string]any
	if dec.Decode(&fields) != nil {
		return string(spec)
	}
	for _, k := range drop {
		delete(fields, k)
	}
	b, _ := json.Marshal(fields) // map keys sorted, at every depth
	return string(b)
}

// NewResources returns an empty cache.
func NewResources() *Resources {
	return &Resources{sources: map[sourceKey]source.Source{}, sinks: map[sinkKey]sink.Sink{}}
}

// Source returns the shared client for a source config.
func (r *Resources) Source(cfg config.Source) (source.Source, error) {
	if r.NewSource == nil {
		return nil, fmt.Errorf("source.kind: %w %q", config.ErrUnknownKind, cfg.Kind)
	}
	kinds := config.SourceKinds()
	var drop []string
	if !kinds[cfg.Kind].TablesInClient {
		drop = []string{"tables"} // kept per stream on the servers: one client serves any
	}
	key := sourceKey{kind: cfg.Kind, spec: sectionKey(kinds, cfg.Kind, cfg.Spec, drop...)}
	return shared(r, &r.sources, key, func() (source.Source, error) { return r.NewSource(cfg) })
}

// Sink returns the shared sink of a stream.
func (r *Resources) Sink(cfg config.Sink, stream string) (sink.Sink, error) {
	if r.NewSink == nil {
		return nil, fmt.Errorf("sink.kind: %w %q", config.ErrUnknownKind, cfg.Kind)
	}
	key := sinkKey{kind: cfg.Kind, spec: sectionKey(config.SinkKinds(), cfg.Kind, cfg.Spec), stream: stream}
	return shared(r, &r.sinks, key, func() (sink.Sink, error) { return r.NewSink(cfg, stream) })
}

// shared returns what *cache holds under key, opening it once however many
// callers ask at the same time. The lock guards the maps only, never an
// open: a source or sink that hangs while it connects holds up the callers
// of its own key, not every stream on the worker. A failed open is not
// kept: the next caller tries again.
func shared[K comparable, V any](r *Resources, cache *map[K]V, key K, open func() (V, error)) (V, error) {
	lookup := func() (V, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		v, ok := (*cache)[key]
		return v, ok
	}
	if v, ok := lookup(); ok {
		return v, nil
	}
	v, err, _ := r.opening.Do(fmt.Sprintf("%T %v", key, key), func() (any, error) {
		if v, ok := lookup(); ok {
			return v, nil
		}
		v, err := open()
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if *cache == nil {
			*cache = map[K]V{}
		}
		(*cache)[key] = v
		return v, nil
	})
	if err != nil {
		var zero V
		return zero, err
	}
	return v.(V), nil
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
