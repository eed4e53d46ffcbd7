package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// dropSlots is `pgbed drop-slots`: it drops a stream's replication slot of
// one shard on every server of the shard (ending the session that reads
// it first), as a lost standby and an outage past max_slot_wal_keep_size
// would: the shard's tablet goes Expired, for the demo's resync.
func dropSlots(args []string) error {
	fs := flag.NewFlagSet("drop-slots", flag.ContinueOnError)
	envFile := fs.String("env", ".data/pg.env", "the bed's environment file (KEY=DSN lines)")
	stream := fs.String("stream", "pg-orders", "the stream")
	shard := fs.String("shard", "s1", "the shard")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := os.Open(*envFile)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	slot := postgres.SlotName(*stream, *shard)
	prefix := strings.ToUpper(*shard) + "_"
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, dsn, ok := strings.Cut(sc.Text(), "=")
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		found++
		if err := pgbed.DropSlot(ctx, dsn, slot); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Printf("dropped slot %s (%s)\n", slot, name)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if found == 0 {
		return fmt.Errorf("no server of shard %s in %s", *shard, *envFile)
	}
	return nil
}
