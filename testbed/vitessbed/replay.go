package vitessbed

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed"
)

// Replay applies one shard's change records in order to empty tables, the
// proof that a stream's records rebuild the shard (ShardRows reads what
// they should give): an insert, update or read (a copied row) sets the row
// at its key (an update that changed the key removes the row at before's
// key first), a delete removes the row at before's key, a truncate empties
// the table. Values are as the bed reads them (DecodeRow): integers as
// int64, text as string, NULL as nil. A resync's begin marker empties
// every table (its copy brings the shard's rows again), its end marker
// changes nothing. It fails on a record of a table not
// among Tables, an unknown op, a row image without its key, or a malformed
// image.
func Replay(recs []source.Record) (map[string]Rows, error) {
	out := map[string]Rows{}
	for _, t := range Tables {
		out[t] = Rows{}
	}
	for _, r := range recs {
		switch r.Op {
		case source.ResyncBegin:
			for _, t := range Tables {
				out[t] = Rows{}
			}
			continue
		case source.ResyncEnd:
			continue
		}
		rows, ok := out[r.Table]
		if !ok {
			return nil, fmt.Errorf("%s: a record of table %q", r.Position, r.Table)
		}
		before, err := DecodeRow(r.Before)
		if err != nil {
			return nil, fmt.Errorf("%s: before: %w", r.Position, err)
		}
		after, err := DecodeRow(r.After)
		if err != nil {
			return nil, fmt.Errorf("%s: after: %w", r.Position, err)
		}
		switch r.Op {
		case source.Insert, source.Update, source.Read:
			if before != nil {
				k, err := keyOf(r, before)
				if err != nil {
					return nil, err
				}
				delete(rows, k)
			}
			k, err := keyOf(r, after)
			if err != nil {
				return nil, err
			}
			rows[k] = after
		case source.Delete:
			k, err := keyOf(r, before)
			if err != nil {
				return nil, err
			}
			delete(rows, k)
		case source.Truncate:
			out[r.Table] = Rows{}
		default:
			return nil, fmt.Errorf("%s: op %q", r.Position, r.Op)
		}
	}
	return out, nil
}

// keyOf is a row image's key as Rows holds it: its primary key column's
// value as decimal text.
func keyOf(r source.Record, row map[string]any) (string, error) {
	k, ok := row[PrimaryKeys[r.Table]]
	if !ok {
		return "", fmt.Errorf("%s: %s %s row without its key %s: %v", r.Position, r.Op, r.Table, PrimaryKeys[r.Table], row)
	}
	return fmt.Sprint(k), nil
}

// DecodeRow reads a record's row image as the bed reads rows: JSON numbers
// that are integers become int64 (any other number is an error: the bed's
// tables have none), strings stay strings, null is nil. A missing image
// (empty or null) is a nil row.
func DecodeRow(raw json.RawMessage) (map[string]any, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var row map[string]any
	if err := d.Decode(&row); err != nil {
		return nil, err
	}
	for k, v := range row {
		if n, ok := v.(json.Number); ok {
			i, err := n.Int64()
			if err != nil {
				return nil, fmt.Errorf("%s: %v", k, err)
			}
			row[k] = i
		}
	}
	return row, nil
}

// Diff compares replayed tables (got) with the source's (want), table by
// table in the order of Tables, and says where the first that differs
// does: its row counts and the first key (in key order) whose rows differ.
// It is "" when every table is equal.
func Diff(want, got map[string]Rows) string {
	for _, t := range Tables {
		w, g := want[t], got[t]
		if reflect.DeepEqual(w, g) {
			continue
		}
		d := fmt.Sprintf("%s: %d rows replayed, %d in the source", t, len(g), len(w))
		if k := testbed.FirstRowDifference(w, g); k != "" {
			d += "; " + k
		}
		return d
	}
	return ""
}
