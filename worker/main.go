// Command worker runs tabletflow's workflows and activities on the
// "tabletflow" task queue.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.uber.org/zap"

	"github.com/tabletflow/tabletflow/activities"
	"github.com/tabletflow/tabletflow/connect"
	"github.com/tabletflow/tabletflow/metrics"
	"github.com/tabletflow/tabletflow/workflows"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run() error {
	var conn connect.Flags
	conn.Register(flag.CommandLine)
	taskQueue := flag.String("task-queue", workflows.TaskQueue, "task queue")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	logFormat := flag.String("log-format", "json", "json or console")
	maxActivities := flag.Int("max-concurrent-activities", 1000,
		"activities run at once: one long-running GetChanges per tablet this worker serves, plus headroom")
	stopTimeout := flag.Duration("stop-timeout", 30*time.Second,
		"on SIGTERM, how long in-flight GetChanges get to commit and return")
	pollers := flag.Int("pollers", 8, "workflow and activity task pollers (each)")
	metricsAddr := flag.String("metrics-addr", "",
		"serve Prometheus metrics (tabletflow's and the Temporal SDK's) at http://ADDR/metrics; empty: off")
	flag.Parse()

	logger, err := connect.NewZap(*logLevel, *logFormat)
	if err != nil {
		return fmt.Errorf("log-level: %w", err)
	}
	defer func() { _ = logger.Sync() }()
	opts, err := conn.Options(connect.NewZapLogger(logger))
	if err != nil {
		return err
	}
	var m *metrics.Metrics
	if *metricsAddr != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		m = metrics.New(reg)
		opts.MetricsHandler = metrics.NewSDKHandler(reg)
		addr, stop, err := metrics.Serve(*metricsAddr, reg)
		if err != nil {
			return fmt.Errorf("metrics-addr: %w", err)
		}
		defer stop()
		logger.Info("serving metrics", zap.String("url", "http://"+addr+"/metrics"))
	}
	c, err := client.Dial(opts)
	if err != nil {
		return fmt.Errorf("connect to Temporal at %s: %w", opts.HostPort, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = connect.CheckSearchAttributes(ctx, c, opts.Namespace, workflows.SearchAttributes)
	cancel()
	if err != nil {
		return err
	}

	res := activities.NewResources()
	defer res.Close()
	w := worker.New(c, *taskQueue, worker.Options{
		MaxConcurrentActivityExecutionSize: *maxActivities,
		WorkerStopTimeout:                  *stopTimeout,
		// More pollers than the default two: when an exclusion moves many
		// tablets at once, their workflow and activity tasks queue up.
		MaxConcurrentWorkflowTaskPollers: *pollers,
		MaxConcurrentActivityTaskPollers: *pollers,
	})
	w.RegisterWorkflow(workflows.StreamWorkflow)
	w.RegisterWorkflow(workflows.TabletWorkflow)
	w.RegisterActivity(&activities.Activities{Resources: res, Client: c, Logger: logger, Metrics: m,
		Watcher: &activities.Watcher{Client: c, Interval: time.Second, Logger: logger}})
	logger.Info("worker starting", zap.String("address", opts.HostPort), zap.String("namespace", opts.Namespace),
		zap.String("taskQueue", *taskQueue), zap.Int("maxConcurrentActivities", *maxActivities))
	return w.Run(worker.InterruptCh())
}
