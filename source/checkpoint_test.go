package source

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseCheckpointAcceptsTermDotIndex(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Checkpoint
	}{
		// The ordinary form: term, a dot, index.
		{name: "term and index", in: "1.5", want: Checkpoint{Term: 1, Index: 5}},
		// The empty string is the zero checkpoint, the stream's start.
		{name: "empty is zero", in: "", want: Checkpoint{}},
		// Term 0 is how single-number positions (a PostgreSQL LSN) travel.
		{name: "term zero", in: "0.42", want: Checkpoint{Index: 42}},
		// Both parts span the full uint64 range.
		{name: "max uint64", in: "18446744073709551615.18446744073709551615",
			want: Checkpoint{Term: 1<<64 - 1, Index: 1<<64 - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCheckpoint(tt.in)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseCheckpointRejectsMalformedWithErrBadCheckpoint(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		// No dot: a bare number is not a checkpoint.
		{name: "no dot", in: "1"},
		// Neither part is a number.
		{name: "letters", in: "a.b"},
		// A negative index is not a uint64.
		{name: "negative index", in: "1.-2"},
		// A second dot leaves "2.3" as the index.
		{name: "three parts", in: "1.2.3"},
		// The term is 2^64, one past uint64's range.
		{name: "term overflow", in: "18446744073709551616.1"},
		// The index is 2^64, one past uint64's range.
		{name: "index overflow", in: "1.18446744073709551616"},
		// A missing term is not term 0.
		{name: "empty term", in: ".5"},
		// A missing index is not index 0.
		{name: "empty index", in: "1."},
		// Surrounding spaces are not trimmed.
		{name: "spaces", in: " 1.5"},
		// A sign prefix is not a decimal uint64.
		{name: "plus sign", in: "+1.5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCheckpoint(tt.in)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrBadCheckpoint), "error %q does not wrap ErrBadCheckpoint", err)
			require.Equal(t, Checkpoint{}, got)
		})
	}
}

func TestCheckpointStringRoundTrips(t *testing.T) {
	tests := []struct {
		name string
		cp   Checkpoint
		want string
	}{
		// The ordinary form.
		{name: "term and index", cp: Checkpoint{Term: 1, Index: 5}, want: "1.5"},
		// The zero checkpoint prints as "", which parses back to zero.
		{name: "zero", cp: Checkpoint{}, want: ""},
		// Term 0 with an index is not zero and keeps its "0." prefix.
		{name: "term zero", cp: Checkpoint{Index: 7}, want: "0.7"},
		// Index 0 with a term is not zero either.
		{name: "index zero", cp: Checkpoint{Term: 3}, want: "3.0"},
		// The largest values print in full.
		{name: "max uint64", cp: Checkpoint{Term: 1<<64 - 1, Index: 1<<64 - 1},
			want: "18446744073709551615.18446744073709551615"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.cp.String())
			back, err := ParseCheckpoint(tt.cp.String())
			require.NoError(t, err)
			require.Equal(t, tt.cp, back)
		})
	}
}

func TestCheckpointIsZeroOnlyForBothPartsZero(t *testing.T) {
	tests := []struct {
		name string
		cp   Checkpoint
		want bool
	}{
		// The zero value.
		{name: "zero", cp: Checkpoint{}, want: true},
		// A term alone makes it non-zero.
		{name: "term only", cp: Checkpoint{Term: 1}, want: false},
		// An index alone makes it non-zero.
		{name: "index only", cp: Checkpoint{Index: 1}, want: false},
		// Both set.
		{name: "both", cp: Checkpoint{Term: 1, Index: 5}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.cp.IsZero())
		})
	}
}

func TestCheckpointCompareOrdersByTermThenIndex(t *testing.T) {
	tests := []struct {
		name string
		a, b Checkpoint
		want int
	}{
		// Identical checkpoints are equal.
		{name: "equal", a: Checkpoint{Term: 1, Index: 5}, b: Checkpoint{Term: 1, Index: 5}, want: 0},
		// Zero equals zero.
		{name: "zero equal", a: Checkpoint{}, b: Checkpoint{}, want: 0},
		// Same term: the lower index is before.
		{name: "lower index", a: Checkpoint{Term: 1, Index: 4}, b: Checkpoint{Term: 1, Index: 5}, want: -1},
		// Same term: the higher index is after.
		{name: "higher index", a: Checkpoint{Term: 1, Index: 6}, b: Checkpoint{Term: 1, Index: 5}, want: 1},
		// A lower term is before even with a much higher index.
		{name: "lower term wins over index", a: Checkpoint{Term: 1, Index: 100}, b: Checkpoint{Term: 2, Index: 1}, want: -1},
		// A higher term is after even with a lower index.
		{name: "higher term wins over index", a: Checkpoint{Term: 2, Index: 0}, b: Checkpoint{Term: 1, Index: 100}, want: 1},
		// The zero checkpoint is before any other.
		{name: "zero before any", a: Checkpoint{}, b: Checkpoint{Index: 1}, want: -1},
		// Index comparison is unsigned: the top bit set is large, not negative.
		{name: "unsigned index", a: Checkpoint{Term: 1, Index: 1 << 63}, b: Checkpoint{Term: 1, Index: 1}, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.a.Compare(tt.b))
			require.Equal(t, -tt.want, tt.b.Compare(tt.a), "Compare is not antisymmetric")
		})
	}
}

func TestMaxReturnsTheLaterCheckpoint(t *testing.T) {
	tests := []struct {
		name string
		a, b Checkpoint
		want Checkpoint
	}{
		// The first is later.
		{name: "first later", a: Checkpoint{Term: 1, Index: 6}, b: Checkpoint{Term: 1, Index: 5}, want: Checkpoint{Term: 1, Index: 6}},
		// The second is later.
		{name: "second later", a: Checkpoint{Term: 1, Index: 5}, b: Checkpoint{Term: 1, Index: 6}, want: Checkpoint{Term: 1, Index: 6}},
		// A later term beats a higher index.
		{name: "term beats index", a: Checkpoint{Term: 1, Index: 99}, b: Checkpoint{Term: 2, Index: 1}, want: Checkpoint{Term: 2, Index: 1}},
		// Anything beats zero.
		{name: "zero loses", a: Checkpoint{}, b: Checkpoint{Index: 1}, want: Checkpoint{Index: 1}},
		// Equal inputs give that checkpoint.
		{name: "equal", a: Checkpoint{Term: 3, Index: 3}, b: Checkpoint{Term: 3, Index: 3}, want: Checkpoint{Term: 3, Index: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Max(tt.a, tt.b))
		})
	}
}

// checkpointHolder is a struct with a Checkpoint field, as workflow state
// and manifests carry one.
type checkpointHolder struct {
	CP Checkpoint `json:"cp"`
}

func TestCheckpointMarshalsAsJSONString(t *testing.T) {
	tests := []struct {
		name string
		cp   Checkpoint
		want string
	}{
		// An ordinary checkpoint is the string "term.index", not an object.
		{name: "term and index", cp: Checkpoint{Term: 1, Index: 5}, want: `{"cp":"1.5"}`},
		// The zero checkpoint is the empty string.
		{name: "zero", cp: Checkpoint{}, want: `{"cp":""}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(checkpointHolder{CP: tt.cp})
			require.NoError(t, err)
			require.Equal(t, tt.want, string(b))

			var back checkpointHolder
			require.NoError(t, json.Unmarshal(b, &back))
			require.Equal(t, tt.cp, back.CP)
		})
	}
}

func TestCheckpointMarshalsAsJSONStringThroughPointer(t *testing.T) {
	cp := &Checkpoint{Term: 2, Index: 9}
	b, err := json.Marshal(cp)
	require.NoError(t, err)
	require.Equal(t, `"2.9"`, string(b))
}

func TestCheckpointUnmarshalJSON(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Checkpoint
		wantErr bool
	}{
		// A JSON string "term.index" decodes.
		{name: "string", in: `{"cp":"1.5"}`, want: Checkpoint{Term: 1, Index: 5}},
		// The empty string decodes to the zero checkpoint.
		{name: "empty string", in: `{"cp":""}`, want: Checkpoint{}},
		// A JSON number is not a checkpoint, even one that looks like "1.5".
		{name: "number", in: `{"cp":1.5}`, wantErr: true},
		// An integer is not a checkpoint either.
		{name: "integer", in: `{"cp":15}`, wantErr: true},
		// A malformed string fails.
		{name: "malformed string", in: `{"cp":"a.b"}`, wantErr: true},
		// A string without a dot fails.
		{name: "no dot", in: `{"cp":"15"}`, wantErr: true},
		// An object (the struct's default encoding) is not accepted.
		{name: "object", in: `{"cp":{"Term":1,"Index":5}}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got checkpointHolder
			err := json.Unmarshal([]byte(tt.in), &got)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got.CP)
		})
	}
}

func TestCheckpointUnmarshalJSONErrorsWrapErrBadCheckpoint(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		// A number: the JSON type is wrong.
		{name: "number", in: `15`},
		// A string that does not parse.
		{name: "malformed string", in: `"1.2.3"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cp Checkpoint
			err := cp.UnmarshalJSON([]byte(tt.in))
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrBadCheckpoint), "error %q does not wrap ErrBadCheckpoint", err)
		})
	}
}

func TestCheckpointTextRoundTrips(t *testing.T) {
	cp := Checkpoint{Term: 4, Index: 11}
	b, err := cp.MarshalText()
	require.NoError(t, err)
	require.Equal(t, "4.11", string(b))

	var back Checkpoint
	require.NoError(t, back.UnmarshalText(b))
	require.Equal(t, cp, back)

	err = back.UnmarshalText([]byte("x"))
	require.ErrorIs(t, err, ErrBadCheckpoint)
	require.Equal(t, cp, back, "a failed UnmarshalText must leave the checkpoint unchanged")
}

func TestParseCheckpointAcceptsAnOpaquePartAfterAnAt(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Checkpoint
	}{
		// A MariaDB GTID position, as the vitess adapter keeps it.
		{name: "mariadb gtid", in: "57.3@MariaDB/0-100-57", want: Checkpoint{Term: 57, Index: 3, Opaque: "MariaDB/0-100-57"}},
		// A MySQL GTID set: colons, dashes and commas are part of it.
		{name: "mysql gtid set", in: "60.0@MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57,4e11fa47-71ca-11e1-9e33-c80aa9429562:1-3",
			want: Checkpoint{Term: 60, Opaque: "MySQL56/3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57,4e11fa47-71ca-11e1-9e33-c80aa9429562:1-3"}},
		// Only the first @ separates: a later one belongs to the opaque part.
		{name: "at inside", in: "1.2@a@b", want: Checkpoint{Term: 1, Index: 2, Opaque: "a@b"}},
		// An opaque part alone makes the checkpoint non-zero.
		{name: "zero numbers", in: "0.0@x", want: Checkpoint{Opaque: "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCheckpoint(tt.in)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.in, got.String(), "the form is canonical")
			require.False(t, got.IsZero())
		})
	}
}

func TestParseCheckpointRejectsABadOpaquePart(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		// An @ with nothing after it: the canonical form of that is without the @.
		{name: "empty", in: "1.2@"},
		// Spaces would not survive every place a checkpoint is written.
		{name: "space", in: "1.2@MariaDB/0-100-57 x"},
		// Control characters neither.
		{name: "newline", in: "1.2@a\nb"},
		// Nor anything outside ASCII.
		{name: "non-ascii", in: "1.2@é"},
		// Bounded in size.
		{name: "too long", in: "1.2@" + strings.Repeat("x", MaxOpaque+1)},
		// The numbers must still be term.index.
		{name: "bad numbers", in: "1@MariaDB/0-1-1"},
		// An opaque part alone is not a checkpoint.
		{name: "no numbers", in: "@MariaDB/0-1-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCheckpoint(tt.in)
			require.ErrorIs(t, err, ErrBadCheckpoint)
			require.Equal(t, Checkpoint{}, got)
		})
	}
	cp, err := ParseCheckpoint("1.2@" + strings.Repeat("x", MaxOpaque))
	require.NoError(t, err, "MaxOpaque bytes are allowed")
	require.Len(t, cp.Opaque, MaxOpaque)
}

func TestCompareIgnoresTheOpaquePart(t *testing.T) {
	rec := Checkpoint{Term: 57, Index: 3}
	cp := Checkpoint{Term: 57, Index: 3, Opaque: "MariaDB/0-100-57"}
	require.Zero(t, rec.Compare(cp), "a record's position and the checkpoint at it are at the same point")
	require.Zero(t, cp.Compare(rec))
	require.Equal(t, -1, Checkpoint{Term: 56, Index: 9, Opaque: "MariaDB/0-100-56"}.Compare(cp))
	require.Equal(t, 1, Checkpoint{Term: 58, Opaque: "MariaDB/0-100-58"}.Compare(cp))
	require.Equal(t, cp, Max(cp, rec), "Max keeps its first argument on a tie")
	require.NotEqual(t, rec, cp, "equality still sees the opaque part")
}

func TestCheckpointWithAnOpaquePartRoundTripsThroughJSON(t *testing.T) {
	cp := Checkpoint{Term: 57, Index: 3, Opaque: "MariaDB/0-100-57"}
	b, err := json.Marshal(checkpointHolder{CP: cp})
	require.NoError(t, err)
	require.Equal(t, `{"cp":"57.3@MariaDB/0-100-57"}`, string(b))
	var back checkpointHolder
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, cp, back.CP)
}
