package vitessbed

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Cluster is a running bed.
type Cluster struct {
	// Dir holds the bed's data and logs.
	Dir string

	bin     Binaries
	as      runAs
	opts    Options
	ownsDir bool
	addr    Addresses

	etcd, vtctld, vtgate *server
	tablets              []*Tablet

	dbOnce sync.Once
	db     *sql.DB // vtgate's MySQL protocol
	dbErr  error
}

// Addresses are where the bed's servers listen, all on 127.0.0.1.
type Addresses struct {
	// Etcd is the topology server's client address (host:port); the global
	// topology's root is /vitess/global, each cell's /vitess/<cell>.
	Etcd string
	// Vtctld is vtctld's gRPC address (vtctldclient --server, the
	// VtctldService API); VtctldHTTP its web port.
	Vtctld, VtctldHTTP string
	// VtgateMySQL is vtgate's MySQL protocol address (any user, no
	// password); VtgateGRPC its gRPC (the Vitess service); VtgateHTTP its
	// web port.
	VtgateMySQL, VtgateGRPC, VtgateHTTP string
	// Tablets are every tablet, shard by shard, each shard's primary first.
	Tablets []TabletAddress
}

// TabletAddress is where a tablet is.
type TabletAddress struct {
	// Alias is the tablet alias as Vitess prints it: "zone2-0000000101".
	Alias string
	// UID is the alias's number (101).
	UID uint32
	// Cell is the alias's cell ("zone2").
	Cell string
	// Shard is the tablet's shard ("-80").
	Shard string
	// Type is the type the bed gave it: "PRIMARY" or "REPLICA".
	Type string
	// GRPC is the vttablet's gRPC address (the queryservice, with VStream
	// and StreamHealth, and the tablet manager); HTTP its web port
	// (/debug/vars, /debug/status).
	GRPC, HTTP string
	// MySQLPort is its MariaDB's TCP port, MySQLSocket its socket.
	MySQLPort   int
	MySQLSocket string
}

// Addresses returns where everything listens.
func (c *Cluster) Addresses() Addresses {
	a := c.addr
	a.Tablets = nil
	for _, t := range c.tablets {
		a.Tablets = append(a.Tablets, t.TabletAddress)
	}
	return a
}

// Tablets are every tablet, shard by shard, each shard's primary first.
func (c *Cluster) Tablets() []*Tablet { return c.tablets }

// Tablet returns the tablet with the alias ("zone2-0000000101"), or nil.
func (c *Cluster) Tablet(alias string) *Tablet {
	for _, t := range c.tablets {
		if t.Alias == alias {
			return t
		}
	}
	return nil
}

// Primary returns a shard's primary tablet.
func (c *Cluster) Primary(shard string) *Tablet {
	for _, t := range c.tablets {
		if t.Shard == shard && t.Type == "PRIMARY" {
			return t
		}
	}
	return nil
}

// Replicas returns a shard's replicas, in cell order.
func (c *Cluster) Replicas(shard string) []*Tablet {
	var out []*Tablet
	for _, t := range c.tablets {
		if t.Shard == shard && t.Type == "REPLICA" {
			out = append(out, t)
		}
	}
	return out
}

// topoFlags are the flags every Vitess server needs to reach the topology.
func (c *Cluster) topoFlags() []string {
	return []string{"--topo-implementation", "etcd2", "--topo-global-server-address", c.addr.Etcd,
		"--topo-global-root", "/vitess/global"}
}

// Start sets a bed up and returns once vtgate answers queries on both shards
// and every replica replicates. On an error what was started is stopped, and
// the error carries the end of the failing step's logs.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	opts.User = cmp.Or(opts.User, "mysql")
	if opts.Bin == nil {
		b, err := Bin()
		if err != nil {
			return nil, err
		}
		opts.Bin = &b
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	as, err := lookupRunAs(opts.User)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: opts.Dir, bin: *opts.Bin, as: as, opts: opts}
	if c.Dir == "" {
		// Short: a MariaDB socket's path must fit in 108 bytes.
		if c.Dir, err = os.MkdirTemp("", "vitessbed-"); err != nil {
			return nil, err
		}
		c.ownsDir = true
	}
	if err := c.setUp(ctx); err != nil {
		err = fmt.Errorf("%w\n%s", err, c.Tails())
		if serr := c.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, err
	}
	return c, nil
}

// setUp runs the steps in order, each logged with its duration.
func (c *Cluster) setUp(ctx context.Context) error {
	begin := time.Now()
	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"directories and ports", c.prepare},
		{"etcd and the cells", c.startTopo},
		{"vtctld and the keyspace", c.startVtctld},
		{"MariaDB of every tablet (mysqlctl init)", c.initMysqlds},
		{"vttablets", c.startTablets},
		{"primaries (PlannedReparentShard)", c.promotePrimaries},
		{"replicas attached by hand", c.attachReplicas},
		{"schema and vschema", c.applySchema},
		{"vtgate", c.startVtgate},
		{"every tablet serving", c.WaitServing},
	}
	for _, s := range steps {
		t0 := time.Now()
		if err := s.f(ctx); err != nil {
			return fmt.Errorf("vitessbed: %s: %w", s.name, err)
		}
		c.opts.Log("vitessbed: %s: %.1fs", s.name, time.Since(t0).Seconds())
	}
	c.opts.Log("vitessbed: up in %.1fs in %s", time.Since(begin).Seconds(), c.Dir)
	return nil
}

// prepare makes the bed's directory the user's, picks the ports and names
// the tablets.
func (c *Cluster) prepare(context.Context) error {
	var err error
	if c.Dir, err = filepath.Abs(c.Dir); err != nil {
		return err
	}
	for _, d := range []string{c.Dir, filepath.Join(c.Dir, "home"), filepath.Join(c.Dir, "tmp"), filepath.Join(c.Dir, "etcd")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := c.as.chown(d); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "extra.cnf"), []byte(extraCnf), 0o644); err != nil {
		return err
	}
	initDB, err := os.ReadFile(c.bin.InitDB)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "init_db.sql"), initDB, 0o644); err != nil {
		return err
	}
	if c.bin.Vitess, err = c.as.reachable(c.bin.Vitess, VitessCommands); err != nil {
		return err
	}
	if c.bin.Etcd, err = c.as.reachable(c.bin.Etcd, []string{"etcd"}); err != nil {
		return err
	}
	perTablet := 3
	ports, err := freePorts(7 + perTablet*len(Shards)*len(Cells))
	if err != nil {
		return err
	}
	next := func() int { p := ports[0]; ports = ports[1:]; return p }
	hostPort := func() string { return fmt.Sprintf("127.0.0.1:%d", next()) }
	c.addr = Addresses{Etcd: hostPort(), Vtctld: hostPort(), VtctldHTTP: hostPort(),
		VtgateMySQL: hostPort(), VtgateGRPC: hostPort(), VtgateHTTP: hostPort()}
	etcdPeer := hostPort()
	c.etcd = &server{name: "etcd", log: filepath.Join(c.Dir, "etcd.log"), bin: filepath.Join(c.bin.Etcd, "etcd"),
		args: []string{"--name", "vitessbed", "--data-dir", filepath.Join(c.Dir, "etcd"),
			"--listen-client-urls", "http://" + c.addr.Etcd, "--advertise-client-urls", "http://" + c.addr.Etcd,
			"--listen-peer-urls", "http://" + etcdPeer, "--initial-advertise-peer-urls", "http://" + etcdPeer,
			"--initial-cluster", "vitessbed=http://" + etcdPeer, "--log-level", "warn"}}
	for i, shard := range Shards {
		for j, cell := range Cells {
			uid := uint32(100*(i+1) + j)
			typ := "REPLICA"
			if cell == PrimaryCell {
				typ = "PRIMARY"
			}
			t := &Tablet{c: c, TabletAddress: TabletAddress{
				Alias: fmt.Sprintf("%s-%010d", cell, uid), UID: uid, Cell: cell, Shard: shard, Type: typ,
				GRPC: hostPort(), HTTP: hostPort(), MySQLPort: next(),
			}}
			t.MySQLSocket = filepath.Join(t.dir(), "mysql.sock")
			c.tablets = append(c.tablets, t)
		}
	}
	return nil
}

// extraCnf is added to every tablet's my.cnf (EXTRA_MY_CNF): loopback
// only, small and fast rather than durable (a test bed), and
// super-read-only as a loose
// option: MariaDB has no such variable and refuses unknown options, and
// Vitess's own test settings name it plainly.
const extraCnf = `# vitessbed
bind-address = 127.0.0.1
innodb_buffer_pool_size = 32M
innodb_log_buffer_size = 1M
innodb_log_file_size = 16M
innodb_flush_log_at_trx_commit = 0
innodb_doublewrite = 0
innodb_use_native_aio = 0
key_buffer_size = 2M
sync_binlog = 0
max_connections = 200
performance_schema = OFF
loose-super-read-only = false
# a replica notices a dead primary connection within seconds
slave_net_timeout = 4
`

// startTopo starts etcd and adds the cells to the global topology.
func (c *Cluster) startTopo(ctx context.Context) error {
	if err := c.start(c.etcd); err != nil {
		return err
	}
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if !c.etcd.running() {
			return false, permanent(errors.New("etcd exited"))
		}
		b, err := httpGet(ctx, "http://"+c.addr.Etcd+"/health")
		return err == nil && strings.Contains(string(b), `"health":"true"`), err
	})
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	for _, cell := range Cells {
		_, err := c.run(ctx, filepath.Join(c.Dir, "vtctldclient.log"), filepath.Join(c.bin.Vitess, "vtctldclient"),
			append(append([]string{"--server", "internal"}, c.topoFlags()...),
				"AddCellInfo", "--root", "/vitess/"+cell, "--server-address", c.addr.Etcd, cell)...)
		if err != nil {
			return err
		}
	}
	return nil
}

// startVtctld starts vtctld and creates the keyspace.
func (c *Cluster) startVtctld(ctx context.Context) error {
	c.vtctld = &server{name: "vtctld", log: filepath.Join(c.Dir, "vtctld.log"), bin: filepath.Join(c.bin.Vitess, "vtctld"),
		args: append(c.topoFlags(),
			"--service-map", "grpc-vtctl,grpc-vtctld",
			"--port", port(c.addr.VtctldHTTP), "--bind-address", "127.0.0.1",
			"--grpc-port", port(c.addr.Vtctld), "--grpc-bind-address", "127.0.0.1",
			"--pid-file", filepath.Join(c.Dir, "vtctld.pid"),
			"--config-file-not-found-handling", "ignore", "--log-format", "text")}
	if err := c.start(c.vtctld); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, c.vtctld, "http://"+c.addr.VtctldHTTP+"/debug/status"); err != nil {
		return err
	}
	// vtctld's gRPC may come a moment after its web port.
	return poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if !c.vtctld.running() {
			return false, permanent(errors.New("vtctld exited"))
		}
		_, err := c.Vtctldclient(ctx, "CreateKeyspace", "--durability-policy=none", Keyspace)
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return true, nil
		}
		return err == nil, err
	})
}

// waitHTTP waits until url answers, failing early if s exits.
func (c *Cluster) waitHTTP(ctx context.Context, s *server, url string) error {
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if !s.running() {
			return false, permanent(fmt.Errorf("%s exited", s.name))
		}
		_, err := httpGet(ctx, url)
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	return nil
}

// initMysqlds initialises every tablet's MariaDB, a few at a time (each
// runs mariadb-install-db: CPU-bound).
func (c *Cluster) initMysqlds(ctx context.Context) error {
	return c.eachTablet(3, func(t *Tablet) error { return t.initMysqld(ctx) })
}

// startTablets starts every vttablet (as a replica: PlannedReparentShard
// then makes one per shard the primary) and waits until each is up.
func (c *Cluster) startTablets(ctx context.Context) error {
	for _, t := range c.tablets {
		if err := t.startVttablet(); err != nil {
			return err
		}
	}
	return c.eachTablet(0, func(t *Tablet) error { return c.waitHTTP(ctx, t.vttablet, "http://"+t.HTTP+"/debug/vars") })
}

// promotePrimaries makes each shard's zone1 tablet its primary (promote).
func (c *Cluster) promotePrimaries(ctx context.Context) error {
	return c.eachShard(func(shard string) error { return c.promote(ctx, shard) })
}

// attachReplicas attaches every shard's replicas to its primary (attach).
func (c *Cluster) attachReplicas(ctx context.Context) error {
	return c.eachShard(func(shard string) error { return c.attach(ctx, shard) })
}

// promote makes the shard's PrimaryCell tablet its primary with
// PlannedReparentShard. On MariaDB it answers with an error after the
// promotion, as it fails to attach the replicas (it parses the primary's
// server_uuid, which MariaDB has not); that error is expected when the
// primary took office, which is checked on the tablet itself.
func (c *Cluster) promote(ctx context.Context, shard string) error {
	p := c.Primary(shard)
	out, prsErr := c.Vtctldclient(ctx, "PlannedReparentShard", Keyspace+"/"+shard, "--new-primary", p.Alias)
	err := poll(ctx, 200*time.Millisecond, func() (bool, error) {
		v, err := p.vars(ctx)
		return err == nil && strings.EqualFold(v.TabletType, "primary"), err
	})
	if err != nil {
		return fmt.Errorf("%s did not become the primary of %s: %w (PlannedReparentShard: %v %s)", p.Alias, shard, err, prsErr, out)
	}
	if prsErr != nil {
		said := lastLines(out, 1)
		if len(said) > 400 {
			said = said[:400] + "…"
		}
		c.opts.Log("vitessbed: PlannedReparentShard %s/%s promoted %s; it failed to attach the replicas, as on MariaDB it does (attached by hand next): %s",
			Keyspace, shard, p.Alias, said)
	}
	return nil
}

// attach points the shard's replicas' MariaDB at its primary's and waits
// until each has replayed the primary's writes so far (the database
// vt_commerce and Vitess's sidecar tables, made by the promoted primary).
func (c *Cluster) attach(ctx context.Context, shard string) error {
	p := c.Primary(shard)
	for _, r := range c.Replicas(shard) {
		if err := r.attachTo(ctx, p); err != nil {
			return err
		}
	}
	for _, r := range c.Replicas(shard) {
		if err := r.WaitCaughtUp(ctx); err != nil {
			return err
		}
	}
	return nil
}

// applySchema creates the tables on the primaries (vtctld's ApplySchema;
// the replicas get them through replication) and sets the VSchema.
func (c *Cluster) applySchema(ctx context.Context) error {
	// The primaries make vt_commerce once they serve; ApplySchema needs it.
	err := c.eachShard(func(shard string) error {
		return c.Primary(shard).waitState(ctx, "primary", "SERVING")
	})
	if err != nil {
		return err
	}
	if _, err := c.Vtctldclient(ctx, "ApplySchema", "--sql", Schema, Keyspace); err != nil {
		return err
	}
	if _, err := c.Vtctldclient(ctx, "ApplyVSchema", "--vschema", VSchema, Keyspace); err != nil {
		return err
	}
	return c.eachShard(func(shard string) error {
		for _, r := range c.Replicas(shard) {
			if err := r.WaitCaughtUp(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// startVtgate starts vtgate, watching every cell, and waits until it routes
// a query to each shard.
func (c *Cluster) startVtgate(ctx context.Context) error {
	c.vtgate = &server{name: "vtgate", log: filepath.Join(c.Dir, "vtgate.log"), bin: filepath.Join(c.bin.Vitess, "vtgate"),
		args: append(c.topoFlags(),
			"--cell", PrimaryCell, "--cells-to-watch", strings.Join(Cells, ","),
			// The primaries, in vtgate's own cell; waiting for replicas
			// would wait out the initial timeout (30 s): they are all in
			// other cells.
			"--tablet-types-to-wait", "PRIMARY",
			// New tablets (a Reshard's shards) found within a second,
			// not the default minute.
			"--tablet-refresh-interval", "1s",
			"--service-map", "grpc-vtgateservice",
			"--port", port(c.addr.VtgateHTTP), "--bind-address", "127.0.0.1",
			"--grpc-port", port(c.addr.VtgateGRPC), "--grpc-bind-address", "127.0.0.1",
			"--mysql-server-port", port(c.addr.VtgateMySQL), "--mysql-server-bind-address", "127.0.0.1",
			"--mysql-auth-server-impl", "none",
			"--pid-file", filepath.Join(c.Dir, "vtgate.pid"),
			"--config-file-not-found-handling", "ignore", "--log-format", "text")}
	if err := c.start(c.vtgate); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, c.vtgate, "http://"+c.addr.VtgateHTTP+"/debug/status"); err != nil {
		return err
	}
	return poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if !c.vtgate.running() {
			return false, permanent(errors.New("vtgate exited"))
		}
		for _, shard := range Shards {
			if _, err := c.ShardRows(ctx, shard); err != nil {
				return false, err
			}
		}
		return true, nil
	})
}

// WaitServing waits until every tablet whose vttablet runs reports the type
// the bed gave it and SERVING.
func (c *Cluster) WaitServing(ctx context.Context) error {
	return c.eachTablet(0, func(t *Tablet) error {
		if !t.vttablet.running() {
			return nil
		}
		return t.waitState(ctx, t.Type, "SERVING")
	})
}

// eachTablet runs f for every tablet, at most n at once (0: all), and joins
// the errors.
func (c *Cluster) eachTablet(n int, f func(*Tablet) error) error { return each(c.tablets, n, f) }

// eachShard runs f for every shard of Shards concurrently and joins the
// errors.
func (c *Cluster) eachShard(f func(shard string) error) error { return eachOf(Shards, f) }

// each runs f for every tablet, at most n at once (0: all), and joins the
// errors.
func each(tablets []*Tablet, n int, f func(*Tablet) error) error {
	if n <= 0 {
		n = len(tablets)
	}
	sem := make(chan struct{}, n)
	errs := make([]error, len(tablets))
	var wg sync.WaitGroup
	for i, t := range tablets {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = f(t)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// eachOf runs f for every shard concurrently and joins the errors.
func eachOf(shards []string, f func(string) error) error {
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i, s := range shards {
		wg.Go(func() { errs[i] = f(s) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Stop stops everything the bed started, in an order that lets each part
// end cleanly: vtgate, the vttablets, every MariaDB (mysqlctl shutdown;
// killed if that fails), vtctld, etcd. It then removes Dir if Start made it.
// No process of the bed is left running when it returns.
func (c *Cluster) Stop() error {
	var errs []error
	if c.db != nil {
		errs = append(errs, c.db.Close())
	}
	if c.vtgate != nil {
		c.vtgate.stop()
	}
	for _, t := range c.tablets {
		if t.vttablet != nil {
			go t.vttablet.stop()
		}
	}
	for _, t := range c.tablets {
		if t.vttablet != nil {
			<-t.vttablet.exited()
		}
	}
	errs = append(errs, c.eachTablet(0, func(t *Tablet) error { return t.stopMysqld() }))
	if c.vtctld != nil {
		c.vtctld.stop()
	}
	if c.etcd != nil {
		c.etcd.stop()
	}
	if c.ownsDir {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	return errors.Join(errs...)
}

// Pids are the bed's running processes: etcd, vtctld, vtgate, each
// vttablet, and each tablet's mysqld_safe and mariadbd.
func (c *Cluster) Pids() []int {
	var out []int
	for _, s := range []*server{c.etcd, c.vtctld, c.vtgate} {
		if s != nil && s.pid() != 0 {
			out = append(out, s.pid())
		}
	}
	for _, t := range c.tablets {
		if t.vttablet != nil && t.vttablet.pid() != 0 {
			out = append(out, t.vttablet.pid())
		}
		if t.mysqldGroup != 0 {
			out = append(out, groupPids(t.mysqldGroup)...)
		}
	}
	return out
}

// Tails are the ends of every process's log, each under its name.
func (c *Cluster) Tails() string {
	var b strings.Builder
	add := func(name, path string, n int) {
		if _, err := os.Stat(path); err == nil {
			fmt.Fprintf(&b, "--- %s (%s)\n%s\n", name, path, tail(path, n))
		}
	}
	for _, s := range []*server{c.etcd, c.vtctld, c.vtgate} {
		if s != nil {
			add(s.name, s.log, 3000)
		}
	}
	add("vtctldclient", filepath.Join(c.Dir, "vtctldclient.log"), 2000)
	for _, t := range c.tablets {
		add(t.Alias+" mysqlctl", t.mysqlctlLog(), 1500)
		add(t.Alias+" mariadbd", filepath.Join(t.dir(), "error.log"), 1500)
		if t.vttablet != nil {
			add(t.Alias+" vttablet", t.vttablet.log, 3000)
		}
	}
	return b.String()
}

// port is the port of a host:port.
func port(hostPort string) string { return hostPort[strings.LastIndexByte(hostPort, ':')+1:] }
