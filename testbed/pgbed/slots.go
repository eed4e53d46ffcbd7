package pgbed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DropSlot drops a replication slot on the server at dsn, ending the
// session that reads it first and waiting for the session to let go of
// it (as a standby rebuilt, or an outage past max_slot_wal_keep_size,
// loses a slot). An absent slot is no error.
func DropSlot(ctx context.Context, dsn, slot string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot); err != nil {
			return false, fmt.Errorf("end the session of slot %s: %w", slot, err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE slot_name = $1 AND active_pid IS NULL`, slot); err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "55006" { // 55006: taken again meanwhile
				return false, fmt.Errorf("drop slot %s: %w", slot, err)
			}
		}
		var left bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&left)
		return err == nil && !left, err
	})
}
