package digest

import (
	"hash/fnv"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCanonicalRewritesToCompactSortedJSON(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		// Object keys come out sorted.
		{name: "sorts keys", in: `{"b":1,"a":2}`, want: `{"a":2,"b":1}`},
		// Keys are sorted at every depth, inside arrays too.
		{name: "sorts nested keys", in: `{"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]}`,
			want: `{"a":[{"c":2,"d":1}],"z":{"x":2,"y":1}}`},
		// Insignificant whitespace, newlines included, is removed.
		{name: "removes whitespace", in: "{ \"a\" : [ 1 , 2 ] ,\n\t\"b\" : null }\n", want: `{"a":[1,2],"b":null}`},
		// An integer beyond float64's precision is kept digit for digit.
		{name: "keeps big integers", in: `{"id":12345678901234567890}`, want: `{"id":12345678901234567890}`},
		// A negative big integer too.
		{name: "keeps big negative integers", in: `[-98765432109876543210]`, want: `[-98765432109876543210]`},
		// Numbers stay as written: no trailing zeros dropped.
		{name: "keeps decimals as written", in: `{"n":1.50}`, want: `{"n":1.50}`},
		// Numbers stay as written: exponents are not expanded.
		{name: "keeps exponents as written", in: `{"n":1e3}`, want: `{"n":1e3}`},
		// Empty input is null, as an absent before or after image.
		{name: "empty is null", in: ``, want: `null`},
		// Whitespace alone is empty input.
		{name: "whitespace is null", in: " \n\t", want: `null`},
		// An explicit null stays null.
		{name: "null", in: `null`, want: `null`},
		// Scalars at the top level are valid JSON values.
		{name: "top-level string", in: ` "x" `, want: `"x"`},
		// String contents, spaces included, are untouched.
		{name: "string contents kept", in: `{"s":"a b  c"}`, want: `{"s":"a b  c"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical([]byte(tt.in))
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

func TestCanonicalRejectsInvalidJSON(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		// An unterminated object.
		{name: "unterminated object", in: `{"a":1`},
		// A key without a value.
		{name: "missing value", in: `{"a":}`},
		// A bare word is not JSON.
		{name: "bare word", in: `nope`},
		// Single quotes are not JSON strings.
		{name: "single quotes", in: `{'a':1}`},
		// A trailing comma is not JSON.
		{name: "trailing comma", in: `[1,2,]`},
		// A valid value followed by garbage is not one JSON value; taking the
		// first value would let a corrupted field hash like a good one.
		{name: "trailing garbage", in: `{"a":1} x`},
		// Two values back to back are not one JSON value either.
		{name: "two values", in: `{"a":1}{"b":2}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical([]byte(tt.in))
			require.Error(t, err, "Canonical(%q) = %q, want an error", tt.in, got)
		})
	}
}

func TestCanonicalIsIdempotent(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		// A nested document with unsorted keys and spacing.
		{name: "nested", in: `{ "b": [3, {"y": true, "x": false}], "a": "s" }`},
		// Characters json.Marshal escapes (<, >, &) stay stable on a second pass.
		{name: "html characters", in: `{"a":"<b>&amp;</b>"}`},
		// Non-ASCII text stays stable.
		{name: "unicode", in: `{"name":"Zoë","city":"\u00c5rhus"}`},
		// A big integer stays stable.
		{name: "big integer", in: `{"id":12345678901234567890}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			once, err := Canonical([]byte(tt.in))
			require.NoError(t, err)
			twice, err := Canonical(once)
			require.NoError(t, err)
			require.Equal(t, string(once), string(twice))
		})
	}
}

// baseFields is a record every Hash test varies one field of.
func baseFields() Fields {
	return Fields{
		Tablet:     "t-0001",
		Position:   "1.5",
		Table:      "orders",
		Op:         "update",
		Key:        []byte(`{"id":7}`),
		Before:     []byte(`{"id":7,"qty":1}`),
		After:      []byte(`{"id":7,"qty":2}`),
		CommitTime: time.Unix(1700000000, 123456789).UTC(),
	}
}

func TestHashIsFNV1aOverNewlineJoinedFields(t *testing.T) {
	f := baseFields()
	h := fnv.New64a()
	_, _ = h.Write([]byte("t-0001\n1.5\norders\nupdate\n" +
		`{"id":7}` + "\n" + `{"id":7,"qty":1}` + "\n" + `{"id":7,"qty":2}` + "\n" +
		"1700000000123456789"))
	require.Equal(t, h.Sum64(), Hash(f))
}

func TestHashTreatsAbsentJSONAsNull(t *testing.T) {
	tests := []struct {
		name string
		set  func(f *Fields, v []byte)
	}{
		// A key with no JSON.
		{name: "key", set: func(f *Fields, v []byte) { f.Key = v }},
		// An insert has no before image.
		{name: "before", set: func(f *Fields, v []byte) { f.Before = v }},
		// A delete has no after image.
		{name: "after", set: func(f *Fields, v []byte) { f.After = v }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withNil, withEmpty, withNull := baseFields(), baseFields(), baseFields()
			tt.set(&withNil, nil)
			tt.set(&withEmpty, []byte{})
			tt.set(&withNull, []byte("null"))
			require.Equal(t, Hash(withNull), Hash(withNil), "nil and null hash differently")
			require.Equal(t, Hash(withNull), Hash(withEmpty), "empty and null hash differently")
			require.NotEqual(t, Hash(baseFields()), Hash(withNull), "dropping the field did not change the hash")
		})
	}
}

func TestHashChangesWhenAnyFieldChanges(t *testing.T) {
	tests := []struct {
		name   string
		change func(f *Fields)
	}{
		// Another tablet.
		{name: "tablet", change: func(f *Fields) { f.Tablet = "t-0002" }},
		// Another position.
		{name: "position", change: func(f *Fields) { f.Position = "1.6" }},
		// Another table.
		{name: "table", change: func(f *Fields) { f.Table = "customers" }},
		// Another op.
		{name: "op", change: func(f *Fields) { f.Op = "delete" }},
		// Another key.
		{name: "key", change: func(f *Fields) { f.Key = []byte(`{"id":8}`) }},
		// Another before image.
		{name: "before", change: func(f *Fields) { f.Before = []byte(`{"id":7,"qty":0}`) }},
		// Another after image.
		{name: "after", change: func(f *Fields) { f.After = []byte(`{"id":7,"qty":3}`) }},
		// A commit time one nanosecond later.
		{name: "commit time", change: func(f *Fields) { f.CommitTime = f.CommitTime.Add(time.Nanosecond) }},
		// Before and after swapped: the fields are positional.
		{name: "before and after swapped", change: func(f *Fields) { f.Before, f.After = f.After, f.Before }},
	}
	base := Hash(baseFields())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := baseFields()
			tt.change(&f)
			require.NotEqual(t, base, Hash(f))
		})
	}
}

func TestHashIgnoresCommitTimeZone(t *testing.T) {
	utc := baseFields()
	local := baseFields()
	local.CommitTime = local.CommitTime.In(time.FixedZone("UTC+5", 5*3600))
	require.Equal(t, Hash(utc), Hash(local))
}

func TestDigestAddCountsDuplicates(t *testing.T) {
	h := Hash(baseFields())
	var once, twice Digest
	once.Add(h)
	twice.Add(h)
	twice.Add(h)

	require.Equal(t, Digest{Records: 1, Hash: h}, once)
	require.Equal(t, uint64(2), twice.Records)
	require.NotEqual(t, once.Hash, twice.Hash, "a duplicate did not change the hash")
	require.NotZero(t, twice.Hash, "the hashes cancelled out, as XOR would")
	require.Equal(t, 2*h, twice.Hash)
}

func TestDigestAddIsOrderIndependent(t *testing.T) {
	a, b, c := uint64(0x1111), uint64(0xfeedface), uint64(1<<63+5)
	var d1, d2 Digest
	for _, h := range []uint64{a, b, c} {
		d1.Add(h)
	}
	for _, h := range []uint64{c, a, b} {
		d2.Add(h)
	}
	require.Equal(t, d1, d2)
}

func TestDigestAddWrapsModulo2To64(t *testing.T) {
	var d Digest
	d.Add(1<<64 - 1)
	d.Add(2)
	require.Equal(t, Digest{Records: 2, Hash: 1}, d)
}

func TestDigestPlusAndMinusAreInverse(t *testing.T) {
	tests := []struct {
		name string
		a, b []uint64
	}{
		// Two small disjoint sets.
		{name: "small", a: []uint64{1, 2, 3}, b: []uint64{10, 20}},
		// Sums that wrap past 2^64.
		{name: "wrapping", a: []uint64{1<<64 - 1, 1 << 63}, b: []uint64{1 << 63, 7}},
		// An empty set is the identity.
		{name: "empty b", a: []uint64{5}, b: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var da, db, all Digest
			for _, h := range tt.a {
				da.Add(h)
				all.Add(h)
			}
			for _, h := range tt.b {
				db.Add(h)
				all.Add(h)
			}
			require.Equal(t, all, da.Plus(db), "Plus is not the digest of the union")
			require.Equal(t, da.Plus(db), db.Plus(da), "Plus is not commutative")
			require.Equal(t, da, all.Minus(db))
			require.Equal(t, db, all.Minus(da))
			require.Equal(t, Digest{}, all.Minus(all))
		})
	}
}

func TestHashHexIsSixteenLowercaseHexDigits(t *testing.T) {
	tests := []struct {
		name string
		h    uint64
		want string
	}{
		// Zero is padded to 16 digits.
		{name: "zero", h: 0, want: "0000000000000000"},
		// Small values are left-padded with zeros.
		{name: "small", h: 0xff, want: "00000000000000ff"},
		// The largest value fills all 16 digits.
		{name: "max", h: 1<<64 - 1, want: "ffffffffffffffff"},
		// Digits are lowercase.
		{name: "mixed", h: 0xDEADBEEF01234567, want: "deadbeef01234567"},
	}
	hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := HashHex(tt.h)
			require.Equal(t, tt.want, got)
			require.Regexp(t, hex16, got)
		})
	}
}
