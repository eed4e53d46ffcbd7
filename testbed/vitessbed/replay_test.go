package vitessbed_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

// rec is a record of the bed's tables; before and after are JSON images
// ("" for none).
func rec(term uint64, table string, op source.Op, before, after string) source.Record {
	r := source.Record{Tablet: "-80", Position: source.Checkpoint{Term: term}, Table: table, Op: op}
	if before != "" {
		r.Before = json.RawMessage(before)
	}
	if after != "" {
		r.After = json.RawMessage(after)
	}
	return r
}

func TestReplayRebuildsTheShardsRows(t *testing.T) {
	got, err := vitessbed.Replay([]source.Record{
		// A copied row, then rows inserted.
		rec(1, "customer", source.Read, "", `{"customer_id":1,"email":"a@x"}`),
		rec(2, "customer", source.Insert, "", `{"customer_id":2,"email":null}`),
		rec(3, "customer", source.Insert, "", `{"customer_id":3,"email":"c@x"}`),
		rec(4, "corder", source.Insert, "", `{"order_id":10,"customer_id":1,"sku":"s","price":5}`),
		// An update in place, and one that changed the key: the row at
		// before's key goes.
		rec(5, "customer", source.Update, `{"customer_id":1,"email":"a@x"}`, `{"customer_id":1,"email":"a2@x"}`),
		rec(6, "customer", source.Update, `{"customer_id":2,"email":null}`, `{"customer_id":20,"email":null}`),
		// A delete removes the row at before's key.
		rec(7, "customer", source.Delete, `{"customer_id":3,"email":"c@x"}`, ""),
	})
	require.NoError(t, err)
	require.Equal(t, map[string]vitessbed.Rows{
		"customer": {
			"1":  {"customer_id": int64(1), "email": "a2@x"},
			"20": {"customer_id": int64(20), "email": nil},
		},
		"corder": {"10": {"order_id": int64(10), "customer_id": int64(1), "sku": "s", "price": int64(5)}},
	}, got)
	require.Empty(t, vitessbed.Diff(got, got))

	// A truncate empties its table only.
	got, err = vitessbed.Replay([]source.Record{
		rec(1, "customer", source.Insert, "", `{"customer_id":1}`),
		rec(2, "corder", source.Insert, "", `{"order_id":10,"customer_id":1}`),
		rec(3, "customer", source.Truncate, "", ""),
	})
	require.NoError(t, err)
	require.Empty(t, got["customer"])
	require.Len(t, got["corder"], 1)
}

func TestReplayRefusesWhatItCannotApply(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    source.Record
		want string
	}{
		{"a table not of the bed", rec(1, "other", source.Insert, "", `{"id":1}`), `table "other"`},
		{"an unknown op", rec(1, "customer", source.Op("upsert"), "", `{"customer_id":1}`), `op "upsert"`},
		{"an image without its key", rec(1, "customer", source.Insert, "", `{"email":"a@x"}`), "without its key customer_id"},
		{"a delete without before", rec(1, "customer", source.Delete, "", ""), "without its key"},
		{"a number that is not an integer", rec(1, "corder", source.Insert, "", `{"order_id":1.5}`), "order_id"},
		{"a malformed image", rec(1, "customer", source.Insert, "", `{"customer_id":`), "after"},
	} {
		_, err := vitessbed.Replay([]source.Record{tc.r})
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

func TestDiffNamesTheFirstTableAndKeyThatDiffer(t *testing.T) {
	src := map[string]vitessbed.Rows{
		"customer": {"1": {"customer_id": int64(1), "email": "a"}, "2": {"customer_id": int64(2), "email": "b"}},
		"corder":   {},
	}
	require.Empty(t, vitessbed.Diff(src, src))
	changed := map[string]vitessbed.Rows{
		"customer": {"1": {"customer_id": int64(1), "email": "a"}, "2": {"customer_id": int64(2), "email": "B"}},
		"corder":   {},
	}
	require.Equal(t, "customer: 2 rows replayed, 2 in the source; key 2: source map[customer_id:2 email:b], replayed map[customer_id:2 email:B]",
		vitessbed.Diff(src, changed))
	extra := map[string]vitessbed.Rows{"customer": src["customer"], "corder": {"9": {"order_id": int64(9)}}}
	require.Equal(t, "corder: 1 rows replayed, 0 in the source; key 9 replayed, not in the source: map[order_id:9]",
		vitessbed.Diff(src, extra))
}
