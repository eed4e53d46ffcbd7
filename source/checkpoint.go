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
//
// Opaque is an adapter's own form of the point, for a source whose
// position two numbers cannot carry: the vitess adapter keeps a shard's
// GTID position there ("MariaDB/0-100-57") and a count of the
// transactions it holds in Term (source/vitess). It prints after an "@"
// ("57.3@MariaDB/0-100-57") and takes no part in the order: Compare looks
// at Term and Index only, so a record's position without it and a
// checkpoint with it at the same point compare equal. Every other source
// leaves it empty, so their checkpoints print, parse and encode as they
// always did.
type Checkpoint struct {
	Term   uint64
	Index  uint64
	Opaque string
}

// MaxOpaque bounds a checkpoint's Opaque part, in bytes.
const MaxOpaque = 4096

// ParseCheckpoint parses "term.index" or "term.index@opaque", where
// opaque is 1 to MaxOpaque printable ASCII characters other than space.
// The empty string is the zero Checkpoint.
func ParseCheckpoint(s string) (Checkpoint, error) {
	if s == "" {
		return Checkpoint{}, nil
	}
	in := s
	s, opaque, hasOpaque := strings.Cut(s, "@")
	if hasOpaque && !validOpaque(opaque) {
		return Checkpoint{}, fmt.Errorf("%w: %q: want 1 to %d printable ASCII characters after @", ErrBadCheckpoint, in, MaxOpaque)
	}
	termStr, indexStr, ok := strings.Cut(s, ".")
	if !ok {
		return Checkpoint{}, fmt.Errorf("%w: %q: want term.index", ErrBadCheckpoint, in)
	}
	term, err := strconv.ParseUint(termStr, 10, 64)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %q: bad term", ErrBadCheckpoint, in)
	}
	index, err := strconv.ParseUint(indexStr, 10, 64)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %q: bad index", ErrBadCheckpoint, in)
	}
	return Checkpoint{Term: term, Index: index, Opaque: opaque}, nil
}

// validOpaque reports whether s may be a checkpoint's Opaque part: it
// survives every encoding a checkpoint goes through (JSON, a sink's text
// column, a log line) unchanged.
func validOpaque(s string) bool {
	if s == "" || len(s) > MaxOpaque {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// String returns "term.index" (with "@opaque" when Opaque is set), or ""
// for the zero Checkpoint.
func (c Checkpoint) String() string {
	if c.IsZero() {
		return ""
	}
	s := strconv.FormatUint(c.Term, 10) + "." + strconv.FormatUint(c.Index, 10)
	if c.Opaque != "" {
		s += "@" + c.Opaque
	}
	return s
}

// IsZero reports whether c is the zero Checkpoint.
func (c Checkpoint) IsZero() bool { return c == Checkpoint{} }

// Compare returns -1, 0 or +1 as c is before, equal to or after o, by
// Term then Index (Opaque takes no part).
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

// MarshalText encodes c as String does (JSON encodes it as a string).
func (c Checkpoint) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText parses what MarshalText gives.
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

// UnmarshalJSON decodes a JSON string of what String gives.
func (c *Checkpoint) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%w: %s", ErrBadCheckpoint, b)
	}
	return c.UnmarshalText([]byte(s))
}
