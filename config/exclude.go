package config

import (
	"slices"
	"time"
)

// ExcludeList is an exclude list: the entries tablet selection must not
// pick. The stream keeps the operator's list, each tablet its own
// automatic one; the tablet picker and the workers' exclusion watchers
// read them. Its methods never modify the list they are called on: Add,
// Remove and Live return a new list. In JSON it is an array of entries.
type ExcludeList []Exclusion

// Add returns the list with e, replacing any entry for the same alias on
// the same tablet ("" is every tablet).
func (l ExcludeList) Add(e Exclusion) ExcludeList {
	out := slices.DeleteFunc(slices.Clone(l), func(x Exclusion) bool { return x.Alias == e.Alias && x.Tablet == e.Tablet })
	return append(out, e)
}

// Remove returns the list without any entry for the aliases, whatever its
// tablet.
func (l ExcludeList) Remove(aliases ...string) ExcludeList {
	return slices.DeleteFunc(slices.Clone(l), func(x Exclusion) bool { return slices.Contains(aliases, x.Alias) })
}

// Live returns the entries that have not expired at now (never nil).
func (l ExcludeList) Live(now time.Time) ExcludeList {
	out := ExcludeList{}
	for _, e := range l {
		if e.live(now) {
			out = append(out, e)
		}
	}
	return out
}

// NextExpiry returns the earliest expiry on the list, past ones included
// (zero: no entry expires).
func (l ExcludeList) NextExpiry() time.Time {
	var next time.Time
	for _, e := range l {
		if !e.Expires.IsZero() && (next.IsZero() || e.Expires.Before(next)) {
			next = e.Expires
		}
	}
	return next
}

// Excludes reports whether the list bars alias from tablet at now, and
// the first live entry that does: entries for every tablet and for this
// tablet count, expired ones do not.
func (l ExcludeList) Excludes(alias, tablet string, now time.Time) (Exclusion, bool) {
	for _, e := range l {
		if e.Alias == alias && (e.Tablet == "" || e.Tablet == tablet) && e.live(now) {
			return e, true
		}
	}
	return Exclusion{}, false
}

// live: the entry has no expiry, or it is after now.
func (e Exclusion) live(now time.Time) bool { return e.Expires.IsZero() || now.Before(e.Expires) }
