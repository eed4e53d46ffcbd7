package codec_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tabletflow/tabletflow/codec"
)

func newKey(t *testing.T) []byte {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k
}

func TestCodecSealsPayloadsAndOpensThemWithAnyKeyOfTheSet(t *testing.T) {
	oldKey, newKeyBytes := newKey(t), newKey(t)
	before, err := codec.New(oldKey)
	require.NoError(t, err)
	dc := before.DataConverter()
	p, err := dc.ToPayload(map[string]string{"sink": "/var/lib/orders", "dsnEnv": "SINK_DSN"})
	require.NoError(t, err)

	// Sealed: the payload holds none of the plaintext, names its key.
	require.Equal(t, codec.Encoding, string(p.Metadata[converter.MetadataEncoding]))
	require.Equal(t, codec.KeyID(oldKey), string(p.Metadata[codec.MetadataKeyID]))
	require.NotContains(t, string(p.Data), "/var/lib/orders")
	require.NotContains(t, string(p.Data), "json/plain", "the inner metadata is sealed too")

	// Rotated: the new key seals, the old one still opens.
	after, err := codec.New(newKeyBytes, oldKey)
	require.NoError(t, err)
	var got map[string]string
	require.NoError(t, after.DataConverter().FromPayload(p, &got))
	require.Equal(t, "/var/lib/orders", got["sink"])
	p2, err := after.DataConverter().ToPayload("x")
	require.NoError(t, err)
	require.Equal(t, codec.KeyID(newKeyBytes), string(p2.Metadata[codec.MetadataKeyID]))

	// A key set without the sealing key names the key it lacks.
	other, err := codec.New(newKey(t))
	require.NoError(t, err)
	err = other.DataConverter().FromPayload(p, &got)
	require.ErrorContains(t, err, codec.ErrUnknownKey.Error())
	require.ErrorContains(t, err, codec.KeyID(oldKey))
	_, err = other.Decode([]*commonpb.Payload{p})
	require.ErrorIs(t, err, codec.ErrUnknownKey, "the codec itself (the endpoint's) keeps the error")
	// Received raw (a workflow's signal), the payload becomes a marked one
	// holding the error, instead of failing the receive.
	var raw converter.RawValue
	require.NoError(t, other.DataConverter().FromPayload(p, &raw))
	require.ErrorContains(t, codec.Undecryptable(raw.Payload()), codec.KeyID(oldKey))

	// Tampering is detected, not decoded into garbage.
	bad := &commonpb.Payload{Metadata: p.Metadata, Data: bytes.Clone(p.Data)}
	bad.Data[len(bad.Data)-1] ^= 1
	require.Error(t, after.DataConverter().FromPayload(bad, &got))

	// Payloads stored before encryption was turned on still read.
	plain, err := converter.GetDefaultDataConverter().ToPayload("written before")
	require.NoError(t, err)
	var s string
	require.NoError(t, after.DataConverter().FromPayload(plain, &s))
	require.Equal(t, "written before", s)
}

func TestParseKeysNamesWhatIsWrong(t *testing.T) {
	k1, k2 := base64.StdEncoding.EncodeToString(make([]byte, 32)), base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	keys, err := codec.ParseKeys([]byte("# current first\n" + k1 + "\n\n" + k2 + "\n"))
	require.NoError(t, err)
	require.Len(t, keys, 2)
	keys, err = codec.ParseKeys([]byte(k1 + "," + k2))
	require.NoError(t, err)
	require.Len(t, keys, 2)
	for text, want := range map[string]string{
		"":                   "no key",
		"# only a comment\n": "no key",
		"not base64!":        "line 1: not base64",
		base64.StdEncoding.EncodeToString(make([]byte, 16)): "line 1: 16 bytes, want 32",
	} {
		_, err := codec.ParseKeys([]byte(text))
		require.ErrorContains(t, err, want, "%q", text)
	}
}

// The codec endpoint answers the Web UI's CORS preflight for an allowed
// origin only, and decodes what the worker sealed.
func TestHandlerDecodesForTheWebUIsOrigin(t *testing.T) {
	c, err := codec.New(newKey(t))
	require.NoError(t, err)
	srv := httptest.NewServer(c.Handler([]string{"http://localhost:8233"}))
	defer srv.Close()

	pre, _ := http.NewRequest(http.MethodOptions, srv.URL+"/decode", nil)
	pre.Header.Set("Origin", "http://localhost:8233")
	resp, err := http.DefaultClient.Do(pre)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "http://localhost:8233", resp.Header.Get("Access-Control-Allow-Origin"))
	require.Contains(t, resp.Header.Get("Access-Control-Allow-Headers"), "X-Namespace")

	pre.Header.Set("Origin", "https://elsewhere.example")
	resp, err = http.DefaultClient.Do(pre)
	require.NoError(t, err)
	resp.Body.Close()
	require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"), "another origin gets no CORS grant")

	sealed, err := c.DataConverter().ToPayloads("the stream's config")
	require.NoError(t, err)
	body, err := protojson.Marshal(sealed)
	require.NoError(t, err)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/decode", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	var out commonpb.Payloads
	require.NoError(t, protojson.Unmarshal(buf.Bytes(), &out))
	require.Len(t, out.Payloads, 1)
	require.True(t, strings.Contains(string(out.Payloads[0].Data), "the stream's config"), "%s", out.Payloads[0].Data)
}

// A failure's message and stack go into a sealed payload: the SDK's own
// failure converter would keep them in clear.
func TestFailuresAreSealedToo(t *testing.T) {
	c, err := codec.New(newKey(t))
	require.NoError(t, err)
	f := c.FailureConverter().ErrorToFailure(errors.New("open /secret/path: denied"))
	require.Equal(t, "Encoded failure", f.GetMessage())
	attrs := f.GetEncodedAttributes()
	require.Equal(t, codec.Encoding, string(attrs.GetMetadata()[converter.MetadataEncoding]))
	require.NotContains(t, string(attrs.GetData()), "/secret/path")
	back := c.FailureConverter().FailureToError(f)
	require.ErrorContains(t, back, "open /secret/path: denied")
}
