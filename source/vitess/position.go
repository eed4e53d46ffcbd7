package vitess

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tabletflow/tabletflow/source"
)

// A shard's position is its GTID position as Vitess encodes it,
// "<flavor>/<GTID set>": "MariaDB/0-100-57" (domain-server-sequence, one
// per replication domain) or "MySQL56/<uuid>:1-57" (intervals of
// transaction numbers per server UUID). Two numbers cannot hold it, so a
// checkpoint keeps it whole as its Opaque part, and its Term is the
// position's transaction count (count): a number that grows by at least
// one with every transaction of the shard's one replication history, the
// same on every vttablet of the shard, so that checkpoints and record
// positions order as the transactions did.

// count returns how many transactions a GTID position holds: on MariaDB
// the sum of the domains' sequence numbers, on MySQL the number of GTIDs
// in the set. Another flavor (a file position) has no such count and is
// refused.
func count(pos string) (uint64, error) {
	flavor, set, ok := strings.Cut(pos, "/")
	if !ok {
		return 0, fmt.Errorf("%q: want <flavor>/<GTID set>", pos)
	}
	var n uint64
	add := func(k uint64) error {
		if n > math.MaxUint64-k {
			return fmt.Errorf("%q: too many transactions", pos)
		}
		n += k
		return nil
	}
	switch flavor {
	case "MariaDB":
		if set == "" {
			return 0, nil
		}
		for gtid := range strings.SplitSeq(set, ",") {
			parts := strings.Split(gtid, "-")
			if len(parts) != 3 {
				return 0, fmt.Errorf("%q: %q is not domain-server-sequence", pos, gtid)
			}
			var seq uint64
			for i, p := range parts {
				v, err := strconv.ParseUint(p, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%q: %q is not domain-server-sequence", pos, gtid)
				}
				if i == 2 {
					seq = v
				}
			}
			if err := add(seq); err != nil {
				return 0, err
			}
		}
	case "MySQL56":
		if set == "" {
			return 0, nil
		}
		for sid := range strings.SplitSeq(set, ",") {
			parts := strings.Split(strings.TrimSpace(sid), ":")
			if len(parts) < 2 || len(parts[0]) != 36 {
				return 0, fmt.Errorf("%q: %q is not <uuid>:<intervals>", pos, sid)
			}
			for _, iv := range parts[1:] {
				lo, hi, isRange := strings.Cut(iv, "-")
				if !isRange {
					hi = lo
				}
				a, err1 := strconv.ParseUint(lo, 10, 64)
				b, err2 := strconv.ParseUint(hi, 10, 64)
				if err1 != nil || err2 != nil || a == 0 || b < a {
					return 0, fmt.Errorf("%q: %q is not an interval of transaction numbers", pos, iv)
				}
				if err := add(b - a + 1); err != nil {
					return 0, err
				}
			}
		}
	default:
		return 0, fmt.Errorf("%q: flavor %q: want MariaDB or MySQL56 GTIDs (GTID mode on every server)", pos, flavor)
	}
	return n, nil
}

// checkpointAt is the checkpoint at a shard's GTID position after a
// transaction that delivered n records (0: a transaction that delivered
// none, or an idle position); opaque is the position, with the copy's
// state after it during a copy (see copy.go).
func checkpointAt(opaque string, n uint64) (source.Checkpoint, error) {
	pos, _, _ := strings.Cut(opaque, copyMark)
	c, err := count(pos)
	if err != nil {
		return source.Checkpoint{}, err
	}
	cp := source.Checkpoint{Term: c, Index: n, Opaque: opaque}
	if _, err := source.ParseCheckpoint(cp.String()); err != nil {
		return source.Checkpoint{}, fmt.Errorf("GTID position %.80q does not fit in a checkpoint: %w", pos, err)
	}
	return cp, nil
}

// positionOf returns the GTID position a checkpoint holds and, for one
// taken during a copy, where the copy stands, checking that it is one of
// this adapter's: its Term is its position's count.
func positionOf(cp source.Checkpoint) (string, *copyState, error) {
	pos, state, err := parseOpaque(cp.Opaque)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %q: %v", source.ErrBadCheckpoint, cp.String(), err)
	}
	if c, err := count(pos); err != nil || c != cp.Term {
		return "", nil, fmt.Errorf("%w: %q is not a Vitess checkpoint (<transactions>.<records>@<GTID position>)", source.ErrBadCheckpoint, cp.String())
	}
	return pos, state, nil
}
