package activities

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// TestSinksAreSharedPerStreamAndConfig: a worker opens one sink per
// stream and sink config; the postgres sink's given tables are part of
// that config, so a stream started again with other tables does not get
// the sink that writes the old ones.
func TestSinksAreSharedPerStreamAndConfig(t *testing.T) {
	opened := 0
	r := NewResources()
	r.NewSink = func(config.Sink, string) (sink.Sink, error) { opened++; return newMemSink(&callLog{}), nil }
	section := func(tables string) config.Sink {
		return config.Sink{Kind: "postgres", Spec: json.RawMessage(`{"kind":"postgres","dsnEnv":"D","mode":"apply","tables":` + tables + `}`)}
	}
	cfg := section(`{"public.a":"app.a","public.b":"app.b"}`)
	_, err := r.Sink(cfg, "orders")
	require.NoError(t, err)
	_, err = r.Sink(section(`{"public.b": "app.b", "public.a": "app.a"}`), "orders")
	require.NoError(t, err)
	require.Equal(t, 1, opened, "the same config shares the sink")

	_, err = r.Sink(section(`{"public.a":"app.a2","public.b":"app.b"}`), "orders")
	require.NoError(t, err)
	require.Equal(t, 2, opened, "other given tables, another sink")
	_, err = r.Sink(cfg, "returns")
	require.NoError(t, err)
	require.Equal(t, 3, opened, "another stream, another sink")
}

// TestSourcesAreSharedAcrossTables: a source client serves any tables, so
// streams that differ only in their tables share one; another address is
// another client.
func TestSourcesAreSharedAcrossTables(t *testing.T) {
	opened := 0
	r := NewResources()
	r.NewSource = func(config.Source) (source.Source, error) { opened++; return &fakeSource{}, nil }
	section := func(spec string) config.Source {
		return config.Source{Kind: "tabletd", Spec: json.RawMessage(spec)}
	}
	for _, spec := range []string{
		`{"kind":"tabletd","address":"h:1","keyspace":"k"}`,
		`{"keyspace":"k","kind":"tabletd","tables":["orders"],"address":"h:1"}`,
	} {
		_, err := r.Source(section(spec))
		require.NoError(t, err)
	}
	require.Equal(t, 1, opened, "tables and key order do not make another client")
	_, err := r.Source(section(`{"kind":"tabletd","address":"h:2","keyspace":"k"}`))
	require.NoError(t, err)
	require.Equal(t, 2, opened, "another address, another client")
}

// TestAVitessSourceIsOneClientPerTables: a vitess client reads the
// stream's tables from its section (its VStream filter), so streams that
// differ in their tables each get one; the same tables share it.
func TestAVitessSourceIsOneClientPerTables(t *testing.T) {
	opened := 0
	r := NewResources()
	r.NewSource = func(config.Source) (source.Source, error) { opened++; return &fakeSource{}, nil }
	for _, spec := range []string{
		`{"kind":"vitess","vtctld":"h:1","keyspace":"k","tables":["customer"]}`,
		`{"keyspace":"k","tables":["customer"],"vtctld":"h:1","kind":"vitess"}`,
		`{"kind":"vitess","vtctld":"h:1","keyspace":"k","tables":["corder"]}`,
	} {
		_, err := r.Source(config.Source{Kind: "vitess", Spec: json.RawMessage(spec)})
		require.NoError(t, err)
	}
	require.Equal(t, 2, opened, "other tables, another client")
}

// TestAHungSinkDoesNotStopAnotherStreamsSink: opening stream A's sink
// hangs (a database that accepts connections and never answers); stream
// B's sink on the same worker still opens at once, and the callers waiting
// for A share its one open instead of each starting another.
func TestAHungSinkDoesNotStopAnotherStreamsSink(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var mu sync.Mutex
	opens := map[string]int{}
	r := NewResources()
	r.NewSink = func(_ config.Sink, stream string) (sink.Sink, error) {
		mu.Lock()
		opens[stream]++
		mu.Unlock()
		if stream == "a" {
			<-release
		}
		return newMemSink(&callLog{}), nil
	}
	cfg := config.Sink{Kind: "postgres", Spec: json.RawMessage(`{"kind":"postgres","dsnEnv":"D"}`)}
	for range 3 {
		go func() { _, _ = r.Sink(cfg, "a") }()
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return opens["a"] == 1
	}, 5*time.Second, 5*time.Millisecond, "a's open never started")

	done := make(chan error, 1)
	go func() {
		_, err := r.Sink(cfg, "b")
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("stream b's sink waited for stream a's hung open")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, opens["a"], "callers waiting for a share one open")
}

// TestASinkSectionItsAdapterRefusesFailsTheTablet: a sink config the
// worker's adapter cannot take fails the tablet with the field at fault
// (Fatal, CONFIG), instead of being retried forever as a sink outage.
func TestASinkSectionItsAdapterRefusesFailsTheTablet(t *testing.T) {
	r := newRig(t)
	r.a.Resources.NewSink = func(config.Sink, string) (sink.Sink, error) {
		return nil, config.InSection("sink", config.FieldErr("schema", `"Tf": want 1 to 63 of a-z`))
	}
	_, err := r.run(r.activityEnv(context.Background()), input())
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.True(t, appErr.NonRetryable())
	require.Equal(t, ErrFatal, appErr.Type())
	require.ErrorContains(t, err, "sink.schema:")
}

// TestOneStreamsSinkIsOneClientWhateverWorkerWroteItsSection: a tablet's
// sink section as an older worker encoded it (defaults filled in) and as
// the operator gave it share one sink, as do paths spelled two ways.
func TestOneStreamsSinkIsOneClientWhateverWorkerWroteItsSection(t *testing.T) {
	opened := 0
	r := NewResources()
	r.NewSink = func(config.Sink, string) (sink.Sink, error) { opened++; return newMemSink(&callLog{}), nil }
	for _, spec := range []string{
		`{"kind":"postgres","dsnEnv":"D"}`,
		`{"kind":"postgres","dsnEnv":"D","mode":"changelog","schema":"tabletflow"}`,
	} {
		_, err := r.Sink(config.Sink{Kind: "postgres", Spec: json.RawMessage(spec)}, "orders")
		require.NoError(t, err)
	}
	require.Equal(t, 1, opened, "a postgres sink's defaults, written or not, are one section")
	for _, spec := range []string{`{"kind":"jsonl","path":"/data/orders/"}`, `{"kind":"jsonl","path":"/data/orders"}`} {
		_, err := r.Sink(config.Sink{Kind: "jsonl", Spec: json.RawMessage(spec)}, "orders")
		require.NoError(t, err)
	}
	require.Equal(t, 2, opened, "one jsonl directory spelled two ways is one sink")
}
