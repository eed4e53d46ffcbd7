// Package picker is the tablet picker: from a tablet's replicas, the
// selection options and the exclude list, it chooses the replica to read
// from, as Vitess's TabletPicker does. It is a pure function: the caller
// passes the time and the source of randomness.
package picker

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// ErrNoEligibleReplica: every replica of the tablet was filtered out.
var ErrNoEligibleReplica = errors.New("no eligible replica")

// Options steer the choice (the stream config's selection block).
type Options struct {
	Cells []string
	// OnlySpecified restricts candidates to Cells; otherwise Cells come
	// first and the other cells after them (preferLocal).
	OnlySpecified bool
	// Types lists the allowed replica types, most preferred first.
	Types  []source.TabletType
	MaxLag time.Duration
}

// FromConfig converts the config's selection block.
func FromConfig(s config.Selection) Options {
	o := Options{Cells: s.Cells, OnlySpecified: s.CellPreference == "onlySpecified", MaxLag: s.MaxLag.D()}
	for _, t := range s.TabletTypes {
		o.Types = append(o.Types, source.TabletType(t))
	}
	return o
}

// Rejection says why a replica was not a candidate.
type Rejection struct {
	Alias  string
	Reason string
}

// Pick chooses a replica of the tablet. Candidates are serving, healthy,
// of an allowed type, within MaxLag and not excluded; they are ordered by
// cell preference, then type order, and equals are shuffled with rng. With
// no candidate it returns an error wrapping ErrNoEligibleReplica that says
// why each replica was skipped.
func Pick(t source.Tablet, opts Options, exclude config.ExcludeList, now time.Time, rng *rand.Rand) (source.Replica, error) {
	cands, rejected := Candidates(t, opts, exclude, now)
	if len(cands) == 0 {
		return source.Replica{}, noEligible(t.ID, rejected)
	}
	// The best rank's equals are shuffled to spread load.
	best := 0
	for best < len(cands) && rank(cands[best], opts) == rank(cands[0], opts) {
		best++
	}
	return cands[rng.IntN(best)], nil
}

// Candidates returns the eligible replicas in preference order (equals in
// their listed order) and why the others were skipped.
func Candidates(t source.Tablet, opts Options, exclude config.ExcludeList, now time.Time) ([]source.Replica, []Rejection) {
	var cands []source.Replica
	var rejected []Rejection
	for _, r := range t.Replicas {
		if why := skip(r, t.ID, opts, exclude, now); why != "" {
			rejected = append(rejected, Rejection{Alias: r.Alias, Reason: why})
			continue
		}
		cands = append(cands, r)
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := rank(cands[i], opts), rank(cands[j], opts)
		return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1])
	})
	return cands, rejected
}

// Preferred reports whether r ranks with the best replicas the tablet has
// when every replica is up and none is excluded: a pick that is not
// preferred is a fallback, worth revisiting once the better ones recover.
func Preferred(t source.Tablet, opts Options, r source.Replica) bool {
	best := rank(r, opts)
	for _, o := range t.Replicas {
		if len(opts.Types) > 0 && !slices.Contains(opts.Types, o.Type) || opts.OnlySpecified && !slices.Contains(opts.Cells, o.Cell) {
			continue
		}
		if k := rank(o, opts); k[0] < best[0] || (k[0] == best[0] && k[1] < best[1]) {
			return false
		}
	}
	return true
}

// skip returns why a replica is not a candidate, or "".
func skip(r source.Replica, tablet string, opts Options, exclude config.ExcludeList, now time.Time) string {
	switch {
	case !r.Healthy:
		return "unhealthy"
	case !r.Serving:
		return "not serving"
	case len(opts.Types) > 0 && !slices.Contains(opts.Types, r.Type):
		return fmt.Sprintf("type %s not allowed", r.Type)
	case opts.OnlySpecified && !slices.Contains(opts.Cells, r.Cell):
		return fmt.Sprintf("cell %s not allowed", r.Cell)
	case opts.MaxLag > 0 && r.Lag > opts.MaxLag:
		return fmt.Sprintf("lag %v over %v", r.Lag, opts.MaxLag)
	}
	if e, ok := exclude.Excludes(r.Alias, tablet, now); ok {
		return "excluded: " + e.Reason
	}
	return ""
}

// rank orders candidates: cell preference first, then type order.
func rank(r source.Replica, opts Options) [2]int {
	cell := slices.Index(opts.Cells, r.Cell)
	if cell < 0 {
		cell = len(opts.Cells)
	}
	typ := slices.Index(opts.Types, r.Type)
	if typ < 0 {
		typ = len(opts.Types)
	}
	return [2]int{cell, typ}
}

func noEligible(tablet string, rejected []Rejection) error {
	parts := make([]string, 0, len(rejected))
	for _, r := range rejected {
		parts = append(parts, r.Alias+": "+r.Reason)
	}
	if len(parts) == 0 {
		return fmt.Errorf("tablet %s: %w: it has no replicas", tablet, ErrNoEligibleReplica)
	}
	return fmt.Errorf("tablet %s: %w (%s)", tablet, ErrNoEligibleReplica, strings.Join(parts, "; "))
}
