package main

import (
	"math"
	"strconv"
	"strings"
)

// verdict is the outcome of one goal.
type verdict int

const (
	notMeasured verdict = iota
	met
	notMet
)

// String renders the verdict for the Markdown table; a miss is bold so it
// cannot be overlooked.
func (v verdict) String() string {
	switch v {
	case met:
		return "met"
	case notMet:
		return "**not met**"
	}
	return "not measured"
}

// The comparisons take the unrounded figures: a ratio of 0.899 against a
// bound of 0.9 is a miss even though it prints as 0.90 with two decimals.

func atLeast(value, bound float64) verdict {
	if math.IsNaN(value) {
		return notMeasured
	}
	if value >= bound {
		return met
	}
	return notMet
}

func atMost(value, bound float64) verdict {
	if math.IsNaN(value) {
		return notMeasured
	}
	if value <= bound {
		return met
	}
	return notMet
}

func lessThan(value, bound float64) verdict {
	if math.IsNaN(value) {
		return notMeasured
	}
	if value < bound {
		return met
	}
	return notMet
}

// near formats value with at least decimals decimals, adding more while the
// text would equal the bound's although the numbers differ. That way a miss
// just below a bound reads "0.899", not "0.90", and no one mistakes it for
// a pass. Integer parts get thousands separators.
func near(value, bound float64, decimals int) string {
	const maxDecimals = 9
	d := decimals
	for d < maxDecimals && value != bound &&
		strconv.FormatFloat(value, 'f', d, 64) == strconv.FormatFloat(bound, 'f', d, 64) {
		d++
	}
	return grouped(strconv.FormatFloat(value, 'f', d, 64))
}

// fixed formats value with the given decimals and thousands separators,
// for figures that are not compared against a bound.
func fixed(value float64, decimals int) string {
	return grouped(strconv.FormatFloat(value, 'f', decimals, 64))
}

// grouped inserts thousands separators into the integer part of a
// formatted number ("1203000.5" → "1,203,000.5").
func grouped(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, digit := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(digit)
	}
	if hasFrac {
		b.WriteString("." + frac)
	}
	return sign + b.String()
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
