package picker

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// now is the fixed instant every test picks at.
var now = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// picks is how many times the statistical tests call Pick.
const picks = 1000

const tabletID = "t-0003"

// rep is a serving, healthy, caught-up replica of tabletID.
func rep(alias, cell string, typ source.TabletType) source.Replica {
	return source.Replica{Tablet: tabletID, Alias: alias, Cell: cell, Type: typ, Address: "127.0.0.1:0", Serving: true, Healthy: true}
}

func unhealthy(r source.Replica) source.Replica  { r.Healthy = false; return r }
func notServing(r source.Replica) source.Replica { r.Serving = false; return r }
func lagging(r source.Replica, lag time.Duration) source.Replica {
	r.Lag = lag
	return r
}

func tablet(rs ...source.Replica) source.Tablet { return source.Tablet{ID: tabletID, Replicas: rs} }

// opts is the default selection: zone1 first, then the rest; REPLICA,
// RDONLY, PRIMARY; 30s of lag.
func opts() Options {
	return Options{
		Cells:  []string{"zone1"},
		Types:  []source.TabletType{source.TypeReplica, source.TypeRDOnly, source.TypePrimary},
		MaxLag: 30 * time.Second,
	}
}

func seeded() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

// pickMany calls Pick picks times with one seeded rng and counts the
// aliases returned; any error fails the test.
func pickMany(t *testing.T, tab source.Tablet, o Options, exclude []config.Exclusion) map[string]int {
	t.Helper()
	rng := seeded()
	counts := map[string]int{}
	for range picks {
		r, err := Pick(tab, o, exclude, now, rng)
		require.NoError(t, err)
		counts[r.Alias]++
	}
	return counts
}

// keys returns the aliases a count map saw, for messages.
func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestPickNeverReturnsAnExcludedAlias(t *testing.T) {
	// Three equal replicas: without the exclusion each would get ~1/3.
	tab := tablet(
		rep("zone1-0000000101", "zone1", source.TypeReplica),
		rep("zone1-0000000102", "zone1", source.TypeReplica),
		rep("zone1-0000000103", "zone1", source.TypeReplica),
	)
	const barred = "zone1-0000000102"
	tests := []struct {
		name    string
		exclude []config.Exclusion
	}{
		// An operator entry with no tablet bars the replica on every tablet.
		{name: "stream-wide entry", exclude: []config.Exclusion{{Alias: barred, Reason: "maintenance"}}},
		// An automatic entry for this very tablet bars it here.
		{name: "per-tablet entry", exclude: []config.Exclusion{{Alias: barred, Tablet: tabletID, Reason: "POSITION_MISMATCH"}}},
		// An entry that has not expired yet still bars it.
		{name: "entry expiring later", exclude: []config.Exclusion{{Alias: barred, Reason: "maintenance", Expires: now.Add(time.Second)}}},
		// An entry for another tablet next to a stream-wide one: the
		// stream-wide one still counts.
		{name: "other tablet's entry does not hide a stream-wide one", exclude: []config.Exclusion{
			{Alias: barred, Tablet: "t-0009", Reason: "POSITION_MISMATCH"},
			{Alias: barred, Reason: "maintenance"},
		}},
		// An expired entry before a live one: the live one still counts.
		{name: "expired entry does not hide a live one", exclude: []config.Exclusion{
			{Alias: barred, Reason: "old", Expires: now.Add(-time.Hour)},
			{Alias: barred, Tablet: tabletID, Reason: "RETRIES_EXHAUSTED", Expires: now.Add(time.Hour)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			counts := pickMany(t, tab, opts(), tt.exclude)
			require.Zero(t, counts[barred], "picked an excluded replica: %v", counts)
			require.Positive(t, counts["zone1-0000000101"], "%v", counts)
			require.Positive(t, counts["zone1-0000000103"], "%v", counts)
		})
	}
}

func TestPickStillUsesReplicasExcludedOnlyElsewhereOrNoLonger(t *testing.T) {
	// Three equal replicas: an entry that does not bar zone1-0000000102
	// leaves it its ~1/3 share.
	tab := tablet(
		rep("zone1-0000000101", "zone1", source.TypeReplica),
		rep("zone1-0000000102", "zone1", source.TypeReplica),
		rep("zone1-0000000103", "zone1", source.TypeReplica),
	)
	const alias = "zone1-0000000102"
	tests := []struct {
		name    string
		exclude []config.Exclusion
	}{
		// An entry for another tablet does not bar the replica here.
		{name: "entry for another tablet", exclude: []config.Exclusion{{Alias: alias, Tablet: "t-0009", Reason: "POSITION_MISMATCH"}}},
		// An entry that expired an hour ago is over.
		{name: "expired entry", exclude: []config.Exclusion{{Alias: alias, Reason: "maintenance", Expires: now.Add(-time.Hour)}}},
		// An entry ends at its Expires instant, not after it.
		{name: "entry expiring now", exclude: []config.Exclusion{{Alias: alias, Reason: "maintenance", Expires: now}}},
		// An entry for another replica bars only that one.
		{name: "entry for another alias", exclude: []config.Exclusion{{Alias: "zone1-0000000999", Reason: "maintenance"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			counts := pickMany(t, tab, opts(), tt.exclude)
			require.GreaterOrEqual(t, counts[alias], 250, "%v", counts)
		})
	}
}

func TestPickPrefersListedCells(t *testing.T) {
	local := rep("zone1-0000000101", "zone1", source.TypeReplica)
	remote := rep("zone2-0000000201", "zone2", source.TypeReplica)
	far := rep("zone3-0000000301", "zone3", source.TypeReplica)
	tests := []struct {
		name    string
		tablet  source.Tablet
		opts    func(o *Options)
		exclude []config.Exclusion
		want    []string // every pick is one of these, and each is picked
	}{
		// The local replica wins over remote ones listed before it.
		{name: "healthy local wins", tablet: tablet(remote, far, local), want: []string{local.Alias}},
		// With two listed cells the first listed one wins.
		{name: "listed order is preference order", tablet: tablet(local, remote, far),
			opts: func(o *Options) { o.Cells = []string{"zone2", "zone1"} }, want: []string{remote.Alias}},
		// preferLocal falls back to the other cells when the local replica
		// is unhealthy; unlisted cells are equals.
		{name: "unhealthy local falls back to other cells", tablet: tablet(unhealthy(local), remote, far),
			want: []string{remote.Alias, far.Alias}},
		// ... when it is not serving.
		{name: "not-serving local falls back", tablet: tablet(notServing(local), remote),
			want: []string{remote.Alias}},
		// ... when it lags too far.
		{name: "lagging local falls back", tablet: tablet(lagging(local, time.Minute), remote),
			want: []string{remote.Alias}},
		// ... when it is excluded.
		{name: "excluded local falls back", tablet: tablet(local, remote),
			exclude: []config.Exclusion{{Alias: local.Alias, Reason: "ops"}}, want: []string{remote.Alias}},
		// ... when the tablet has no replica in the local cell at all.
		{name: "no local replica falls back", tablet: tablet(remote), want: []string{remote.Alias}},
		// Cell preference comes before type order: a local PRIMARY beats a
		// remote REPLICA.
		{name: "cell before type", tablet: tablet(remote, rep("zone1-0000000100", "zone1", source.TypePrimary)),
			want: []string{"zone1-0000000100"}},
		// No listed cells: every cell is equal, type order decides.
		{name: "no cells listed", tablet: tablet(local, remote, rep("zone3-0000000300", "zone3", source.TypePrimary)),
			opts: func(o *Options) { o.Cells = nil }, want: []string{local.Alias, remote.Alias}},
		// onlySpecified still picks the healthy local replica.
		{name: "onlySpecified picks local", tablet: tablet(remote, local),
			opts: func(o *Options) { o.OnlySpecified = true }, want: []string{local.Alias}},
		// onlySpecified with two cells never strays to a third.
		{name: "onlySpecified second listed cell", tablet: tablet(unhealthy(local), remote, far),
			opts: func(o *Options) { o.OnlySpecified = true; o.Cells = []string{"zone1", "zone2"} }, want: []string{remote.Alias}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			if tt.opts != nil {
				tt.opts(&o)
			}
			counts := pickMany(t, tt.tablet, o, tt.exclude)
			require.ElementsMatch(t, tt.want, keys(counts), "%v", counts)
		})
	}
}

func TestPickOnlySpecifiedNeverLeavesListedCells(t *testing.T) {
	local := rep("zone1-0000000101", "zone1", source.TypeReplica)
	remote := rep("zone2-0000000201", "zone2", source.TypeReplica)
	tests := []struct {
		name     string
		tablet   source.Tablet
		exclude  []config.Exclusion
		wantMsgs []string // what the error says about each replica
	}{
		// The local replica is unhealthy; a healthy remote one is not used.
		{name: "local unhealthy", tablet: tablet(unhealthy(local), remote),
			wantMsgs: []string{"zone1-0000000101: unhealthy", "zone2-0000000201: cell zone2 not allowed"}},
		// The local replica is excluded; the remote one is not used.
		{name: "local excluded", tablet: tablet(local, remote),
			exclude:  []config.Exclusion{{Alias: local.Alias, Reason: "maintenance"}},
			wantMsgs: []string{"zone1-0000000101: excluded: maintenance", "zone2-0000000201: cell zone2 not allowed"}},
		// The tablet has replicas only in other cells.
		{name: "no local replica", tablet: tablet(remote),
			wantMsgs: []string{"zone2-0000000201: cell zone2 not allowed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			o.OnlySpecified = true
			rng := seeded()
			for range picks {
				r, err := Pick(tt.tablet, o, tt.exclude, now, rng)
				require.ErrorIs(t, err, ErrNoEligibleReplica)
				require.Zero(t, r, "a replica came back with the error")
				for _, m := range tt.wantMsgs {
					require.Contains(t, err.Error(), m)
				}
			}
		})
	}
}

func TestPickHonoursTypeOrder(t *testing.T) {
	replica := rep("zone1-0000000101", "zone1", source.TypeReplica)
	rdonly := rep("zone1-0000000102", "zone1", source.TypeRDOnly)
	primary := rep("zone1-0000000103", "zone1", source.TypePrimary)
	all := []source.TabletType{source.TypeReplica, source.TypeRDOnly, source.TypePrimary}
	tests := []struct {
		name    string
		tablet  source.Tablet
		types   []source.TabletType
		want    string // the only alias picked; "" means ErrNoEligibleReplica
		wantMsg string // for an error: what it says
	}{
		// REPLICA first, whatever the listing order of replicas.
		{name: "replica before rdonly and primary", tablet: tablet(primary, rdonly, replica), types: all, want: replica.Alias},
		// Without a REPLICA, RDONLY comes next.
		{name: "rdonly before primary", tablet: tablet(primary, rdonly), types: all, want: rdonly.Alias},
		// PRIMARY is used when it is all there is.
		{name: "primary last", tablet: tablet(primary), types: all, want: primary.Alias},
		// An unhealthy REPLICA hands over to the RDONLY.
		{name: "next type when the best is unhealthy", tablet: tablet(unhealthy(replica), rdonly, primary), types: all, want: rdonly.Alias},
		// The listed order is the preference, not a fixed one.
		{name: "primary first when listed first", tablet: tablet(replica, rdonly, primary),
			types: []source.TabletType{source.TypePrimary, source.TypeReplica}, want: primary.Alias},
		// A type not listed is skipped even when it is the only healthy one
		// of a better kind.
		{name: "unlisted type skipped", tablet: tablet(replica, rdonly, primary),
			types: []source.TabletType{source.TypeRDOnly}, want: rdonly.Alias},
		// Only unlisted types: no candidate, and the error says why.
		{name: "only unlisted types", tablet: tablet(primary),
			types: []source.TabletType{source.TypeReplica, source.TypeRDOnly}, wantMsg: "zone1-0000000103: type PRIMARY not allowed"},
		// No types listed: every type is allowed (an unconverted Options).
		{name: "no types listed allows all", tablet: tablet(primary), types: nil, want: primary.Alias},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			o.Types = tt.types
			if tt.want == "" {
				_, err := Pick(tt.tablet, o, nil, now, seeded())
				require.ErrorIs(t, err, ErrNoEligibleReplica)
				require.Contains(t, err.Error(), tt.wantMsg)
				return
			}
			counts := pickMany(t, tt.tablet, o, nil)
			require.Equal(t, map[string]int{tt.want: picks}, counts)
		})
	}
}

func TestPickSkipsLaggingUnhealthyAndNotServingReplicas(t *testing.T) {
	best := rep("zone1-0000000101", "zone1", source.TypeReplica)
	fallback := rep("zone1-0000000102", "zone1", source.TypeRDOnly)
	tests := []struct {
		name   string
		best   source.Replica // a variant of best, listed before fallback
		maxLag time.Duration
		want   string
	}{
		// Control: a sound best replica is picked.
		{name: "sound replica picked", best: best, maxLag: 30 * time.Second, want: best.Alias},
		// Lag over maxLag skips the replica.
		{name: "lag over max", best: lagging(best, 30*time.Second+time.Nanosecond), maxLag: 30 * time.Second, want: fallback.Alias},
		// Lag equal to maxLag is still within it.
		{name: "lag equal to max", best: lagging(best, 30*time.Second), maxLag: 30 * time.Second, want: best.Alias},
		// maxLag 0 sets no limit.
		{name: "no lag limit", best: lagging(best, time.Hour), maxLag: 0, want: best.Alias},
		// An unhealthy replica is skipped.
		{name: "unhealthy", best: unhealthy(best), maxLag: 30 * time.Second, want: fallback.Alias},
		// A replica that is not serving is skipped.
		{name: "not serving", best: notServing(best), maxLag: 30 * time.Second, want: fallback.Alias},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			o.MaxLag = tt.maxLag
			counts := pickMany(t, tablet(tt.best, fallback), o, nil)
			require.Equal(t, map[string]int{tt.want: picks}, counts)
		})
	}
}

func TestPickWithNoCandidateNamesEveryReplicaAndWhy(t *testing.T) {
	a := rep("zone1-0000000101", "zone1", source.TypeReplica)
	b := rep("zone1-0000000102", "zone1", source.TypeReplica)
	c := rep("zone2-0000000201", "zone2", source.TypeReplica)
	tests := []struct {
		name     string
		tablet   source.Tablet
		opts     func(o *Options)
		exclude  []config.Exclusion
		wantMsgs []string
	}{
		// Every replica excluded, by stream-wide and per-tablet entries.
		{name: "all excluded", tablet: tablet(a, b, c),
			exclude: []config.Exclusion{
				{Alias: a.Alias, Reason: "maintenance"},
				{Alias: b.Alias, Tablet: tabletID, Reason: "POSITION_MISMATCH"},
				{Alias: c.Alias, Reason: "RETRIES_EXHAUSTED", Expires: now.Add(time.Minute)},
			},
			wantMsgs: []string{
				"tablet " + tabletID,
				"zone1-0000000101: excluded: maintenance",
				"zone1-0000000102: excluded: POSITION_MISMATCH",
				"zone2-0000000201: excluded: RETRIES_EXHAUSTED",
			}},
		// Each replica fails a different filter.
		{name: "one reason each", tablet: tablet(unhealthy(a), notServing(b), lagging(c, time.Minute)),
			wantMsgs: []string{
				"zone1-0000000101: unhealthy",
				"zone1-0000000102: not serving",
				"zone2-0000000201: lag 1m0s over 30s",
			}},
		// Type and cell filters are named too.
		{name: "type and cell", tablet: tablet(rep("zone1-0000000103", "zone1", source.TypePrimary), c),
			opts: func(o *Options) { o.OnlySpecified = true; o.Types = []source.TabletType{source.TypeReplica} },
			wantMsgs: []string{
				"zone1-0000000103: type PRIMARY not allowed",
				"zone2-0000000201: cell zone2 not allowed",
			}},
		// A tablet without replicas says so.
		{name: "no replicas", tablet: tablet(), wantMsgs: []string{"tablet " + tabletID, "has no replicas"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			if tt.opts != nil {
				tt.opts(&o)
			}
			r, err := Pick(tt.tablet, o, tt.exclude, now, seeded())
			require.ErrorIs(t, err, ErrNoEligibleReplica)
			require.Zero(t, r)
			for _, m := range tt.wantMsgs {
				require.Contains(t, err.Error(), m)
			}
			cands, rejected := Candidates(tt.tablet, o, tt.exclude, now)
			require.Empty(t, cands)
			require.Len(t, rejected, len(tt.tablet.Replicas), "every replica has a rejection")
		})
	}
}

func TestPickShufflesEqualBestCandidates(t *testing.T) {
	tests := []struct {
		name   string
		tablet source.Tablet
		equals []string // the best rank's members
	}{
		// Two local REPLICAs, with a worse RDONLY that must never win.
		{name: "two local replicas", tablet: tablet(
			rep("zone1-0000000101", "zone1", source.TypeReplica),
			rep("zone1-0000000102", "zone1", source.TypeRDOnly),
			rep("zone1-0000000103", "zone1", source.TypeReplica),
		), equals: []string{"zone1-0000000101", "zone1-0000000103"}},
		// Two REPLICAs in different unlisted cells are equals.
		{name: "two remote cells", tablet: tablet(
			unhealthy(rep("zone1-0000000101", "zone1", source.TypeReplica)),
			rep("zone2-0000000201", "zone2", source.TypeReplica),
			rep("zone3-0000000301", "zone3", source.TypeReplica),
			rep("zone3-0000000302", "zone3", source.TypePrimary),
		), equals: []string{"zone2-0000000201", "zone3-0000000301"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			counts := pickMany(t, tt.tablet, opts(), nil)
			require.ElementsMatch(t, tt.equals, keys(counts), "%v", counts)
			for _, alias := range tt.equals {
				require.GreaterOrEqual(t, counts[alias], 300, "%v", counts)
			}
		})
	}
}

func TestPickIsDeterministicForASeed(t *testing.T) {
	tab := tablet(
		rep("zone1-0000000101", "zone1", source.TypeReplica),
		rep("zone1-0000000102", "zone1", source.TypeReplica),
		rep("zone1-0000000103", "zone1", source.TypeReplica),
	)
	r1, r2 := seeded(), seeded()
	for range 100 {
		a, err := Pick(tab, opts(), nil, now, r1)
		require.NoError(t, err)
		b, err := Pick(tab, opts(), nil, now, r2)
		require.NoError(t, err)
		require.Equal(t, a, b)
	}
}

func TestCandidatesOrdersByCellThenTypeKeepingListedOrderForEquals(t *testing.T) {
	tests := []struct {
		name         string
		tablet       source.Tablet
		opts         func(o *Options)
		exclude      []config.Exclusion
		want         []string
		wantRejected []Rejection
	}{
		// Local cell first, then the rest; within each, type order; equals
		// keep their listed order.
		{name: "preferLocal", tablet: tablet(
			rep("zone2-0000000201", "zone2", source.TypePrimary),
			rep("zone2-0000000202", "zone2", source.TypeReplica),
			rep("zone1-0000000103", "zone1", source.TypePrimary),
			rep("zone3-0000000301", "zone3", source.TypeReplica),
			rep("zone1-0000000102", "zone1", source.TypeRDOnly),
			rep("zone1-0000000101", "zone1", source.TypeReplica),
		), want: []string{
			"zone1-0000000101", // local REPLICA
			"zone1-0000000102", // local RDONLY
			"zone1-0000000103", // local PRIMARY
			"zone2-0000000202", // remote REPLICA, listed before zone3's
			"zone3-0000000301", // remote REPLICA
			"zone2-0000000201", // remote PRIMARY
		}},
		// Two listed cells in their listed order, then the rest.
		{name: "two listed cells", opts: func(o *Options) { o.Cells = []string{"zone3", "zone1"} }, tablet: tablet(
			rep("zone1-0000000101", "zone1", source.TypeReplica),
			rep("zone2-0000000201", "zone2", source.TypeReplica),
			rep("zone3-0000000301", "zone3", source.TypePrimary),
		), want: []string{"zone3-0000000301", "zone1-0000000101", "zone2-0000000201"}},
		// Rejected replicas are left out and reported in listed order.
		{name: "rejections", tablet: tablet(
			unhealthy(rep("zone1-0000000101", "zone1", source.TypeReplica)),
			rep("zone1-0000000102", "zone1", source.TypeReplica),
			lagging(rep("zone2-0000000201", "zone2", source.TypeReplica), time.Hour),
			rep("zone2-0000000202", "zone2", source.TypeReplica),
		), exclude: []config.Exclusion{{Alias: "zone2-0000000202", Reason: "ops"}},
			want: []string{"zone1-0000000102"},
			wantRejected: []Rejection{
				{Alias: "zone1-0000000101", Reason: "unhealthy"},
				{Alias: "zone2-0000000201", Reason: "lag 1h0m0s over 30s"},
				{Alias: "zone2-0000000202", Reason: "excluded: ops"},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			if tt.opts != nil {
				tt.opts(&o)
			}
			cands, rejected := Candidates(tt.tablet, o, tt.exclude, now)
			got := make([]string, 0, len(cands))
			for _, c := range cands {
				got = append(got, c.Alias)
			}
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.wantRejected, rejected)
		})
	}
}

func TestFromConfigConvertsSelection(t *testing.T) {
	tests := []struct {
		name string
		in   config.Selection
		want Options
	}{
		// The DESIGN.md example: preferLocal, three types, 30s of lag.
		{name: "preferLocal", in: config.Selection{
			Cells: []string{"zone1"}, CellPreference: "preferLocal",
			TabletTypes: []string{"REPLICA", "RDONLY", "PRIMARY"}, MaxLag: config.Duration(30 * time.Second),
		}, want: Options{
			Cells: []string{"zone1"}, OnlySpecified: false,
			Types:  []source.TabletType{source.TypeReplica, source.TypeRDOnly, source.TypePrimary},
			MaxLag: 30 * time.Second,
		}},
		// onlySpecified sets OnlySpecified; type order is kept.
		{name: "onlySpecified", in: config.Selection{
			Cells: []string{"zone2", "zone1"}, CellPreference: "onlySpecified",
			TabletTypes: []string{"PRIMARY", "REPLICA"}, MaxLag: config.Duration(time.Second),
		}, want: Options{
			Cells: []string{"zone2", "zone1"}, OnlySpecified: true,
			Types:  []source.TabletType{source.TypePrimary, source.TypeReplica},
			MaxLag: time.Second,
		}},
		// An empty block converts to empty options (no filters).
		{name: "empty", in: config.Selection{}, want: Options{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, FromConfig(tt.in))
		})
	}
}

func TestFromConfigOfDecodedDefaultsPicksLikeTheDesign(t *testing.T) {
	// The defaults of a minimal config steer the picker as DESIGN.md says:
	// REPLICA before RDONLY before PRIMARY, lag limited to 30s.
	c, err := config.Decode([]byte(`{"source": {"kind": "tabletd", "address": "127.0.0.1:15991", "keyspace": "commerce"},
		"sink": {"kind": "jsonl", "path": "/tmp/x"}}`))
	require.NoError(t, err)
	o := FromConfig(c.Selection)
	require.False(t, o.OnlySpecified)
	require.Equal(t, []source.TabletType{source.TypeReplica, source.TypeRDOnly, source.TypePrimary}, o.Types)
	require.Equal(t, 30*time.Second, o.MaxLag)
	r, err := Pick(tablet(
		rep("zone1-0000000103", "zone1", source.TypePrimary),
		lagging(rep("zone1-0000000101", "zone1", source.TypeReplica), time.Minute),
		rep("zone1-0000000102", "zone1", source.TypeRDOnly),
	), o, nil, now, seeded())
	require.NoError(t, err)
	require.Equal(t, "zone1-0000000102", r.Alias)
}

func TestPreferredTellsAFallbackPickFromABestOne(t *testing.T) {
	tab := source.Tablet{ID: "t-0001", Replicas: []source.Replica{
		{Alias: "zone1-0000000101", Cell: "zone1", Type: source.TypeReplica, Serving: true, Healthy: false},
		{Alias: "zone2-0000000201", Cell: "zone2", Type: source.TypeReplica, Serving: true, Healthy: true},
		{Alias: "zone1-0000000102", Cell: "zone1", Type: source.TypePrimary, Serving: true, Healthy: true},
	}}
	opts := Options{Cells: []string{"zone1"}, Types: []source.TabletType{source.TypeReplica, source.TypePrimary}}
	tests := []struct {
		name  string
		pick  int
		wantP bool
	}{
		// The local REPLICA ranks best, healthy or not.
		{"the best rank", 0, true},
		// Another cell's replica is a fallback while the local cell has one.
		{"another cell", 1, false},
		// The local PRIMARY is below the local REPLICA in type order.
		{"a worse type", 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.wantP, Preferred(tab, opts, tab.Replicas[tt.pick]))
		})
	}
}
