package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

// written is what the workload wrote.
type written struct {
	records uint64 // rows the transactions changed: the change records due
	txs     int
	// from and to are the shard's GTID position before the first
	// transaction and after the last ("MariaDB/0-100-57").
	from, to string
	took     time.Duration
}

// shardIDs returns n ids of customers (and their orders) that the
// VSchema's hash vindex places in shard, from 1 up: the backlog's rows
// are where vtgate would have put them.
func shardIDs(shard string, n int) []int64 {
	ids := make([]int64, 0, n)
	for id := int64(1); len(ids) < n; id++ {
		if vitessbed.ShardOf(id) == shard {
			ids = append(ids, id)
		}
	}
	return ids
}

// txsFor is how many transactions of the workload write about records
// row changes on writers connections (each writes 4 rows, and every
// eighth 5, once it has two transactions behind it).
func txsFor(records, writers int) int {
	return max(3, (records*8/33+writers-1)/writers)
}

// rowsOf is how many rows a writer's n transactions change: transaction
// k inserts a customer and an order, from k = 1 updates the previous
// customer, from k = 2 deletes the order of two transactions back, and
// every eighth deletes the customer of five back.
func rowsOf(n int) uint64 {
	var rows uint64
	for k := range n {
		rows += 2
		if k >= 1 {
			rows++
		}
		if k >= 2 {
			rows++
		}
		if k%8 == 7 {
			rows++
		}
	}
	return rows
}

// write runs the fixed workload on the shard's primary, straight into its
// MariaDB (as vt_dba, database vt_commerce): writers connections, each
// txs transactions sent as one multi-statement round trip, as fast as
// they go; then it waits for the replica to replay all of it. Writer w
// takes every writers-th of the shard's ids, so no key is reused and
// every update and delete finds its row.
func (b *bench) write(ctx context.Context, txs, writers int) (written, error) {
	p := b.bed.Primary(shardID)
	from, err := p.Position(ctx)
	if err != nil {
		return written{}, err
	}
	ids := shardIDs(shardID, txs*writers)
	db, err := multiStatementDB(p.MySQLSocket, writers)
	if err != nil {
		return written{}, err
	}
	defer db.Close()
	errs := make([]error, writers)
	began := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		mine := make([]int64, 0, txs)
		for i := w; i < len(ids); i += writers {
			mine = append(mine, ids[i])
		}
		wg.Go(func() { errs[w] = writeTxs(ctx, db, mine) })
	}
	wg.Wait()
	took := time.Since(began)
	if err := errors.Join(errs...); err != nil {
		return written{}, err
	}
	to, err := p.Position(ctx)
	if err != nil {
		return written{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := b.replica().WaitPosition(wctx, to); err != nil {
		return written{}, fmt.Errorf("%s replaying the workload: %w", b.replica().Alias, err)
	}
	return written{records: rowsOf(txs) * uint64(writers), txs: txs * writers, from: from, to: to, took: took}, nil
}

// multiStatementDB is a pool of conns connections to a tablet's MariaDB
// over its socket, as vt_dba in vt_commerce, that takes several
// statements in one Exec.
func multiStatementDB(socket string, conns int) (*sql.DB, error) {
	cfg := mysql.NewConfig()
	cfg.User = "vt_dba"
	cfg.Net = "unix"
	cfg.Addr = socket
	cfg.DBName = "vt_" + vitessbed.Keyspace
	cfg.MultiStatements = true
	cfg.Timeout = 10 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}

// writeTxs runs one transaction per id, in order: transaction k inserts
// customer ids[k] and its order, updates customer ids[k-1]'s email,
// deletes order ids[k-2], and every eighth also deletes customer
// ids[k-5] (updated for the last time four transactions before).
func writeTxs(ctx context.Context, db *sql.DB, ids []int64) error {
	var q strings.Builder
	for k, id := range ids {
		q.Reset()
		fmt.Fprintf(&q, "BEGIN;INSERT INTO customer (customer_id, email) VALUES (%d, 'c%d@example.com');", id, id)
		fmt.Fprintf(&q, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (%d, %d, 'sku-%d', %d);", id, id, k%1000, 100+k%100_000)
		if k >= 1 {
			fmt.Fprintf(&q, "UPDATE customer SET email = 'c%d-%d@example.org' WHERE customer_id = %d;", ids[k-1], k, ids[k-1])
		}
		if k >= 2 {
			fmt.Fprintf(&q, "DELETE FROM corder WHERE order_id = %d;", ids[k-2])
		}
		if k%8 == 7 {
			fmt.Fprintf(&q, "DELETE FROM customer WHERE customer_id = %d;", ids[k-5])
		}
		q.WriteString("COMMIT")
		if _, err := db.ExecContext(ctx, q.String()); err != nil {
			return fmt.Errorf("transaction %d (customer %d): %w", k, id, err)
		}
	}
	return nil
}
