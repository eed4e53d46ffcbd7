package vitessbed

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Tablet is one tablet of the bed: a vttablet over its own MariaDB.
type Tablet struct {
	TabletAddress

	c           *Cluster
	vttablet    *server
	mysqldGroup int // the process group of mysqlctl init: mysqld_safe and mariadbd

	dbOnce sync.Once
	db     *sql.DB
	dbErr  error
}

// dir is the tablet's directory, where mysqlctl keeps its MariaDB.
func (t *Tablet) dir() string { return filepath.Join(t.c.Dir, fmt.Sprintf("vt_%010d", t.UID)) }

func (t *Tablet) mysqlctlLog() string {
	return filepath.Join(t.c.Dir, fmt.Sprintf("mysqlctl-%010d.log", t.UID))
}

// VttabletLog is the path of the vttablet's log.
func (t *Tablet) VttabletLog() string { return t.vttablet.log }

// initMysqld runs mysqlctl init: a data directory, my.cnf (Vitess's
// MariaDB settings plus the bed's extra.cnf), MariaDB started under
// mysqld_safe, then the bed's init_db.sql (Vitess's users).
func (t *Tablet) initMysqld(ctx context.Context) error {
	cmd := t.c.command(ctx, filepath.Join(t.c.bin.Vitess, "mysqlctl"),
		"--tablet-uid", strconv.FormatUint(uint64(t.UID), 10), "--mysql-port", strconv.Itoa(t.MySQLPort),
		"--config-file-not-found-handling", "ignore", "--log-format", "text",
		"init", "--init-db-sql-file", filepath.Join(t.c.Dir, "init_db.sql"))
	_, err := runCmd(cmd, t.mysqlctlLog())
	if cmd.Process != nil {
		t.mysqldGroup = cmd.Process.Pid
	}
	if err != nil {
		return fmt.Errorf("%s: %w", t.Alias, err)
	}
	return nil
}

// stopMysqld shuts MariaDB down with mysqlctl shutdown and then makes sure
// nothing of its process group is left (killing what is).
func (t *Tablet) stopMysqld() error {
	if t.mysqldGroup == 0 {
		return nil
	}
	var errs []error
	if t.db != nil {
		errs = append(errs, t.db.Close())
	}
	if pgroupAlive(t.mysqldGroup) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, err := t.c.run(ctx, t.mysqlctlLog(), filepath.Join(t.c.bin.Vitess, "mysqlctl"),
			"--tablet-uid", strconv.FormatUint(uint64(t.UID), 10),
			"--config-file-not-found-handling", "ignore", "--log-format", "text", "shutdown")
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.Alias, err))
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for pgroupAlive(t.mysqldGroup) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if pgroupAlive(t.mysqldGroup) {
		errs = append(errs, fmt.Errorf("%s: MariaDB still running after mysqlctl shutdown: killed", t.Alias))
		_ = syscall.Kill(-t.mysqldGroup, syscall.SIGKILL)
		for pgroupAlive(t.mysqldGroup) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// startVttablet starts the vttablet (as a replica; the primaries are made by
// PlannedReparentShard).
func (t *Tablet) startVttablet() error {
	if t.vttablet == nil {
		t.vttablet = &server{name: "vttablet " + t.Alias, log: filepath.Join(t.c.Dir, fmt.Sprintf("vttablet-%010d.log", t.UID)),
			bin: filepath.Join(t.c.bin.Vitess, "vttablet"),
			args: append(t.c.topoFlags(),
				"--tablet-path", t.Alias, "--tablet-hostname", "127.0.0.1",
				"--init-keyspace", Keyspace, "--init-shard", t.Shard, "--init-tablet-type", "replica",
				"--port", port(t.HTTP), "--bind-address", "127.0.0.1",
				"--grpc-port", port(t.GRPC), "--grpc-bind-address", "127.0.0.1",
				"--service-map", "grpc-queryservice,grpc-tabletmanager,grpc-updatestream",
				"--health-check-interval", "1s",
				"--pid-file", filepath.Join(t.c.Dir, fmt.Sprintf("vttablet-%010d.pid", t.UID)),
				"--config-file-not-found-handling", "ignore", "--log-format", "text")}
	}
	return t.c.start(t.vttablet)
}

// restartArgs are what a replica's vttablet is restarted with. A vttablet
// starting in a shard that has a primary points its MariaDB at it after an
// errant-GTID check that cannot pass on MariaDB (it parses the primary's
// server_uuid, which MariaDB has not), and exits. With
// --restore-from-backup it looks for data first, finds the tablet's, takes
// the start for a restart ("mysqld already contains data") and leaves
// replication as it is: still attached, as the bed set it up. (No backup
// is ever taken or restored.)
func (t *Tablet) restartArgs() []string {
	if t.Type != "REPLICA" || slices.Contains(t.vttablet.args, "--restore-from-backup") {
		return nil
	}
	return []string{"--restore-from-backup", "--backup-storage-implementation", "file",
		"--file-backup-storage-root", filepath.Join(t.c.Dir, "backups")}
}

// Kill ends the vttablet with SIGKILL, as a crash would; its MariaDB keeps
// running (and replicating). It returns once the process is gone.
func (t *Tablet) Kill() { t.vttablet.kill() }

// Restart starts a killed or stopped vttablet again with the same ports and
// waits until it serves as before. A running one is left as is.
func (t *Tablet) Restart(ctx context.Context) error {
	t.vttablet.mu.Lock()
	t.vttablet.args = append(t.vttablet.args, t.restartArgs()...)
	t.vttablet.mu.Unlock()
	if err := t.startVttablet(); err != nil {
		return err
	}
	return t.waitState(ctx, t.Type, "SERVING")
}

// Running reports whether the vttablet's process is up.
func (t *Tablet) Running() bool { return t.vttablet != nil && t.vttablet.running() }

// Pid is the vttablet's process ID (0 when it is not running).
func (t *Tablet) Pid() int { return t.vttablet.pid() }

// Vars are the few of a vttablet's /debug/vars the bed reads.
type Vars struct {
	// TabletType is the tablet manager's type, lower case ("replica").
	TabletType string
	// TabletStateName is the query service's state: "SERVING" or
	// "NOT_SERVING".
	TabletStateName string
	// VStreamersCreated counts the VStreams the tablet served.
	VStreamersCreated int64
}

// Vars reads the vttablet's /debug/vars.
func (t *Tablet) Vars(ctx context.Context) (Vars, error) { return t.vars(ctx) }

func (t *Tablet) vars(ctx context.Context) (Vars, error) {
	var v Vars
	b, err := httpGet(ctx, "http://"+t.HTTP+"/debug/vars")
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("%s: /debug/vars: %w", t.Alias, err)
	}
	return v, nil
}

// waitState waits until the vttablet reports the type (any case) and state.
func (t *Tablet) waitState(ctx context.Context, typ, state string) error {
	var v Vars
	err := poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if !t.vttablet.running() {
			return false, permanent(errors.New("vttablet exited"))
		}
		var err error
		v, err = t.vars(ctx)
		return err == nil && strings.EqualFold(v.TabletType, typ) && v.TabletStateName == state, err
	})
	if err != nil {
		return fmt.Errorf("%s: want %s %s, saw %q %q: %w", t.Alias, typ, state, v.TabletType, v.TabletStateName, err)
	}
	return nil
}

// DB is a connection pool to the tablet's MariaDB as vt_dba (all
// privileges) over its socket, database vt_commerce not selected.
func (t *Tablet) DB() (*sql.DB, error) {
	t.dbOnce.Do(func() {
		cfg := mysql.NewConfig()
		cfg.User = "vt_dba"
		cfg.Net = "unix"
		cfg.Addr = t.MySQLSocket
		cfg.Timeout = 10 * time.Second
		cfg.InterpolateParams = true
		var conn driver.Connector
		conn, t.dbErr = mysql.NewConnector(cfg)
		if t.dbErr == nil {
			t.db = sql.OpenDB(conn)
			t.db.SetMaxIdleConns(2)
		}
	})
	return t.db, t.dbErr
}

// exec runs statements one by one on one connection of the tablet's
// MariaDB.
func (t *Tablet) exec(ctx context.Context, stmts ...string) error {
	db, err := t.DB()
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", t.Alias, err)
	}
	defer conn.Close()
	for _, s := range stmts {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %s: %w", t.Alias, s, err)
		}
	}
	return nil
}

// attachTo points the replica's MariaDB at the primary's, by GTID from
// where it is (slave_pos), and starts replication.
func (t *Tablet) attachTo(ctx context.Context, primary *Tablet) error {
	return t.exec(ctx,
		"STOP SLAVE",
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%d, MASTER_USER='vt_repl', "+
			"MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1", primary.MySQLPort),
		"START SLAVE")
}

// StopReplication stops the replica's replication (STOP SLAVE): it falls
// behind its primary, and answers a VStream from a later position with
// GTIDSet Mismatch, until StartReplication.
func (t *Tablet) StopReplication(ctx context.Context) error {
	if t.Type != "REPLICA" {
		return fmt.Errorf("%s is not a replica", t.Alias)
	}
	return t.exec(ctx, "STOP SLAVE")
}

// StartReplication starts the replica's replication again (START SLAVE); it
// catches up from where it stopped. WaitCaughtUp waits for that.
func (t *Tablet) StartReplication(ctx context.Context) error {
	if t.Type != "REPLICA" {
		return fmt.Errorf("%s is not a replica", t.Alias)
	}
	return t.exec(ctx, "START SLAVE")
}

// ReplicationStatus is a replica's SHOW SLAVE STATUS, in part.
type ReplicationStatus struct {
	IORunning, SQLRunning bool
	LastIOError           string
	LastSQLError          string
	// GTIDIOPos is the GTID position the replica has received to.
	GTIDIOPos string
}

// Replication reads the replica's SHOW SLAVE STATUS.
func (t *Tablet) Replication(ctx context.Context) (ReplicationStatus, error) {
	var st ReplicationStatus
	db, err := t.DB()
	if err != nil {
		return st, err
	}
	rows, err := db.QueryContext(ctx, "SHOW SLAVE STATUS")
	if err != nil {
		return st, fmt.Errorf("%s: %w", t.Alias, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return st, err
	}
	if !rows.Next() {
		return st, fmt.Errorf("%s: no replication configured", t.Alias)
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return st, err
	}
	for i, c := range cols {
		switch c {
		case "Slave_IO_Running":
			st.IORunning = vals[i].String == "Yes"
		case "Slave_SQL_Running":
			st.SQLRunning = vals[i].String == "Yes"
		case "Last_IO_Error":
			st.LastIOError = vals[i].String
		case "Last_SQL_Error":
			st.LastSQLError = vals[i].String
		case "Gtid_IO_Pos":
			st.GTIDIOPos = vals[i].String
		}
	}
	return st, rows.Err()
}

// Position is the tablet's GTID position as Vitess encodes it
// ("MariaDB/0-100-57"): the end of its binary log (@@gtid_binlog_pos, a
// replica's included: it logs what it replays), which is what its
// VStream compares a requested position with.
func (t *Tablet) Position(ctx context.Context) (string, error) {
	db, err := t.DB()
	if err != nil {
		return "", err
	}
	var pos string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_binlog_pos").Scan(&pos); err != nil {
		return "", fmt.Errorf("%s: %w", t.Alias, err)
	}
	return "MariaDB/" + pos, nil
}

// WaitCaughtUp waits until the replica has replayed everything its primary
// had written when called (MASTER_GTID_WAIT on the primary's
// @@gtid_binlog_pos). A replica whose replication is stopped does not catch
// up: it waits for ctx.
func (t *Tablet) WaitCaughtUp(ctx context.Context) error {
	p := t.c.Primary(t.Shard)
	if p == nil || p == t {
		return fmt.Errorf("%s is not a replica", t.Alias)
	}
	want, err := p.Position(ctx)
	if err != nil {
		return err
	}
	return t.WaitPosition(ctx, want)
}

// WaitPosition waits until the tablet's MariaDB has replayed pos
// ("MariaDB/0-100-57" or "0-100-57").
func (t *Tablet) WaitPosition(ctx context.Context, pos string) error {
	pos = strings.TrimPrefix(pos, "MariaDB/")
	if pos == "" {
		return nil
	}
	db, err := t.DB()
	if err != nil {
		return err
	}
	err = poll(ctx, 0, func() (bool, error) {
		var r int
		// One second at a time, so ctx is looked at between waits.
		if err := db.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, 1)", pos).Scan(&r); err != nil {
			return false, err
		}
		return r == 0, nil
	})
	if err != nil {
		st, _ := t.Replication(context.Background())
		have, _ := t.Position(context.Background())
		return fmt.Errorf("%s: not at %s (at %s; replication io %v sql %v %s%s): %w",
			t.Alias, pos, have, st.IORunning, st.SQLRunning, st.LastIOError, st.LastSQLError, err)
	}
	return nil
}

// Rows reads every table of the tablet's MariaDB directly (not through
// vtgate), keyed like Cluster.ShardRows.
func (t *Tablet) Rows(ctx context.Context) (map[string]Rows, error) {
	db, err := t.DB()
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return readTables(ctx, conn, "vt_"+Keyspace+".")
}

// PurgeBinlogs makes the tablet's binary logs begin past pos: it starts a
// new binary log file (FLUSH BINARY LOGS) and purges every older one
// (PURGE BINARY LOGS TO). A VStream asking this tablet for pos, or anything
// before, then fails with MySQL error 1236 (the binary logs holding it are
// gone). It returns the position the remaining logs begin at, and an error
// if that is not past pos: the tablet must have written (or, a replica,
// replayed) a transaction after pos first. A file a reader still holds
// open is not purged; PurgeBinlogs then reports that as not past pos.
func (t *Tablet) PurgeBinlogs(ctx context.Context, pos string) (string, error) {
	want, err := parseGTIDs(strings.TrimPrefix(pos, "MariaDB/"))
	if err != nil {
		return "", err
	}
	db, err := t.DB()
	if err != nil {
		return "", err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "FLUSH BINARY LOGS"); err != nil {
		return "", fmt.Errorf("%s: %w", t.Alias, err)
	}
	var file string
	var offset, doDB, ignoreDB any
	if err := conn.QueryRowContext(ctx, "SHOW MASTER STATUS").Scan(&file, &offset, &doDB, &ignoreDB); err != nil {
		return "", fmt.Errorf("%s: SHOW MASTER STATUS: %w", t.Alias, err)
	}
	// MariaDB keeps a file until InnoDB has made its commits durable (its
	// binlog checkpoint, within a second here: innodb_flush_log_at_trx_commit
	// is 0), and purges silently up to the first file it still needs: purge
	// until the files are gone, for up to 10 s.
	var first gtidSet
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = poll(wctx, 100*time.Millisecond, func() (bool, error) {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("PURGE BINARY LOGS TO '%s'", file)); err != nil {
			return false, permanent(fmt.Errorf("%s: %w", t.Alias, err))
		}
		var name string
		name, first, err = t.firstBinlog(ctx, conn)
		if err != nil {
			return false, permanent(err)
		}
		return name == file, nil
	})
	begins := "MariaDB/" + first.String()
	if err != nil {
		return begins, fmt.Errorf("%s: purge the binary logs before %s: %w", t.Alias, file, err)
	}
	if !first.after(want) {
		return begins, fmt.Errorf("%s: its binary logs begin at %s, not past %s", t.Alias, begins, pos)
	}
	return begins, nil
}

// firstBinlog is the oldest binary log file and the GTID state it begins
// at: its Gtid_list event.
func (t *Tablet) firstBinlog(ctx context.Context, conn *sql.Conn) (string, gtidSet, error) {
	rows, err := conn.QueryContext(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", t.Alias, err)
	}
	var first string
	for rows.Next() {
		cols, _ := rows.Columns()
		vals := make([]any, len(cols))
		var name string
		vals[0] = &name
		for i := 1; i < len(cols); i++ {
			vals[i] = new(any)
		}
		if err := rows.Scan(vals...); err != nil {
			rows.Close()
			return "", nil, err
		}
		if first == "" {
			first = name
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", nil, err
	}
	ev, err := conn.QueryContext(ctx, fmt.Sprintf("SHOW BINLOG EVENTS IN '%s' LIMIT 5", first))
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", t.Alias, err)
	}
	defer ev.Close()
	for ev.Next() {
		var logName, eventType, info string
		var pos, serverID, endPos any
		if err := ev.Scan(&logName, &pos, &eventType, &serverID, &endPos, &info); err != nil {
			return "", nil, err
		}
		if eventType == "Gtid_list" {
			set, err := parseGTIDs(strings.Trim(info, "[]"))
			return first, set, err
		}
	}
	if err := ev.Err(); err != nil {
		return "", nil, err
	}
	return "", nil, fmt.Errorf("%s: no Gtid_list event at the start of %s", t.Alias, first)
}

// gtidSet is a MariaDB GTID position: per replication domain, its last
// sequence number (the server ID does not order).
type gtidSet map[uint32]gtid

type gtid struct {
	server uint32
	seq    uint64
}

// parseGTIDs reads "0-100-57,1-200-3" (empty: no GTID).
func parseGTIDs(s string) (gtidSet, error) {
	out := gtidSet{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, "-")
		if len(f) != 3 {
			return nil, fmt.Errorf("bad MariaDB GTID %q", part)
		}
		d, err1 := strconv.ParseUint(f[0], 10, 32)
		sv, err2 := strconv.ParseUint(f[1], 10, 32)
		seq, err3 := strconv.ParseUint(f[2], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("bad MariaDB GTID %q: %w", part, err)
		}
		out[uint32(d)] = gtid{server: uint32(sv), seq: seq}
	}
	return out, nil
}

func (s gtidSet) String() string {
	var parts []string
	for d, g := range s {
		parts = append(parts, fmt.Sprintf("%d-%d-%d", d, g.server, g.seq))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// after reports whether s is past o: at least o's sequence in each of o's
// domains, and beyond it in one. A client at o then needs a transaction
// from before s.
func (s gtidSet) after(o gtidSet) bool {
	beyond := false
	for d, g := range o {
		mine, ok := s[d]
		if !ok || mine.seq < g.seq {
			return false
		}
		if mine.seq > g.seq {
			beyond = true
		}
	}
	return beyond || (len(o) == 0 && len(s) > 0)
}

// groupPids are the live processes of a process group.
func groupPids(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) >= 3 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}
