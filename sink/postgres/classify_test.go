package postgres

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
)

// What a PostgreSQL error means for the tablet: the access refused →
// ErrDenied; a record its table cannot take → ErrBadRecord (both fail the
// tablet with the reason); anything retrying may cure → left as it is
// (SINK_IO, retried).
func TestClassifyTellsDeniedAndMisfitsFromTroubleThatMayPass(t *testing.T) {
	for _, tt := range []struct {
		code string
		want error // nil: left as it is
	}{
		{"28000", sink.ErrDenied}, // invalid authorization (no pg_hba.conf entry)
		{"28P01", sink.ErrDenied}, // wrong password
		{"42501", sink.ErrDenied}, // no privilege (CREATE, INSERT, …)

		{"23502", sink.ErrBadRecord}, // NOT NULL column given null
		{"23514", sink.ErrBadRecord}, // CHECK constraint
		{"22P02", sink.ErrBadRecord}, // invalid text for the column's type ("x" into integer)
		{"22003", sink.ErrBadRecord}, // number out of range for its column
		{"22007", sink.ErrBadRecord}, // invalid date or time
		{"22008", sink.ErrBadRecord}, // date or time out of range
		{"22001", sink.ErrBadRecord}, // too long for a varchar(n)
		{"22P05", sink.ErrBadRecord}, // \u0000 in JSON for a jsonb column
		{"22021", sink.ErrBadRecord}, // bytes not in the database's encoding
		{"22023", sink.ErrBadRecord}, // any other data exception
		{"42804", sink.ErrBadRecord}, // a column of another type than the value's
		{"42703", sink.ErrBadRecord}, // a column that is not there
		{"428C9", sink.ErrBadRecord}, // a value for a generated column
		{"54000", sink.ErrBadRecord}, // a key too large for its index's row

		{"57P01", nil}, // admin shutdown: the server restarting
		{"53300", nil}, // too many connections
		{"40001", nil}, // serialization failure
		{"40P01", nil}, // deadlock
		{"42P01", nil}, // a table dropped under the cache: made again by the next attempt
		{"23505", nil}, // unique violation: another tablet's rows may move out of the way
		{"23503", nil}, // foreign key: the parent row may be another tablet's, still to come
		{"42P07", nil}, // duplicate table (a race handled where it happens)
	} {
		t.Run(tt.code, func(t *testing.T) {
			pg := &pgconn.PgError{Code: tt.code, Message: "m"}
			err := classify(fmt.Errorf("commit: %w", pg))
			var got *pgconn.PgError
			require.ErrorAs(t, err, &got, "the PostgreSQL error stays in the chain")
			require.Contains(t, err.Error(), tt.code, "the reason names its SQLSTATE")
			for _, kind := range []error{sink.ErrDenied, sink.ErrBadRecord} {
				require.Equal(t, kind == tt.want, errors.Is(err, kind), "%s is %v: %v", tt.code, tt.want, err)
			}
		})
	}
	// Not a PostgreSQL error (the server unreachable): left as it is.
	require.Equal(t, io.ErrUnexpectedEOF, classify(io.ErrUnexpectedEOF))
}
