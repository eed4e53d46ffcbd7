package postgres

import "testing"

// widens accepts a type change only when every value of the old type is
// a value of the new one, unchanged.
func TestWidensOnlyWhenEveryValueFits(t *testing.T) {
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"integer", "integer", true},
		{"smallint", "integer", true},
		{"integer", "bigint", true},
		{"bigint", "numeric", true},
		{"bigint", "integer", false},
		{"numeric", "bigint", false},
		{"real", "double precision", true},
		{"double precision", "real", false},
		{"character varying(10)", "character varying(20)", true},
		{"character varying(20)", "character varying(10)", false},
		{"character varying(10)", "text", true},
		{"text", "character varying(10)", false},
		{"text", "character varying", true},
		{"numeric(10,2)", "numeric(12,2)", true},
		{"numeric(10,2)", "numeric(12,4)", true},
		{"numeric(12,2)", "numeric(12,3)", false},
		{"numeric(12,3)", "numeric(12,2)", false},
		{"numeric(10,2)", "numeric", true},
		{"numeric", "numeric(10,2)", false},
		{"integer", "numeric(12,2)", true},
		{"integer", "numeric(11,2)", false},
		{"bigint", "numeric(18,0)", false},
		{"bigint", "numeric(20,0)", true},
		{"date", "timestamp without time zone", false},
		{"text", "jsonb", false},
		{"integer", "text", false},
	} {
		if got := widens(c.from, c.to); got != c.want {
			t.Errorf("widens(%q, %q) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}
