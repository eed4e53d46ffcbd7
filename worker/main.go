// Command worker runs tabletflow's workflows and activities on the
// "tabletflow" task queue.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/adapters"
	"github.com/tabletflow/tabletflow/internal/gomaxprocs"
	"github.com/tabletflow/tabletflow/internal/timerslack"
	"github.com/tabletflow/tabletflow/metrics"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/temporalclient"
	"github.com/tabletflow/tabletflow/workflows"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run() error {
	var conn temporalclient.Flags
	conn.Register(flag.CommandLine)
	taskQueue := flag.String("task-queue", workflows.TaskQueue, "task queue")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	logFormat := flag.String("log-format", "json", "json or console")
	maxActivities := flag.Int("max-concurrent-activities", 1000,
		"activities run at once: one long-running GetChanges per tablet this worker serves, plus headroom")
	stopTimeout := flag.Duration("stop-timeout", 30*time.Second,
		"on SIGTERM, how long in-flight GetChanges get to commit and return")
	liveEvery := flag.Duration("live-every", 0,
		"how often at most each running tablet's progress (checkpoint, records, lag) reaches the server as its heartbeat, which the status query, the memo and starter status show (docs/operating.md#live-status): one heartbeat call per running tablet this often (0: 80% of run.heartbeatTimeout, the SDK's default)")
	pollers := flag.Int("pollers", 8, "activity task pollers, and workflow task pollers for each of the normal and the sticky queue (twice this in all)")
	adaptiveProcs := flag.Bool("adaptive-gomaxprocs", true,
		"run on one P of the Go scheduler while the worker is lightly loaded, on all of them while it is busy (see docs/production.md)")
	slack := flag.Duration("timer-slack", timerslack.Default,
		"how late the kernel may wake the worker's threads from a timed sleep (Linux's timer slack; see docs/production.md); 0: the kernel's default")
	metricsAddr := flag.String("metrics-addr", "",
		"serve Prometheus metrics (tabletflow's and the Temporal SDK's) at http://ADDR/metrics; empty: off")
	codecAddr := flag.String("codec-addr", "",
		"serve the payload codec (needs --encryption-key-file) at http://ADDR for temporal --codec-endpoint and the Web UI; anyone who reaches it can decrypt")
	codecOrigins := flag.String("codec-origins", "http://localhost:8233,http://127.0.0.1:8233",
		"browser origins (the Web UI's) the codec endpoint allows, comma-separated")
	flag.Parse()
	if *pollers < 2 {
		return fmt.Errorf("pollers: %d: at least 2 (one for each of the workflow task queue's normal and sticky queues)", *pollers)
	}

	logger, err := temporalclient.NewZap(*logLevel, *logFormat)
	if err != nil {
		return fmt.Errorf("log-level: %w", err)
	}
	defer func() { _ = logger.Sync() }()
	if *slack != 0 {
		if err := timerslack.Set(*slack); errors.Is(err, timerslack.ErrOutOfRange) {
			return fmt.Errorf("timer-slack: %w; or 0 for the kernel's default", err)
		} else if err != nil {
			logger.Warn("timer slack left at the kernel's default", zap.Error(err))
		}
	}
	opts, err := conn.Options(temporalclient.NewZapLogger(logger))
	if err != nil {
		return err
	}
	var m *metrics.Metrics
	var reg *prometheus.Registry
	if *metricsAddr != "" {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		m = metrics.New(reg)
		metrics.SinkSyncs(reg, jsonl.Syncs)
		opts.MetricsHandler = metrics.NewSDKHandler(reg)
		addr, stop, err := metrics.Serve(*metricsAddr, reg)
		if err != nil {
			return fmt.Errorf("metrics-addr: %w", err)
		}
		defer stop()
		logger.Info("serving metrics", zap.String("url", "http://"+addr+"/metrics"))
	}
	if *codecAddr != "" {
		cdc, err := conn.Codec()
		if err != nil {
			return err
		}
		if cdc == nil {
			return fmt.Errorf("codec-addr: no encryption key (--encryption-key-file or $%s)", temporalclient.EnvEncryptionKeys)
		}
		origins := strings.FieldsFunc(*codecOrigins, func(r rune) bool { return r == ',' || r == ' ' })
		addr, stop, err := serveCodec(*codecAddr, cdc.Handler(origins))
		if err != nil {
			return fmt.Errorf("codec-addr: %w", err)
		}
		defer stop()
		logger.Info("serving the payload codec", zap.String("url", "http://"+addr))
	}
	withBalancedWorkflowPolls(&opts)
	c, err := client.Dial(opts)
	if err != nil {
		return fmt.Errorf("connect to Temporal at %s: %w", opts.HostPort, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = temporalclient.CheckSearchAttributes(ctx, c, opts.Namespace, workflows.SearchAttributes)
	cancel()
	if err != nil {
		return err
	}
	if reg != nil {
		metrics.Streams(reg, streamStates(c, opts.Namespace, opts.DataConverter, logger))
	}

	res := activities.NewResources()
	res.NewSource, res.NewSink = adapters.OpenSource, adapters.OpenSink
	defer res.Close()
	var gov *gomaxprocs.Governor
	if *adaptiveProcs {
		gov = gomaxprocs.New()
		gctx, stopGov := context.WithCancel(context.Background())
		defer stopGov()
		go gov.Run(gctx)
	}
	w := worker.New(c, *taskQueue, workerOptions(*pollers, *maxActivities, *stopTimeout, *liveEvery))
	w.RegisterWorkflow(workflows.StreamWorkflow)
	w.RegisterWorkflow(workflows.TabletWorkflow)
	w.RegisterActivity(&activities.Activities{Resources: res, Client: c, Logger: logger, Metrics: m, Busy: gov.Busy, LiveEvery: *liveEvery, DataConverter: opts.DataConverter,
		Watcher: &activities.Watcher{Client: c, Interval: time.Second, Logger: logger, DataConverter: opts.DataConverter}})
	logger.Info("worker starting", zap.String("address", opts.HostPort), zap.String("namespace", opts.Namespace),
		zap.String("taskQueue", *taskQueue), zap.Int("maxConcurrentActivities", *maxActivities))
	return w.Run(worker.InterruptCh())
}

// serveCodec serves h on addr until stop.
func serveCodec(addr string, h http.Handler) (string, func(), error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return lis.Addr().String(), func() { _ = srv.Close() }, nil
}
