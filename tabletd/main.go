// Command tabletd is the reference tablet cluster: `tabletd serve` runs one,
// `tabletd ctl` drives it (topology, workload, faults, splits, digest).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/tabletd/cluster"
	"github.com/tabletflow/tabletflow/tlsfiles"
)

const usage = `usage:
  tabletd serve [flags]        run a cluster (tabletd serve -h for flags)
  tabletd ctl --addr ADDR CMD  drive one (tabletd ctl -h for commands)
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(args[1:], stderr)
	case "ctl":
		err = ctl(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "tabletd: unknown command %q\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "tabletd: %v\n", err)
		var u usageError
		if errors.As(err, &u) {
			return 2
		}
		return 1
	}
	return 0
}

// usageError marks a bad command line (exit status 2).
type usageError struct{ error }

func serve(args []string, stderr io.Writer) error {
	def := cluster.DefaultConfig()
	fs := flag.NewFlagSet("tabletd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", def.Listen, "topology and admin address; tablet servers listen on free ports of the same host")
	advertise := fs.String("advertise-host", "", "host the topology reports for tablet servers (default: the --listen host)")
	keyspace := fs.String("keyspace", def.Keyspace, "keyspace name")
	cells := fs.String("cells", strings.Join(def.Cells, ","), "comma-separated cells")
	spc := fs.Int("servers-per-cell", def.ServersPerCell, "tablet servers per cell")
	tablets := fs.Int("tablets", def.Tablets, "tablets (key ranges)")
	replicas := fs.Int("replicas", def.Replicas, "replicas per tablet, on distinct servers (one PRIMARY)")
	rate := fs.Float64("rate", def.Rate, "workload records per second (0: start paused)")
	lag := fs.Duration("lag", def.Lag, "how far followers trail the leader")
	retention := fs.Duration("retention", def.Retention, "how long a (stream, tablet) may stay inactive before it expires")
	seed := fs.Int64("seed", 0, "workload random seed (0: from the clock)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var tlsFiles tlsfiles.Files
	fs.StringVar(&tlsFiles.Cert, "tls-cert", "", "serve TLS with this certificate (PEM; with --tls-key)")
	fs.StringVar(&tlsFiles.Key, "tls-key", "", "the certificate's private key (PEM)")
	fs.StringVar(&tlsFiles.CA, "tls-ca", "", "require clients to present a certificate signed by this CA (mutual TLS)")
	tokenEnv := fs.String("token-env", "", "require every call to carry the bearer token held by this environment variable")
	if err := fs.Parse(args); err != nil {
		return usageErr(err)
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))}
	}
	lvl, err := zap.ParseAtomicLevel(*logLevel)
	if err != nil {
		return usageError{fmt.Errorf("log-level: %w", err)}
	}
	var tlsCfg *tls.Config
	if !tlsFiles.IsZero() {
		if tlsCfg, err = tlsFiles.Server(); err != nil {
			return usageError{fmt.Errorf("tls: %w", err)}
		}
	}
	var token string
	if *tokenEnv != "" {
		if token = os.Getenv(*tokenEnv); token == "" {
			return usageError{fmt.Errorf("token-env: %s is not set", *tokenEnv)}
		}
	}
	zcfg := zap.NewProductionConfig()
	zcfg.Level = lvl
	logger, err := zcfg.Build()
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()

	c, err := cluster.New(cluster.Config{
		Listen: *listen, AdvertiseHost: *advertise, Keyspace: *keyspace, Cells: splitList(*cells), ServersPerCell: *spc,
		Tablets: *tablets, Replicas: *replicas, Rate: *rate, Lag: *lag, Retention: *retention,
		Seed: *seed, Logger: logger, TLS: tlsCfg, Token: token,
	})
	if err != nil {
		return usageError{err}
	}
	if err := c.Start(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	logger.Info("tabletd stopping")
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return errors.New("did not stop within 10s")
	}
	return nil
}

func usageErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
