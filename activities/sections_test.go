package activities

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// configStream answers the QueryConfig query with a stream's config, and
// counts the queries.
type configStream struct {
	mu      sync.Mutex
	raw     string
	queries int
}

func (c *configStream) SignalWorkflow(context.Context, string, string, string, any) error { return nil }

func (c *configStream) QueryWorkflow(_ context.Context, _, _, query string, _ ...any) (converter.EncodedValue, error) {
	if query != QueryConfig {
		return nil, errors.New("unexpected query " + query)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queries++
	p, err := converter.GetDefaultDataConverter().ToPayloads(c.raw)
	if err != nil {
		return nil, err
	}
	return encodedList{p}, nil
}

const sectionsConfig = `{"source": {"kind": "tabletd", "address": "10.0.0.7:15991", "keyspace": "commerce"},
  "sink": {"kind": "jsonl", "path": "/var/lib/tabletflow/orders"}}`

// A run whose input names its stream's config by reference (a stream
// whose sections are too large to ride in every tablet's input) reads
// the config from the stream once per worker, and opens the source and
// the sink of its sections; the tablet picker likewise.
func TestActivitiesNamingTheirStreamsConfigReadItOnceAndUseItsSections(t *testing.T) {
	r := newRig(t)
	stream := &configStream{raw: sectionsConfig}
	r.a.Client = stream
	var mu sync.Mutex
	var sources []string
	var sinks []string
	r.a.Resources.NewSource = func(cfg config.Source) (source.Source, error) {
		mu.Lock()
		defer mu.Unlock()
		sources = append(sources, string(cfg.Spec))
		return r.src, nil
	}
	r.a.Resources.NewSink = func(cfg config.Sink, _ string) (sink.Sink, error) {
		mu.Lock()
		defer mu.Unlock()
		sinks = append(sinks, string(cfg.Spec))
		return r.snk, nil
	}
	ref := &ConfigRef{Stream: testStream, Digest: ConfigDigest([]byte(sectionsConfig))}
	in := input()
	in.Source, in.Sink, in.Sections = config.Source{Kind: "tabletd"}, config.Sink{Kind: "jsonl"}, ref
	r.script(batch(1, 3))
	_, err := r.run(r.activityEnv(context.Background()), in)
	require.NoError(t, err)

	picked, err := r.a.SelectReplica(context.Background(), SelectReplicaInput{Stream: testStream, Tablet: testTablet,
		Source: config.Source{Kind: "tabletd"}, Sections: ref, OperatorKnown: true})
	require.NoError(t, err)
	require.Equal(t, testAlias, picked.Replica.Alias)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{`{"kind":"tabletd","address":"10.0.0.7:15991","keyspace":"commerce"}`}, sources, "the stream's source section, opened once")
	require.Equal(t, []string{`{"kind":"jsonl","path":"/var/lib/tabletflow/orders"}`}, sinks, "the stream's sink section")
	require.Equal(t, 1, stream.queries, "the config read once")
}

// A config the stream answers that is not the one the reference names
// (its digest differs) is not used: the run ends with ConfigUnavailable,
// never counted against the replica.
func TestAConfigWhoseDigestDiffersIsNotUsed(t *testing.T) {
	r := newRig(t)
	r.a.Client = &configStream{raw: sectionsConfig}
	in := input()
	in.Sections = &ConfigRef{Stream: testStream, Digest: ConfigDigest([]byte(`{"another": "config"}`))}
	_, err := r.run(r.activityEnv(context.Background()), in)
	requireTyped(t, err, ErrConfigUnavailable)
	require.Contains(t, err.Error(), "digest")
}
