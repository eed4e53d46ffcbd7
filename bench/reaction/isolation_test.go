package main

import (
	"strings"
	"testing"
	"time"
)

// TestSharedWindowOpensWhenBothHaveATenthAndShutsWhenEitherHasNine: the
// side-by-side rates come from one window for both sides, so neither
// side's start or tail is counted against the other.
func TestSharedWindowOpensWhenBothHaveATenthAndShutsWhenEitherHasNine(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	w := sharedWindow{backlog: [2]uint64{1000, 2000}}
	polls := []struct {
		s       float64
		written [2]float64
		all     [2]float64
		edge    string
	}{
		{0, [2]float64{0, 0}, [2]float64{0, 0}, ""},
		{1, [2]float64{150, 150}, [2]float64{160, 170}, ""},       // side 1 short of its tenth (200)
		{2, [2]float64{300, 200}, [2]float64{320, 210}, "open"},   // both at a tenth
		{3, [2]float64{500, 900}, [2]float64{530, 950}, ""},       // neither at nine tenths
		{6, [2]float64{800, 1800}, [2]float64{850, 1900}, "shut"}, // side 1 at nine tenths
		{7, [2]float64{950, 2000}, [2]float64{990, 2100}, ""},     // after the window
	}
	for _, p := range polls {
		m := w.add(at(p.s), p.written, p.all)
		var edge string
		switch {
		case m == &w.open:
			edge = "open"
			m.cpu, m.steal = [2]float64{10, 20}, 1
		case m == &w.shut:
			edge = "shut"
			m.cpu, m.steal = [2]float64{13, 28}, 1.5
		case m != nil:
			t.Fatalf("poll at %vs: a mark that is neither edge", p.s)
		}
		if edge != p.edge {
			t.Fatalf("poll at %vs: edge %q, want %q", p.s, edge, p.edge)
		}
	}
	out, window, steal, err := w.drains()
	if err != nil {
		t.Fatal(err)
	}
	if window != 4*time.Second || steal != 0.5 {
		t.Fatalf("window %v, steal %v; want 4s and 0.5", window, steal)
	}
	want := [2]drain{
		{records: 500, rate: 125, allRate: 132.5, cpu: 3},
		{records: 1600, rate: 400, allRate: 422.5, cpu: 8},
	}
	if out != want {
		t.Fatalf("drains %+v, want %+v", out, want)
	}
}

// TestSharedWindowTooShortOrNeverShutIsAnError: drains too far apart in
// time have no common window to compare them in.
func TestSharedWindowTooShortOrNeverShutIsAnError(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	w := sharedWindow{backlog: [2]uint64{100, 100}}
	w.add(t0, [2]float64{10, 95}, [2]float64{10, 95}) // opens: both at a tenth
	if _, _, _, err := w.drains(); err == nil || !strings.Contains(err.Error(), "never shut") {
		t.Fatalf("an open window: %v, want never shut", err)
	}
	w.add(t0.Add(500*time.Millisecond), [2]float64{20, 100}, [2]float64{20, 100}) // shuts
	if _, window, _, err := w.drains(); err == nil || window != 500*time.Millisecond {
		t.Fatalf("a window of %v: %v, want an error", window, err)
	}
}

// TestSettledIsWithinAQuarterOrATenthOfACoreOfTheBase: an exclusion
// trial waits for settled before it starts; a load left high by the
// previous trial's moves must not pass.
func TestSettledIsWithinAQuarterOrATenthOfACoreOfTheBase(t *testing.T) {
	for _, c := range []struct {
		load, base float64
		want       bool
	}{
		{0.24, 0.14, true},  // a tenth of a core above a small base
		{0.25, 0.14, false}, // more than that
		{1.25, 1.0, true},   // a quarter above a large base
		{1.30, 1.0, false},
		{1.40, 0.30, false}, // a load right after many tablets moved
		{0.05, 0.14, true},  // below the base
	} {
		if got := settled(c.load, c.base); got != c.want {
			t.Errorf("settled(%v, %v) = %v, want %v", c.load, c.base, got, c.want)
		}
	}
}
