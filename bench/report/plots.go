package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The plots' file names in the results directory.
const (
	throughputPlot = "throughput.png"
	reroutePlot    = "reroute.png"
	cpuPlot        = "cpu.png"
)

// Styles shared by the plots: goals are dashed red lines, so a reader sees
// at a glance which side of the line a figure falls.
var (
	goalColor  = color.RGBA{R: 200, A: 255}
	goalDashes = []vg.Length{vg.Points(6), vg.Points(3)}
	plotWidth  = 8 * vg.Inch
	plotHeight = 5 * vg.Inch
)

// charts are the plots and the functions that draw them.
var charts = []struct {
	File string
	Draw func(*results) (*plot.Plot, error)
}{
	{throughputPlot, throughputChart},
	{reroutePlot, rerouteChart},
	{cpuPlot, cpuChart},
}

// writePlots draws every plot into dir. A plot whose data is missing is
// still written, titled "not measured", so an old picture never outlives
// the result it was drawn from. One plot failing does not stop the others.
func writePlots(r *results, dir string) error {
	var errs []error
	for _, c := range charts {
		p, err := c.Draw(r)
		if err == nil {
			err = p.Save(plotWidth, plotHeight, filepath.Join(dir, c.File))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.File, err))
		}
	}
	return errors.Join(errs...)
}

// emptyPlot is a plot with nothing to show but why.
func emptyPlot(title string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
	p.HideAxes() // axes without data would suggest a scale that means nothing
	return p
}

// newChart is a plot with its title, axis labels and a grid.
func newChart(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	p.Add(plotter.NewGrid())
	return p
}

// goalLine is a dashed horizontal line at y from x0 to x1.
func goalLine(y, x0, x1 float64) (*plotter.Line, error) {
	line, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return nil, err
	}
	line.LineStyle.Color = goalColor
	line.LineStyle.Dashes = goalDashes
	line.LineStyle.Width = vg.Points(1.5)
	return line, nil
}

// groupedTicks are the default ticks labelled with thousands separators
// ("200,000" rather than "200000" or "2e+05").
type groupedTicks struct{}

func (groupedTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = fixed(ticks[i].Value, decimalsOf(ticks[i].Label))
		}
	}
	return ticks
}

// decimalsOf counts the decimals in a formatted number.
func decimalsOf(label string) int {
	if _, frac, ok := strings.Cut(label, "."); ok {
		return len(frac)
	}
	return 0
}

// logTicks marks 1, 2 and 5 times each power of ten within [lo, hi]:
// denser than plot.LogTicks, which labels only the powers of ten, too few
// for ranges spanning one or two decades.
func logTicks(lo, hi float64) plot.ConstantTicks {
	var ticks []plot.Tick
	for exp := math.Floor(math.Log10(lo)); math.Pow(10, exp) <= hi; exp++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, exp)
			if v >= lo && v <= hi {
				ticks = append(ticks, plot.Tick{Value: v, Label: fixed(v, max(-int(exp), 0))})
			}
		}
	}
	return ticks
}

// throughputPoint is one throughput case: its tablet count and rates.
type throughputPoint struct {
	Tablets, Raw, Flow float64
}

// throughputPoints collects the cases that have a tablet count and both
// rates, in tablet order.
func throughputPoints(r *results) []throughputPoint {
	var points []throughputPoint
	for _, c := range throughputCases(r.file(throughputFile).Data) {
		tablets, okT := c.num("tablets")
		raw, okR := c.num("raw_records_per_s")
		flow, okF := c.num("tabletflow_records_per_s")
		if okT && okR && okF {
			points = append(points, throughputPoint{Tablets: tablets, Raw: raw, Flow: flow})
		}
	}
	sort.Slice(points, func(i, j int) bool { return points[i].Tablets < points[j].Tablets })
	return points
}

// throughputChart draws records/s against tablets for the raw loop and for
// tabletflow, with the 0.9 × raw goal under the raw line.
func throughputChart(r *results) (*plot.Plot, error) {
	points := throughputPoints(r)
	if len(points) == 0 {
		return emptyPlot("Bulk throughput: not measured (" + throughputFile + ")"), nil
	}
	p := newChart("Bulk throughput, end to end ("+throughputFile+")", "tablets", "records/s")
	p.Y.Tick.Marker = groupedTicks{}
	// Bottom left: the rates sit high on the plot, so that corner is free.
	p.Legend.Left = true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(12), vg.Points(12)

	var raw, flow, goal plotter.XYs
	var xTicks plot.ConstantTicks
	maxTablets, maxRate := 0.0, 0.0
	for _, pt := range points {
		raw = append(raw, plotter.XY{X: pt.Tablets, Y: pt.Raw})
		flow = append(flow, plotter.XY{X: pt.Tablets, Y: pt.Flow})
		goal = append(goal, plotter.XY{X: pt.Tablets, Y: goalBulkRatio * pt.Raw})
		xTicks = append(xTicks, plot.Tick{Value: pt.Tablets, Label: fixed(pt.Tablets, 0)})
		maxTablets = max(maxTablets, pt.Tablets)
		maxRate = max(maxRate, pt.Raw, pt.Flow)
	}
	if err := addSeries(p, "raw loop", raw, 0, draw.CircleGlyph{}); err != nil {
		return nil, err
	}
	if err := addSeries(p, "tabletflow", flow, 1, draw.TriangleGlyph{}); err != nil {
		return nil, err
	}
	goalPoints, err := plotter.NewScatter(goal)
	if err != nil {
		return nil, err
	}
	goalPoints.GlyphStyle = draw.GlyphStyle{Color: goalColor, Radius: vg.Points(5), Shape: draw.BoxGlyph{}}
	if len(goal) > 1 {
		goalTrend, err := plotter.NewLine(goal)
		if err != nil {
			return nil, err
		}
		goalTrend.LineStyle.Color, goalTrend.LineStyle.Dashes = goalColor, goalDashes
		p.Add(goalTrend)
	}
	goalLabels, err := valueLabels(goal)
	if err != nil {
		return nil, err
	}
	// Left of the point: tabletflow's figure, on the right, is often close.
	for i := range goalLabels.TextStyle {
		goalLabels.TextStyle[i].XAlign = draw.XRight
	}
	goalLabels.Offset.X = -vg.Points(8)
	p.Add(goalPoints, goalLabels)
	p.Legend.Add(fmt.Sprintf("goal: tabletflow ≥ %v × raw", goalBulkRatio), goalPoints)

	// One tablet count alone would make a zero-width axis: the range runs
	// from 0 past the largest count, and the ticks sit on the counts run.
	p.X.Min, p.X.Max = 0, maxTablets*1.25
	p.X.Tick.Marker = append(plot.ConstantTicks{{Value: 0, Label: "0"}}, xTicks...)
	p.Y.Min, p.Y.Max = 0, maxRate*1.2
	return p, nil
}

// addSeries adds a line with points and value labels, in the colour and
// glyph given, to p and its legend.
func addSeries(p *plot.Plot, name string, xys plotter.XYs, colorIndex int, shape draw.GlyphDrawer) error {
	line, points, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	line.LineStyle.Color = plotutil.Color(colorIndex)
	points.GlyphStyle = draw.GlyphStyle{Color: plotutil.Color(colorIndex), Radius: vg.Points(4), Shape: shape}
	labels, err := valueLabels(xys)
	if err != nil {
		return err
	}
	p.Add(line, points, labels)
	p.Legend.Add(name, line, points)
	return nil
}

// valueLabels writes each point's value beside it: with one or two points
// a reader wants the figure, not an estimate read off the axis.
func valueLabels(xys plotter.XYs) (*plotter.Labels, error) {
	texts := make([]string, len(xys))
	for i, xy := range xys {
		texts[i] = fixed(xy.Y, 0)
	}
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return nil, err
	}
	labels.Offset = vg.Point{X: vg.Points(7), Y: vg.Points(-4)}
	return labels, nil
}

// rerouteCase is one box of the re-routing plot.
type rerouteCase struct {
	latencyCase
	Label string
	Goal  float64 // the case's p99 bound in seconds; 0 when it has none
}

// knownReroutes are the reaction cases in the order they are plotted, with
// a short label and their goal.
var knownReroutes = []struct {
	Key, Label string
	Goal       float64
}{
	{keyMismatch, "POSITION_MISMATCH\n→ other replica", goalMismatchP99S},
	{keyDown, "server down\n→ elsewhere", goalDownP99S},
	{keyExclude64, "exclude → elsewhere\n64 tablets", goalExcludeP99S},
	{keyExclude256, "exclude → elsewhere\n256 tablets", goalExcludeP99S},
}

// rerouteCases returns the known reaction cases that were measured, then
// any other case with samples in the reaction files (a new benchmark case
// shows up without a change here, just without a goal).
func rerouteCases(r *results) []rerouteCase {
	var cases []rerouteCase
	known := map[string]bool{}
	for _, k := range knownReroutes {
		known[k.Key] = true
		if lc, ok := reactionCase(r, k.Key); ok && len(lc.Samples) > 0 {
			cases = append(cases, rerouteCase{latencyCase: lc, Label: k.Label, Goal: k.Goal})
		}
	}
	var others []string
	for _, name := range r.reactionFiles() {
		data := r.file(name).Data
		for key := range data {
			if c, ok := data.obj(key); ok && !known[key] {
				if samples, _, ok := caseTimings(c); ok && len(samples) > 0 {
					known[key] = true
					others = append(others, key)
				}
			}
		}
	}
	sort.Strings(others)
	for _, key := range others {
		if lc, ok := reactionCase(r, key); ok {
			cases = append(cases, rerouteCase{latencyCase: lc, Label: strings.ReplaceAll(key, "_", " ")})
		}
	}
	return cases
}

// rerouteChart draws one box of trial latencies per reaction case, marks
// each case's p99 (the figure judged), and draws the goals: 2 s across the
// plot, and 1 s over the POSITION_MISMATCH case, whose bound is tighter.
func rerouteChart(r *results) (*plot.Plot, error) {
	cases := rerouteCases(r)
	if len(cases) == 0 {
		return emptyPlot("Re-routing latency: not measured (" + reactionFile + ", " + reactionExcludeFile + ")"), nil
	}
	p := newChart("Re-routing latency per trial",
		"box: quartiles; whiskers: 1.5 × IQR; dots: trials beyond; × : p99", "seconds until records flow again")
	p.Legend.Top = true
	p.Legend.Left = true

	var names []string
	var p99s plotter.XYs
	lowest, highest := math.Inf(1), math.Inf(-1)
	for i, c := range cases {
		box, err := plotter.NewBoxPlot(vg.Points(40), float64(i), plotter.Values(c.Samples))
		if err != nil {
			return nil, err
		}
		box.FillColor = color.RGBA{R: 210, G: 225, B: 245, A: 255}
		p.Add(box)
		names = append(names, fmt.Sprintf("%s\n%d trials\n%s", c.Label, len(c.Samples), c.Source))
		p99s = append(p99s, plotter.XY{X: float64(i), Y: c.P99})
		for _, s := range c.Samples {
			lowest, highest = min(lowest, s), max(highest, s)
		}
	}
	p.NominalX(names...)

	marks, err := plotter.NewScatter(p99s)
	if err != nil {
		return nil, err
	}
	marks.GlyphStyle = draw.GlyphStyle{Color: color.Black, Radius: vg.Points(5), Shape: draw.CrossGlyph{}}
	p99Texts := make([]string, len(p99s))
	for i, xy := range p99s {
		p99Texts[i] = fixed(xy.Y, 3) + " s"
	}
	p99Labels, err := plotter.NewLabels(plotter.XYLabels{XYs: p99s, Labels: p99Texts})
	if err != nil {
		return nil, err
	}
	// Past the whisker caps, which are as wide as the box.
	p99Labels.Offset = vg.Point{X: vg.Points(24), Y: vg.Points(-4)}
	p.Add(marks, p99Labels)
	p.Legend.Add("p99", marks)

	if err := addRerouteGoals(p, cases); err != nil {
		return nil, err
	}

	// A log scale keeps sub-second cases readable beside ones taking tens
	// of seconds; it needs positive values, so zeros fall back to linear.
	lowest, highest = min(lowest, goalMismatchP99S), max(highest, goalExcludeP99S)
	if lowest > 0 {
		p.Y.Scale = plot.LogScale{}
		p.Y.Min, p.Y.Max = lowest/1.5, highest*1.5
		p.Y.Tick.Marker = logTicks(p.Y.Min, p.Y.Max)
	} else {
		p.Y.Min, p.Y.Max = 0, highest*1.1
	}
	return p, nil
}

// addRerouteGoals draws the 2 s goal across the plot and, for each case
// whose goal differs, a short dashed line at its own goal over its box.
func addRerouteGoals(p *plot.Plot, cases []rerouteCase) error {
	wide, err := goalLine(goalExcludeP99S, -0.5, float64(len(cases))-0.5)
	if err != nil {
		return err
	}
	p.Add(wide)
	p.Legend.Add(fmt.Sprintf("goal: p99 ≤ %v s (exclude, server down)", goalExcludeP99S), wide)
	for i, c := range cases {
		if c.Goal == 0 || c.Goal == goalExcludeP99S {
			continue
		}
		own, err := goalLine(c.Goal, float64(i)-0.4, float64(i)+0.4)
		if err != nil {
			return err
		}
		own.LineStyle.Color = color.RGBA{R: 230, G: 120, A: 255}
		p.Add(own)
		p.Legend.Add(fmt.Sprintf("goal: p99 ≤ %v s (%s)", c.Goal, strings.Split(c.Label, "\n")[0]), own)
	}
	return nil
}

// cpuPoint is one phase (bulk or live) of a throughput case: its record
// rate and the worker's CPU seconds per 1,000 records.
type cpuPoint struct {
	Phase          string
	Rate, CPUPer1k float64
}

// cpuCase is one throughput case's phases.
type cpuCase struct {
	Tablets float64 // 0 when the case does not say
	Points  []cpuPoint
}

// phaseShapes tells the phases apart on the plot; colours tell the cases
// apart when there are several.
var phaseShapes = map[string]draw.GlyphDrawer{"bulk": draw.CircleGlyph{}, "live": draw.TriangleGlyph{}}

// phasePoint returns a phase's point in a case. The rate is the phase's
// records over its seconds; when those are missing, the bulk phase falls
// back to tabletflow's end-to-end rate and the live phase to the rate the
// workload was asked for.
func phasePoint(c object, phase string) (cpuPoint, bool) {
	cpu, ok := cpuPer1k(c, phase)
	if !ok {
		return cpuPoint{}, false
	}
	rate, ok := phaseRate(objectAt(c, phase))
	if !ok {
		fallback := map[string]string{"bulk": "tabletflow_records_per_s", "live": "history_measure_records_per_s"}[phase]
		rate, ok = c.num(fallback)
	}
	if !ok || rate <= 0 {
		return cpuPoint{}, false
	}
	return cpuPoint{Phase: phase, Rate: rate, CPUPer1k: cpu}, true
}

// cpuCases collects the bulk and live points of every throughput case.
func cpuCases(r *results) []cpuCase {
	var cases []cpuCase
	for _, c := range throughputCases(r.file(throughputFile).Data) {
		var cc cpuCase
		cc.Tablets, _ = c.num("tablets")
		for _, phase := range []string{"bulk", "live"} {
			if pt, ok := phasePoint(c, phase); ok {
				cc.Points = append(cc.Points, pt)
			}
		}
		if len(cc.Points) > 0 {
			cases = append(cases, cc)
		}
	}
	return cases
}

// cpuChart draws worker CPU per 1,000 records against the record rate for
// the bulk and live phases, with the live goal (3 × the bulk figure).
func cpuChart(r *results) (*plot.Plot, error) {
	cases := cpuCases(r)
	if len(cases) == 0 {
		return emptyPlot("Worker CPU per 1,000 records: not measured (" + throughputFile + ")"), nil
	}
	p := newChart("Worker CPU per 1,000 records, bulk and live ("+throughputFile+")",
		"records/s", "worker CPU seconds per 1,000 records")
	p.Legend.Top = true

	lowRate, highRate, highCPU := math.Inf(1), math.Inf(-1), 0.0
	for i, cc := range cases {
		for _, pt := range cc.Points {
			lowRate, highRate, highCPU = min(lowRate, pt.Rate), max(highRate, pt.Rate), max(highCPU, pt.CPUPer1k)
			// One case: the phases differ in colour as well as shape, and
			// each point carries its figures. Several cases: a colour per
			// case, and the legend names them, since their bulk points
			// crowd together and labels would overlap.
			name, label, colorIndex := pt.Phase, true, i
			if len(cases) == 1 && pt.Phase == "live" {
				colorIndex = 1
			}
			if len(cases) > 1 {
				name, label = fmt.Sprintf("%s, %s tablets", pt.Phase, fixed(cc.Tablets, 0)), false
			}
			if err := addCPUPoint(p, name, pt, colorIndex, label); err != nil {
				return nil, err
			}
		}
	}
	bound, tablets, ok := liveCPUBound(cases)
	if ok {
		line, err := goalLine(bound, lowRate/2, highRate*5)
		if err != nil {
			return nil, err
		}
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("goal: live ≤ %v × bulk at %s tablets (%s s)", goalLiveCPUOverBulk, fixed(tablets, 0), fixed(bound, 4)), line)
		highCPU = max(highCPU, bound)
	}
	// Bulk and live rates differ by about two orders of magnitude: a log
	// scale shows both.
	p.X.Scale = plot.LogScale{}
	// Five times the highest rate leaves room for the points' labels,
	// which are written to their right.
	p.X.Min, p.X.Max = lowRate/2, highRate*5
	p.X.Tick.Marker = logTicks(p.X.Min, p.X.Max)
	p.Y.Min, p.Y.Max = 0, highCPU*1.25
	return p, nil
}

// liveCPUBound is the live goal's line: 3 × the bulk figure of the first
// case that has one, as liveCPURow judges the first case.
func liveCPUBound(cases []cpuCase) (bound, tablets float64, ok bool) {
	for _, cc := range cases {
		for _, pt := range cc.Points {
			if pt.Phase == "bulk" {
				return goalLiveCPUOverBulk * pt.CPUPer1k, cc.Tablets, true
			}
		}
	}
	return 0, 0, false
}

// addCPUPoint adds one point in the case's colour and the phase's shape,
// labelled with its figures when label is set.
func addCPUPoint(p *plot.Plot, name string, pt cpuPoint, colorIndex int, label bool) error {
	xys := plotter.XYs{{X: pt.Rate, Y: pt.CPUPer1k}}
	scatter, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	scatter.GlyphStyle = draw.GlyphStyle{Color: plotutil.Color(colorIndex), Radius: vg.Points(5), Shape: phaseShapes[pt.Phase]}
	p.Add(scatter)
	p.Legend.Add(name, scatter)
	if !label {
		return nil
	}
	// Short lines: a long label would push the plot's right edge in.
	text := fmt.Sprintf("%s s\nat %s records/s", fixed(pt.CPUPer1k, 4), fixed(pt.Rate, 0))
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: []string{text}})
	if err != nil {
		return err
	}
	labels.Offset = vg.Point{X: vg.Points(8), Y: vg.Points(-4)}
	p.Add(labels)
	return nil
}
