package source

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Checkpoint is a position in a tablet's change log: "term.index", ordered by
// term then index. As a checkpoint it means every record at or before it is
// consumed; reading resumes after it. The zero Checkpoint means "the
// stream's start position for this tablet".
//
// The postgres adapter puts a transaction's commit LSN in Term and a
// record's ordinal within the transaction in Index (source/postgres).
type Checkpoint struct {
	Term  uint64
	Index uint64
}

// ParseCheckpoint parses "term.index". The empty string is the zero
// Checkpoint.
func ParseCheckpoint(s string) (Checkpoint, error) {
	if s == "" {
		return Checkpoint{}, nil
	}
	termStr, indexStr, ok := strings.Cut(s, ".")
	if !ok {
		return Checkpoint{}, fmt.Errorf("%w: %q: want term.index", ErrBadCheckpoint, s)
	}
	term, err := strconv.ParseUint(termStr, 10, 64)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %q: bad term", ErrBadCheckpoint, s)
	}
	index, err := strconv.ParseUint(indexStr, 10, 64)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %q: bad index", ErrBadCheckpoint, s)
	}
	return Checkpoint{Term: term, Index: index}, nil
}

// String returns "term.index", or "" for the zero Checkpoint.
func (c Checkpoint) String() string {
	if c.IsZero() {
		return ""
	}
	return strconv.FormatUint(c.Term, 10) + "." + strconv.FormatUint(c.Index, 10)
}

// IsZero reports whether c is the zero Checkpoint.
func (c Checkpoint) IsZero() bool { return c == Checkpoint{} }

// Compare returns -1, 0 or +1 as c is before, equal to or after o.
func (c Checkpoint) Compare(o Checkpoint) int {
	switch {
	case c.Term < o.Term:
		return -1
	case c.Term > o.Term:
		return 1
	case c.Index < o.Index:
		return -1
	case c.Index > o.Index:
		return 1
	}
	return 0
}

// Max returns the later of a and b.
func Max(a, b Checkpoint) Checkpoint {
	if a.Compare(b) >= 0 {
		return a
	}
	return b
}

// MarshalText encodes c as "term.index" (JSON encodes it as a string).
func (c Checkpoint) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText parses "term.index".
func (c *Checkpoint) UnmarshalText(b []byte) error {
	p, err := ParseCheckpoint(string(b))
	if err != nil {
		return err
	}
	*c = p
	return nil
}

var (
	_ json.Marshaler   = Checkpoint{}
	_ json.Unmarshaler = (*Checkpoint)(nil)
)

// MarshalJSON encodes c as a JSON string.
func (c Checkpoint) MarshalJSON() ([]byte, error) { return json.Marshal(c.String()) }

// UnmarshalJSON decodes a JSON string "term.index".
func (c *Checkpoint) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%w: %s", ErrBadCheckpoint, b)
	}
	return c.UnmarshalText([]byte(s))
}
