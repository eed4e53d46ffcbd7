package vitessbed

import (
	"bytes"
	"context"
	"crypto/des"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// PrimaryKeys are each table's primary key column.
var PrimaryKeys = map[string]string{"customer": "customer_id", "corder": "order_id"}

// Rows are a table's rows by primary key (as decimal text), each row column
// → value: bigint columns as int64, varchar as string, NULL as nil.
type Rows map[string]map[string]any

// DB is a connection pool to vtgate's MySQL protocol, in the keyspace:
// statements are routed by the VSchema as an application's are.
func (c *Cluster) DB() (*sql.DB, error) {
	c.dbOnce.Do(func() { c.db, c.dbErr = c.vtgateDB(Keyspace) })
	return c.db, c.dbErr
}

func (c *Cluster) vtgateDB(database string) (*sql.DB, error) {
	cfg := mysql.NewConfig()
	cfg.User = "vitessbed" // vtgate runs with --mysql-auth-server-impl none
	cfg.Net = "tcp"
	cfg.Addr = c.addr.VtgateMySQL
	cfg.DBName = database
	cfg.Timeout = 10 * time.Second
	cfg.InterpolateParams = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}

// Exec runs a statement through vtgate.
func (c *Cluster) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	db, err := c.DB()
	if err != nil {
		return nil, err
	}
	return db.ExecContext(ctx, query, args...)
}

// Query runs a query through vtgate; the caller closes the rows.
func (c *Cluster) Query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	db, err := c.DB()
	if err != nil {
		return nil, err
	}
	return db.QueryContext(ctx, query, args...)
}

// ShardRows reads every table of one shard through vtgate, from its primary
// (the session targets "commerce:<shard>"): what a replay of that shard's
// changes should equal once writes have stopped.
func (c *Cluster) ShardRows(ctx context.Context, shard string) (map[string]Rows, error) {
	// A connection of its own, closed after: a targeted session must not
	// go back to a pool.
	db, err := c.vtgateDB("")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("USE `%s:%s@primary`", Keyspace, shard)); err != nil {
		return nil, fmt.Errorf("vtgate: target %s/%s: %w", Keyspace, shard, err)
	}
	// OLAP: streamed, without the vttablet's row limit of an OLTP query
	// (10,000 rows by default).
	if _, err := conn.ExecContext(ctx, "SET workload = 'olap'"); err != nil {
		return nil, fmt.Errorf("vtgate: olap workload: %w", err)
	}
	return readTables(ctx, conn, "")
}

// readTables reads every table of Tables, names prefixed with prefix.
func readTables(ctx context.Context, conn *sql.Conn, prefix string) (map[string]Rows, error) {
	out := map[string]Rows{}
	for _, table := range Tables {
		rows, err := conn.QueryContext(ctx, "SELECT * FROM "+prefix+table)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", table, err)
		}
		got, err := scanRows(rows, PrimaryKeys[table])
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", table, err)
		}
		out[table] = got
	}
	return out, nil
}

func scanRows(rows *sql.Rows, key string) (Rows, error) {
	defer rows.Close()
	types, err := rows.ColumnTypes()
	if err != nil {
		return nil, err
	}
	out := Rows{}
	vals := make([]any, len(types))
	ptrs := make([]any, len(types))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := map[string]any{}
		for i, ct := range types {
			v, err := typed(vals[i], ct.DatabaseTypeName())
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", ct.Name(), err)
			}
			row[ct.Name()] = v
		}
		k, ok := row[key]
		if !ok {
			return nil, fmt.Errorf("no key column %s", key)
		}
		out[fmt.Sprint(k)] = row
	}
	return out, rows.Err()
}

// typed makes a text-protocol value (bytes) an int64 for integer columns, a
// string otherwise; NULL stays nil.
func typed(v any, dbType string) (any, error) {
	switch b := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		if strings.Contains(dbType, "INT") {
			return strconv.ParseInt(string(b), 10, 64)
		}
		return string(b), nil
	case int64:
		return b, nil
	default:
		return fmt.Sprint(b), nil
	}
}

// ShardOf is the shard of Shards holding a customer_id (ShardAmong).
func ShardOf(customerID int64) string { return ShardAmong(customerID, Shards) }

// ShardAmong is the shard of shards holding a customer_id, as the VSchema's
// hash vindex places it: the keyspace ID is the id, 8 bytes big-endian,
// encrypted with DES under an all-zero key, and each shard holds a range of
// keyspace IDs ("-80": below 0x80…, "80-": from it). The shards need not
// be Shards (a Reshard's new shards, say); "" if none of them covers it.
func ShardAmong(customerID int64, shards []string) string {
	block, _ := des.NewCipher(make([]byte, 8)) // a key of 8 bytes cannot fail
	var in, ksid [8]byte
	binary.BigEndian.PutUint64(in[:], uint64(customerID))
	block.Encrypt(ksid[:], in[:])
	for _, shard := range shards {
		lo, hi, err := keyRange(shard)
		if err != nil {
			continue
		}
		if bytes.Compare(ksid[:], lo) >= 0 && (len(hi) == 0 || bytes.Compare(ksid[:], hi) < 0) {
			return shard
		}
	}
	return ""
}

// keyRange is a shard name's key range: from lo (included) to hi (excluded;
// empty: the end).
func keyRange(shard string) (lo, hi []byte, err error) {
	start, end, ok := strings.Cut(shard, "-")
	if !ok {
		return nil, nil, fmt.Errorf("shard %q: not a key range such as 40-80", shard)
	}
	lo, err1 := hex.DecodeString(start)
	hi, err2 := hex.DecodeString(end)
	if err := errors.Join(err1, err2); err != nil {
		return nil, nil, fmt.Errorf("shard %q: not a key range such as 40-80: %w", shard, err)
	}
	if len(hi) > 0 && bytes.Compare(lo, hi) >= 0 {
		return nil, nil, fmt.Errorf("shard %q: its range ends before it begins", shard)
	}
	return lo, hi, nil
}

// httpGet fetches url and returns its body, an error unless 200.
func httpGet(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}
