// Package codec encrypts every payload tabletflow's workflows store —
// inputs, results, signals, queries, memos, heartbeats and, with the
// failure converter Options sets, failure messages and stacks — with
// AES-256-GCM, so that the Temporal server, its database and anyone who
// can read histories without the key see only ciphertext. Each payload
// names the key that sealed it, so keys rotate: the first key of a key set
// seals, every key opens. Workflow IDs, search attributes and the memo's
// keys stay readable by design (they are how streams are found).
//
// It is off unless a key is configured (--encryption-key-file). The
// worker can serve the codec over HTTP (Handler) so that `temporal
// --codec-endpoint` and the Web UI (`--ui-codec-endpoint`) show decrypted
// payloads to those who can reach it.
package codec

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/proto"
)

// Metadata of an encrypted payload.
const (
	// Encoding marks a payload this codec sealed.
	Encoding = "binary/encrypted"
	// MetadataKeyID names the key that sealed it.
	MetadataKeyID = "encryption-key-id"
	// MetadataCipher names the cipher.
	MetadataCipher = "encryption-cipher"
	cipherName     = "AES256GCM"
)

// ErrUnknownKey: a payload was sealed with a key this key set lacks.
var ErrUnknownKey = errors.New("unknown encryption key")

// Codec is a converter.PayloadCodec that seals payloads with a key set.
type Codec struct {
	current string
	keys    map[string]cipher.AEAD
}

var _ converter.PayloadCodec = (*Codec)(nil)

// New returns a codec for keys, each 32 bytes; the first seals.
func New(keys ...[]byte) (*Codec, error) {
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	c := &Codec{keys: map[string]cipher.AEAD{}}
	for i, k := range keys {
		if len(k) != 32 {
			return nil, fmt.Errorf("key %d: %d bytes, want 32 (AES-256)", i+1, len(k))
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		id := KeyID(k)
		if i == 0 {
			c.current = id
		}
		c.keys[id] = aead
	}
	return c, nil
}

// KeyID names a key without revealing it: the first 8 bytes of its
// SHA-256, in hex.
func KeyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// ParseKeys reads a key set: base64 keys one a line (or separated by
// commas), blank lines and #-comments ignored; the first seals.
func ParseKeys(text []byte) ([][]byte, error) {
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(text))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			k, err := base64.StdEncoding.DecodeString(f)
			if err != nil {
				return nil, fmt.Errorf("line %d: not base64: %w", line, err)
			}
			if len(k) != 32 {
				return nil, fmt.Errorf("line %d: %d bytes, want 32 (AES-256; e.g. openssl rand -base64 32)", line, len(k))
			}
			keys = append(keys, k)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	return keys, nil
}

// Load returns the codec of the key file at path, or, with no path, of
// the key set in the environment variable env; nil when neither is set.
func Load(path, env string) (*Codec, error) {
	var text []byte
	switch {
	case path != "":
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("encryption-key-file: %w", err)
		}
		text = b
	case os.Getenv(env) != "":
		text = []byte(os.Getenv(env))
	default:
		return nil, nil
	}
	keys, err := ParseKeys(text)
	if err != nil {
		if path != "" {
			return nil, fmt.Errorf("encryption-key-file %s: %w", path, err)
		}
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	return New(keys...)
}

// Encode seals each payload, metadata and all, with the current key.
func (c *Codec) Encode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	aead := c.keys[c.current]
	for i, p := range payloads {
		plain, err := proto.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("encrypt payload: %w", err)
		}
		nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
		if _, err := rand.Read(nonce); err != nil {
			return nil, fmt.Errorf("encrypt payload: %w", err)
		}
		out[i] = &commonpb.Payload{
			Metadata: map[string][]byte{
				converter.MetadataEncoding: []byte(Encoding),
				MetadataKeyID:              []byte(c.current),
				MetadataCipher:             []byte(cipherName),
			},
			Data: aead.Seal(nonce, nonce, plain, []byte(c.current)),
		}
	}
	return out, nil
}

// Decode opens each sealed payload; others (written before encryption
// was turned on) pass through.
func (c *Codec) Decode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		if string(p.GetMetadata()[converter.MetadataEncoding]) != Encoding {
			out[i] = p
			continue
		}
		id := string(p.GetMetadata()[MetadataKeyID])
		aead, ok := c.keys[id]
		if !ok {
			return nil, fmt.Errorf("decrypt payload: %w %q (add it to the key set to read this payload)", ErrUnknownKey, id)
		}
		data := p.GetData()
		if len(data) < aead.NonceSize() {
			return nil, errors.New("decrypt payload: too short")
		}
		plain, err := aead.Open(nil, data[:aead.NonceSize()], data[aead.NonceSize():], []byte(id))
		if err != nil {
			return nil, fmt.Errorf("decrypt payload with key %s: %w", id, err)
		}
		var dec commonpb.Payload
		if err := proto.Unmarshal(plain, &dec); err != nil {
			return nil, fmt.Errorf("decrypt payload: %w", err)
		}
		out[i] = &dec
	}
	return out, nil
}

// DataConverter is the default data converter with c sealing every
// payload. A payload the key set cannot open does not fail the decoding of
// the others with it: it becomes an EncodingUndecryptable payload holding
// the error, which decoding into a value returns, and which a workflow
// receiving a signal raw (converter.RawValue) sees and can reject by name
// (the SDK would drop an undecodable signal and block for the next one).
func (c *Codec) DataConverter() converter.DataConverter {
	return converter.NewCodecDataConverter(undecryptableAware{converter.GetDefaultDataConverter()}, lenient{c})
}

// EncodingUndecryptable marks a payload that could not be opened; its data
// is the error.
const EncodingUndecryptable = "binary/undecryptable"

// Undecryptable returns the error a payload marked EncodingUndecryptable
// holds, nil for any other payload.
func Undecryptable(p *commonpb.Payload) error {
	if string(p.GetMetadata()[converter.MetadataEncoding]) != EncodingUndecryptable {
		return nil
	}
	return errors.New(string(p.GetData()))
}

// lenient is the codec with each payload that does not open replaced by
// an EncodingUndecryptable one.
type lenient struct{ c *Codec }

func (l lenient) Encode(ps []*commonpb.Payload) ([]*commonpb.Payload, error) { return l.c.Encode(ps) }

func (l lenient) Decode(ps []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(ps))
	for i, p := range ps {
		d, err := l.c.Decode([]*commonpb.Payload{p})
		if err != nil {
			out[i] = &commonpb.Payload{Metadata: map[string][]byte{converter.MetadataEncoding: []byte(EncodingUndecryptable)}, Data: []byte(err.Error())}
			continue
		}
		out[i] = d[0]
	}
	return out, nil
}

// undecryptableAware returns an undecryptable payload's error when it is
// decoded into a value (a converter.RawValue takes it as it is).
type undecryptableAware struct{ converter.DataConverter }

func (u undecryptableAware) FromPayload(p *commonpb.Payload, v any) error {
	if _, raw := v.(*converter.RawValue); !raw {
		if err := Undecryptable(p); err != nil {
			return err
		}
	}
	return u.DataConverter.FromPayload(p, v)
}

func (u undecryptableAware) FromPayloads(ps *commonpb.Payloads, vs ...any) error {
	for i, p := range ps.GetPayloads() {
		if i >= len(vs) {
			break
		}
		if _, raw := vs[i].(*converter.RawValue); !raw {
			if err := Undecryptable(p); err != nil {
				return err
			}
		}
	}
	return u.DataConverter.FromPayloads(ps, vs...)
}

// FailureConverter moves failure messages and stack traces into a
// payload, and encodes it and a failure's details with the codec: without
// DataConverter here the SDK's default would store them in clear.
func (c *Codec) FailureConverter() converter.FailureConverter {
	return temporal.NewDefaultFailureConverter(temporal.DefaultFailureConverterOptions{
		DataConverter: c.DataConverter(), EncodeCommonAttributes: true})
}
