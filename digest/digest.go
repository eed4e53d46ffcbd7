// Package digest computes the order-independent digest of change records:
// tabletd keeps one of every record it produced, and a sink, a test or a
// benchmark computes one of what it holds, so that any consumer can prove
// it holds exactly the same records: no loss, no duplicate.
//
// A record's hash is FNV-1a 64 over its canonical form, the fields joined by
// "\n":
//
//	tablet, position ("term.index"), table, op ("insert"|"update"|"delete"),
//	key, before, after (compact JSON with sorted keys; "null" when absent),
//	commit time (decimal Unix nanoseconds, UTC)
//
// A digest is the count of records and the sum modulo 2^64 of their hashes.
// The sum is additive, never XOR: a duplicate changes it, and digests of
// disjoint sets add up.
package digest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strconv"
	"time"
)

// Fields are the parts of a record its hash covers.
type Fields struct {
	Tablet     string
	Position   string
	Table      string
	Op         string
	Key        []byte
	Before     []byte
	After      []byte
	CommitTime time.Time
}

var null = []byte("null")

// Hash returns the 64-bit hash of a record whose JSON fields are already in
// canonical form (as tabletd sends them and the JSONL sink writes them).
func Hash(f Fields) uint64 {
	h := fnv.New64a()
	var buf [20]byte
	write := func(b []byte) {
		_, _ = h.Write(b)
		_, _ = h.Write([]byte{'\n'})
	}
	write([]byte(f.Tablet))
	write([]byte(f.Position))
	write([]byte(f.Table))
	write([]byte(f.Op))
	for _, j := range [][]byte{f.Key, f.Before, f.After} {
		if len(j) == 0 {
			j = null
		}
		write(j)
	}
	_, _ = h.Write(strconv.AppendInt(buf[:0], f.CommitTime.UnixNano(), 10))
	return h.Sum64()
}

// Canonical rewrites a JSON value in canonical form: compact, object keys
// sorted, numbers as written. Empty input becomes "null". Consumers that
// may have re-formatted the JSON call it before Hash.
func Canonical(raw []byte) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return null, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("canonical json: data after the value")
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return out, nil
}

// Digest is a count of records and the sum of their hashes modulo 2^64.
type Digest struct {
	Records uint64 `json:"records"`
	Hash    uint64 `json:"-"`
}

// Add counts one record with hash h.
func (d *Digest) Add(h uint64) {
	d.Records++
	d.Hash += h
}

// Plus returns the digest of the union of two disjoint sets.
func (d Digest) Plus(o Digest) Digest {
	return Digest{Records: d.Records + o.Records, Hash: d.Hash + o.Hash}
}

// Minus returns the digest of d's records less o's (o must be a subset).
func (d Digest) Minus(o Digest) Digest {
	return Digest{Records: d.Records - o.Records, Hash: d.Hash - o.Hash}
}

// HashHex formats a digest hash as 16 hex digits, as `tabletd ctl digest`
// prints it.
func HashHex(h uint64) string { return fmt.Sprintf("%016x", h) }
