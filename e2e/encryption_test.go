package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tabletflow/tabletflow/codec"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/workflows"
)

// TestEncryptedPayloadsAreCiphertextInHistoryAndDecodedForKeyHolders runs a
// stream with payload encryption on: the worker and this test's client
// hold the key, the worker serves the codec endpoint, and the dev server's
// Web UI is pointed at it. Every payload the server stores for the stream
// and its tablets — inputs, signals, memos, heartbeats, results, and an
// activity failure's message — is ciphertext naming its key; the starter
// without the key cannot read the status, with it can; and the Web UI in
// headless Chromium shows the stream's decoded input through the endpoint.
func TestEncryptedPayloadsAreCiphertextInHistoryAndDecodedForKeyHolders(t *testing.T) {
	key := make([]byte, 32)
	_, err := rand.Read(key)
	require.NoError(t, err)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "tabletflow.key")
	require.NoError(t, os.WriteFile(keyFile, []byte("# the sealing key\n"+base64.StdEncoding.EncodeToString(key)+"\n"), 0o600))
	cdc, err := codec.New(key)
	require.NoError(t, err)

	// The codec's port is held until the worker starts: the dev server,
	// which starts first and binds ports of its own, must not take it
	// (it once did: the worker's codec-addr was in use).
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	codecAddr := held.Addr().String()
	server, err := testbed.StartDevServer(temporalCLI, dir, "--ui-codec-endpoint", "http://"+codecAddr)
	require.NoError(t, err)
	t.Cleanup(server.Stop)
	e := newEnvOn(t, server.Addr, "--tablets", "2", "--rate", "100")
	e.workerArgs = []string{"--encryption-key-file", keyFile, "--codec-addr", codecAddr, "--codec-origins", server.UI}
	e.codecEndpoint = "http://" + codecAddr // the operator's CLI encodes its signals through it
	sealed, err := client.Dial(client.Options{HostPort: server.Addr, Logger: temporalclient.Quiet{},
		DataConverter: cdc.DataConverter(), FailureConverter: cdc.FailureConverter()})
	require.NoError(t, err)
	t.Cleanup(sealed.Close)
	raw := e.temporal // no key: sees what the server stores
	e.temporal = sealed
	require.NoError(t, held.Close())
	e.startWorker()

	out := filepath.Join(e.dir, "out-plaintext-marker")
	run := e.startStream("sealed", e.config(out, nil))
	st := e.waitStatus("sealed", "every tablet streaming", time.Minute, allStreaming(2))
	// One tablet's replica fails until its retries run out: an activity
	// failure lands in the history.
	tab := st.Tablets[0]
	e.fault(&sourcepb.FaultRequest{Server: tab.Replica, Code: "UNAVAILABLE"})
	st = e.waitStatus("sealed", "the failing replica excluded", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return len(tabletStatus(st, tab.ID).Excluded) > 0, summary(st)
	})
	e.heal(tab.Replica, "")
	// An operator's signal, sent with the CLI through the codec endpoint.
	e.signal("sealed", "exclude", fmt.Sprintf(`{"aliases": [%q], "reason": "plaintext-reason-marker", "ttl": "1h"}`, busiest(st)))
	e.waitStatus("sealed", "the operator's exclusion in effect", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		return len(st.Exclude) == 1 && st.Exclude[0].Reason == "plaintext-reason-marker", summary(st)
	})
	e.workload(sourcepb.WorkloadRequest_PAUSE)
	e.requireExact("sealed", out, 2*time.Minute)

	// The starter: without the key the status does not decode; with it,
	// it does.
	msg, err := e.starter("status", "sealed")
	require.Error(t, err, "no key, no status: %s", msg)
	msg, err = e.starter("status", "sealed", "--encryption-key-file", keyFile)
	require.NoError(t, err, msg)
	require.Contains(t, msg, "Streaming")

	// What the server stores: every payload sealed with the key, no
	// plaintext marker anywhere, a failure among the events.
	var payloads, failures int
	markers := [][]byte{[]byte("out-plaintext-marker"), []byte("plaintext-reason-marker"), []byte("commerce"), []byte("UNAVAILABLE")}
	runs := e.eachEvent(raw, "sealed", func(run string, ev *historypb.HistoryEvent) {
		if ev.EventType == enums.EVENT_TYPE_ACTIVITY_TASK_FAILED {
			failures++
			require.Equal(t, "Encoded failure", ev.GetActivityTaskFailedEventAttributes().GetFailure().GetMessage())
		}
		b, err := proto.Marshal(ev)
		require.NoError(t, err)
		for _, m := range markers {
			require.NotContains(t, string(b), string(m), "event %d (%s) of %s holds plaintext", ev.EventId, ev.EventType, run)
		}
		eachPayload(ev.ProtoReflect(), func(p *commonpb.Payload) {
			payloads++
			require.Equal(t, codec.Encoding, string(p.Metadata[converter.MetadataEncoding]), "event %d (%s) of %s", ev.EventId, ev.EventType, run)
			require.Equal(t, codec.KeyID(key), string(p.Metadata[codec.MetadataKeyID]))
		})
	})
	require.Greater(t, runs, 2, "the stream's and its tablets' runs")
	require.Positive(t, failures, "an activity failure was recorded")
	t.Logf("%d payloads sealed, %d activity failures encoded", payloads, failures)

	// The Web UI decodes the stream's input through the worker's codec
	// endpoint.
	ctx := headlessChromium(t, chromium(t), e.dir)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(server.UI+"/namespaces/default/workflows/sealed/"+run.GetRunID()+"/history")))
	page, err := waitForText(ctx, "out-plaintext-marker")
	require.NoError(t, err, "the Web UI shows the decoded input")
	require.Contains(t, page, "commerce")
}

// eachPayload calls f with every Payload inside m, however deep, but for
// search attributes' (readable by design: how streams are found).
func eachPayload(m protoreflect.Message, f func(*commonpb.Payload)) {
	switch v := m.Interface().(type) {
	case *commonpb.Payload:
		f(v)
		return
	case *commonpb.SearchAttributes:
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					eachPayload(mv.Message(), f)
					return true
				})
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				for i := range v.List().Len() {
					eachPayload(v.List().Get(i).Message(), f)
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			eachPayload(v.Message(), f)
		}
		return true
	})
}
