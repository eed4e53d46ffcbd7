package pgbed

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/tabletflow/tabletflow/testbed/bins"
)

// runAs is who the servers run as: an unprivileged user when we are root
// (initdb and postgres refuse root), else ourselves (cred nil).
type runAs struct {
	cred *syscall.Credential
	name string
}

func lookupRunAs(name string) (runAs, error) {
	cred, err := bins.Credential(name)
	switch {
	case err != nil:
		return runAs{}, fmt.Errorf("pgbed: %w", err)
	case cred == nil:
		return runAs{name: "current user"}, nil
	}
	return runAs{name: name, cred: cred}, nil
}

// sysProcAttr starts a process as the user.
func (r runAs) sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: r.cred}
}

// chown gives path to the user (nothing to do when not root).
func (r runAs) chown(path string) error {
	if r.cred == nil {
		return nil
	}
	return os.Lchown(path, int(r.cred.Uid), int(r.cred.Gid))
}

// can reports whether the user may access path with the permission bits
// want (4 read, 2 write, 1 search/execute), by its owner, group and other bits.
func (r runAs) can(path string, want uint32) (bool, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return false, err
	}
	perm := st.Mode & 0o7
	switch {
	case st.Uid == r.cred.Uid:
		perm = st.Mode >> 6 & 0o7
	case st.Gid == r.cred.Gid:
		perm = st.Mode >> 3 & 0o7
	}
	return perm&want == want, nil
}

// checkBinaries makes sure the user can reach and run the binaries and read
// lib and share beside them: every directory above needs search permission.
func (r runAs) checkBinaries(bin string) error {
	if r.cred == nil {
		return nil
	}
	bin, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return err
	}
	root := filepath.Dir(bin)
	for dir := root; ; dir = filepath.Dir(dir) {
		if ok, err := r.can(dir, 1); err != nil || !ok {
			return fmt.Errorf("pgbed: user %s cannot reach %s (no search permission on %s): make every directory above it a+x", r.name, bin, dir)
		}
		if dir == "/" {
			break
		}
	}
	for _, p := range []string{filepath.Join(bin, "initdb"), filepath.Join(bin, "postgres")} {
		if ok, err := r.can(p, 5); err != nil || !ok {
			return fmt.Errorf("pgbed: user %s cannot run %s: %v", r.name, p, err)
		}
	}
	for _, sub := range []string{"lib", "share"} {
		if ok, err := r.can(filepath.Join(root, sub), 5); err != nil || !ok {
			return fmt.Errorf("pgbed: user %s cannot read %s: %v", r.name, filepath.Join(root, sub), err)
		}
	}
	return nil
}

// grantSearch lets the user reach dir: a directory above it that the user
// cannot search gets o+x (search, not listing) if it is under the temporary
// directory (t.TempDir's are 0700); elsewhere that is an error to fix by hand.
func (r runAs) grantSearch(dir string) error {
	if r.cred == nil {
		return nil
	}
	tmp, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		return err
	}
	dir, err = filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	for d := dir; ; d = filepath.Dir(d) {
		ok, err := r.can(d, 1)
		if err != nil {
			return err
		}
		if !ok {
			if !strings.HasPrefix(d, tmp+"/") {
				return fmt.Errorf("pgbed: user %s cannot reach %s (no search permission on %s): use a directory under %s", r.name, dir, d, tmp)
			}
			st, err := os.Stat(d)
			if err != nil {
				return err
			}
			if err := os.Chmod(d, st.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
		if d == "/" {
			return nil
		}
	}
}

// initdb makes a primary's data directory: UTF8, C locale, the superuser
// trusted on loopback, then the bed's postgresql.conf and pg_hba.conf.
func (c *Cluster) initdb(ctx context.Context, n *Node) error {
	data := n.DataDir()
	if err := os.Mkdir(data, 0o700); err != nil {
		return err
	}
	if err := c.run.chown(data); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "initdb"), "-D", data, "-U", AdminUser,
		"--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	cmd.Dir = n.dir
	cmd.SysProcAttr = c.run.sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: initdb: %w\n%s", n.Name, err, out)
	}
	if err := c.appendFile(filepath.Join(data, "postgresql.conf"), c.config()); err != nil {
		return err
	}
	if c.opts.TLS.Cert == "" {
		return c.writeFile(filepath.Join(data, "pg_hba.conf"), hba)
	}
	// The server reads its key only if the key is its own and private:
	// copies in the data directory (standbys' base backups take them too).
	for src, dst := range map[string]string{c.opts.TLS.Cert: "server.crt", c.opts.TLS.Key: "server.key"} {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		if err := c.writeFile(filepath.Join(data, dst), string(b)); err != nil {
			return err
		}
	}
	sslOnly := strings.NewReplacer("host all         all ", "hostssl all      all ", "host replication all ", "hostssl replication all ")
	return c.writeFile(filepath.Join(data, "pg_hba.conf"), sslOnly.Replace(hba))
}

// config is what every node adds to postgresql.conf. Standbys copy it from
// their primary, so it holds both sides' settings.
func (c *Cluster) config() string {
	keep := c.opts.MaxSlotWALKeepSize
	if keep == "" {
		keep = "-1"
	}
	settings := map[string]string{
		"listen_addresses":        "'127.0.0.1'",
		"unix_socket_directories": "''", // TCP only: no socket path length limit, no /tmp clash
		"max_connections":         "50",
		"shared_buffers":          "16MB",
		// Test data: speed over durability against an OS crash. Kill (a
		// SIGKILL) still loses no commit: the WAL was written to the kernel
		// at commit (synchronous_commit stays on for that).
		"fsync":                  "off",
		"full_page_writes":       "off",
		"wal_level":              "logical",
		"max_wal_senders":        "20",
		"max_replication_slots":  "20",
		"max_slot_wal_keep_size": quote(keep),
		"hot_standby":            "on",
		"hot_standby_feedback":   "on",
		// A standby retries its primary every 200 ms instead of 5 s, so a
		// restarted primary is streamed from again at once.
		"wal_retrieve_retry_interval": "200ms",
		"timezone":                    "'UTC'",
		"log_timezone":                "'UTC'",
		"log_line_prefix":             "'%m [%p] %q%a '",
		"log_replication_commands":    "on",
	}
	if c.opts.TLS.Cert != "" {
		settings["ssl"] = "on"
	}
	maps.Copy(settings, c.opts.Settings)
	var b strings.Builder
	b.WriteString("\n# pgbed\n")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&b, "%s = %s\n", k, settings[k])
	}
	return b.String()
}

// quote makes a setting value a quoted string unless it is one already.
func quote(v string) string {
	if strings.HasPrefix(v, "'") {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// hba trusts the superuser on loopback (the bed's own connections) and asks
// every other role for its password, so the adapter's DSN is checked as in
// production.
const hba = `# pgbed
host all         postgres 127.0.0.1/32 trust
host replication postgres 127.0.0.1/32 trust
host all         all      127.0.0.1/32 scram-sha-256
host replication all      127.0.0.1/32 scram-sha-256
`

// schemaSQL runs on each new primary: the adapter's role and the test tables,
// owned by it (so it may publish them).
var schemaSQL = fmt.Sprintf(`
CREATE ROLE %[1]s LOGIN REPLICATION PASSWORD '%[2]s';
GRANT CREATE ON DATABASE postgres TO %[1]s;
GRANT pg_monitor TO %[1]s;
GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO %[1]s;
CREATE TABLE public.orders (
	id bigint PRIMARY KEY,
	customer text,
	amount numeric,
	note text,
	updated_at timestamptz
);
ALTER TABLE public.orders REPLICA IDENTITY FULL;
ALTER TABLE public.orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE public.items (
	id bigint PRIMARY KEY,
	order_id bigint NOT NULL,
	sku text NOT NULL,
	qty integer NOT NULL,
	body text
);
ALTER TABLE public.items ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE public.orders OWNER TO %[1]s;
ALTER TABLE public.items OWNER TO %[1]s;
`, User, Password)

// makeStandby copies the stopped primary's data directory into the standby's
// (no physical slots: those are the primary's), and points it at the
// primary through its slot.
func (c *Cluster) makeStandby(p, sb *Node) error {
	src, dst := p.DataDir(), sb.DataDir()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if filepath.Dir(rel) == "pg_replslot" || rel == "postmaster.pid" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(path, target, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected %s in a data directory", path)
		}
		return c.run.chown(target)
	})
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s application_name=%s",
		p.Port, User, Password, sb.Name)
	if c.opts.TLS.Cert != "" {
		// The bed's own link: encrypted (hostssl), and no client
		// certificate looked for in the home of the user we run as.
		conninfo += " sslmode=require sslcertmode=disable"
	}
	standby := fmt.Sprintf("\n# pgbed standby\nprimary_conninfo = %s\nprimary_slot_name = '%s'\n", quote(conninfo), sb.SlotName)
	if err := c.appendFile(filepath.Join(dst, "postgresql.conf"), standby); err != nil {
		return err
	}
	return c.writeFile(filepath.Join(dst, "standby.signal"), "")
}

// mirror copies the PostgreSQL tree above bin (bin, lib, share) into the
// temporary directory, once per tree, readable by everyone, and returns the
// copy's bin. Symlinks are copied as symlinks.
func (r runAs) mirror(bin string) (string, error) {
	root := filepath.Dir(bin)
	h := fnv.New32a()
	h.Write([]byte(root))
	dst := filepath.Join(os.TempDir(), fmt.Sprintf("tabletflow-pg-%08x", h.Sum32()))
	stamp := filepath.Join(dst, ".complete")
	if _, err := os.Stat(stamp); err == nil {
		return filepath.Join(dst, "bin"), nil
	}
	tmp, err := os.MkdirTemp(os.TempDir(), "tabletflow-pg-copy-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, sub := range []string{"bin", "lib", "share"} {
		err := filepath.WalkDir(filepath.Join(root, sub), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			to := filepath.Join(tmp, rel)
			switch {
			case d.IsDir():
				return os.MkdirAll(to, 0o755)
			case d.Type()&fs.ModeSymlink != 0:
				link, err := os.Readlink(path)
				if err != nil {
					return err
				}
				return os.Symlink(link, to)
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			return copyFile(path, to, info.Mode().Perm()|0o444)
		})
		if err != nil {
			return "", fmt.Errorf("pgbed: copy the binaries to %s: %w", dst, err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	// Another test process may have made it meanwhile: either copy will do.
	if err := os.Rename(tmp, dst); err != nil {
		if _, serr := os.Stat(stamp); serr != nil {
			return "", err
		}
	}
	return filepath.Join(dst, "bin"), nil
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// writeFile writes a file of the data directory, owned by the user.
func (c *Cluster) writeFile(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	return c.run.chown(path)
}

// appendFile appends to a file of the data directory (initdb's, the user's).
func (c *Cluster) appendFile(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
