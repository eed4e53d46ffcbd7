package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestExcludeListExcludesLiveEntriesForTheTabletOrEveryTablet(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	const tablet = "t-0001"
	tests := []struct {
		name   string
		list   ExcludeList
		alias  string
		want   bool
		reason string
	}{
		{name: "empty list", list: nil, alias: "zone1-1", want: false},
		{name: "stream-wide forever", list: ExcludeList{{Alias: "zone1-1", Reason: "ops"}}, alias: "zone1-1", want: true, reason: "ops"},
		// A per-tablet entry bars only its tablet.
		{name: "this tablet", list: ExcludeList{{Alias: "zone1-1", Tablet: tablet, Reason: "auto"}}, alias: "zone1-1", want: true, reason: "auto"},
		{name: "other tablet", list: ExcludeList{{Alias: "zone1-1", Tablet: "t-0009"}}, alias: "zone1-1", want: false},
		// Expiry is exclusive: an entry is dead from its Expires on.
		{name: "expired", list: ExcludeList{{Alias: "zone1-1", Expires: now.Add(-time.Nanosecond)}}, alias: "zone1-1", want: false},
		{name: "expiring now", list: ExcludeList{{Alias: "zone1-1", Expires: now}}, alias: "zone1-1", want: false},
		{name: "not yet expired", list: ExcludeList{{Alias: "zone1-1", Expires: now.Add(time.Nanosecond), Reason: "soon"}}, alias: "zone1-1", want: true, reason: "soon"},
		{name: "prefix is not a match", list: ExcludeList{{Alias: "zone1-1"}}, alias: "zone1-10", want: false},
		// An expired entry does not hide a live one behind it.
		{name: "first live entry wins", list: ExcludeList{
			{Alias: "zone1-1", Expires: now.Add(-time.Hour), Reason: "old"},
			{Alias: "zone1-1", Reason: "new"},
		}, alias: "zone1-1", want: true, reason: "new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, ok := tt.list.Excludes(tt.alias, tablet, now)
			require.Equal(t, tt.want, ok)
			require.Equal(t, tt.reason, e.Reason)
		})
	}
}

func TestExcludeListAddReplacesTheSameAliasAndTabletOnly(t *testing.T) {
	l := ExcludeList{{Alias: "a-1", Reason: "one"}, {Alias: "a-1", Tablet: "t-1", Reason: "two"}}
	got := l.Add(Exclusion{Alias: "a-1", Reason: "three"})
	require.Equal(t, ExcludeList{{Alias: "a-1", Tablet: "t-1", Reason: "two"}, {Alias: "a-1", Reason: "three"}}, got)
	require.Equal(t, "one", l[0].Reason, "the list Add was called on is unchanged")
}

func TestExcludeListRemoveDropsTheAliasesOnEveryTablet(t *testing.T) {
	l := ExcludeList{{Alias: "a-1"}, {Alias: "a-1", Tablet: "t-1"}, {Alias: "b-1"}, {Alias: "c-1"}}
	require.Equal(t, ExcludeList{{Alias: "b-1"}}, l.Remove("a-1", "c-1"))
	require.Len(t, l, 4, "unchanged")
}

func TestExcludeListLiveAndNextExpiry(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	l := ExcludeList{
		{Alias: "a-1", Expires: now.Add(-time.Minute)}, // past: not live, still the next expiry until pruned
		{Alias: "b-1", Expires: now.Add(time.Hour)},
		{Alias: "c-1"}, // forever
	}
	require.Equal(t, ExcludeList{{Alias: "b-1", Expires: now.Add(time.Hour)}, {Alias: "c-1"}}, l.Live(now))
	require.Equal(t, now.Add(-time.Minute), l.NextExpiry())
	require.Equal(t, now.Add(time.Hour), l.Live(now).NextExpiry())
	require.True(t, ExcludeList{{Alias: "c-1"}}.NextExpiry().IsZero(), "nothing expires")
	require.NotNil(t, ExcludeList(nil).Live(now), "an empty live list is [] in JSON, not null")
}
