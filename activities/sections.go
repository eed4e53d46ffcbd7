package activities

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// A stream whose source and sink sections are large (a PostgreSQL source
// of a thousand shards is 200 KB) does not put them in each tablet's
// input, where the stream's history would hold them once per tablet
// (1,000 tablets of a 256 KB config are over the server's 50 MB history
// limit): a tablet's input and its activities' carry a ConfigRef
// instead, and the worker reads the stream's config once, with the
// QueryConfig query, and keeps it.

// QueryConfig is the stream workflow's query for its config, as the JSON
// text it was started with.
const QueryConfig = "config"

// ConfigRef names a stream's config: the stream, and the SHA-256 of its
// config's JSON text (ConfigDigest), which the config read is checked
// against.
type ConfigRef struct {
	Stream string `json:"stream"`
	Digest string `json:"digest"`
}

// ConfigDigest is the digest a ConfigRef names a stream config by.
func ConfigDigest(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// ErrConfigUnavailable is the ApplicationError type of an activity that
// could not read its stream's config: not the replica's fault, nor the
// sink's; the tablet tries again after a backoff.
const ErrConfigUnavailable = "ConfigUnavailable"

// sections returns a run's source and sink sections: src and snk as
// given, or, with ref, the stream's own, read once per worker and kept
// (Resources.Config).
func (a *Activities) sections(ctx context.Context, src config.Source, snk config.Sink, ref *ConfigRef) (config.Source, config.Sink, error) {
	if ref == nil {
		return src, snk, nil
	}
	cfg, err := a.Resources.Config(ctx, *ref, a.readConfig)
	if err != nil {
		return src, snk, fmt.Errorf("read the config of stream %s: %w", ref.Stream, err)
	}
	return cfg.Source, cfg.Sink, nil
}

// configUnavailable is the error of an activity that could not read its
// stream's config: typed ErrConfigUnavailable, with the replica it was
// to read and the checkpoint.
func configUnavailable(err error, replica string, cp source.Checkpoint) error {
	return nonRetryable(ErrConfigUnavailable, err, ErrorDetails{Reason: "CONFIG_UNAVAILABLE", Replica: replica, Checkpoint: cp})
}

// readConfig reads a stream's config with the QueryConfig query (a closed
// stream answers it too).
func (a *Activities) readConfig(ctx context.Context, stream string) ([]byte, error) {
	if a.Client == nil {
		return nil, fmt.Errorf("no Temporal client to query the stream")
	}
	v, err := a.Client.QueryWorkflow(ctx, stream, "", QueryConfig)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	var raw string
	if err := v.Get(&raw); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return []byte(raw), nil
}

// configTimeout bounds one read of a stream's config.
const configTimeout = 30 * time.Second

// Config returns the config ref names, reading it with read the first
// time (callers asking meanwhile share the read); a config whose digest
// is not ref's is an error, and is not kept.
func (r *Resources) Config(ctx context.Context, ref ConfigRef, read func(context.Context, string) ([]byte, error)) (config.Stream, error) {
	r.mu.Lock()
	cfg, ok := r.configs[ref.Digest]
	r.mu.Unlock()
	if ok {
		return cfg, nil
	}
	ch := r.opening.DoChan("config "+ref.Digest, func() (any, error) {
		// Not the first caller's context: its cancellation would fail
		// every caller sharing the read.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), configTimeout)
		defer cancel()
		raw, err := read(rctx, ref.Stream)
		if err != nil {
			return nil, err
		}
		if got := ConfigDigest(raw); got != ref.Digest {
			return nil, fmt.Errorf("the stream's config has digest %s, not %s", got, ref.Digest)
		}
		cfg, err := config.Decode(raw)
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.configs == nil {
			r.configs = map[string]config.Stream{}
		}
		r.configs[ref.Digest] = cfg
		return cfg, nil
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return config.Stream{}, res.Err
		}
		return res.Val.(config.Stream), nil
	case <-ctx.Done():
		return config.Stream{}, ctx.Err()
	}
}
