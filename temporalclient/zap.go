package temporalclient

import (
	"go.temporal.io/sdk/log"
	"go.uber.org/zap"
)

// ZapLogger adapts zap to the Temporal SDK's logger, key/value pairs and
// all.
type ZapLogger struct{ s *zap.SugaredLogger }

var (
	_ log.Logger     = ZapLogger{}
	_ log.WithLogger = ZapLogger{}
)

// NewZapLogger wraps l.
func NewZapLogger(l *zap.Logger) ZapLogger {
	return ZapLogger{s: l.WithOptions(zap.AddCallerSkip(1)).Sugar()}
}

func (z ZapLogger) Debug(msg string, kv ...any) { z.s.Debugw(msg, kv...) }
func (z ZapLogger) Info(msg string, kv ...any)  { z.s.Infow(msg, kv...) }
func (z ZapLogger) Warn(msg string, kv ...any)  { z.s.Warnw(msg, kv...) }
func (z ZapLogger) Error(msg string, kv ...any) { z.s.Errorw(msg, kv...) }

// With returns a logger that adds kv to every line.
func (z ZapLogger) With(kv ...any) log.Logger { return ZapLogger{s: z.s.With(kv...)} }

// NewZap builds a zap logger: level debug|info|warn|error, format
// json|console.
func NewZap(level, format string) (*zap.Logger, error) {
	lvl, err := zap.ParseAtomicLevel(level)
	if err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	if format == "console" {
		cfg = zap.NewDevelopmentConfig()
	}
	cfg.Level = lvl
	return cfg.Build()
}

// Quiet is a Temporal SDK logger that drops everything: for tools that
// print what matters themselves (the starter, tests, benchmarks).
type Quiet struct{}

var _ log.Logger = Quiet{}

func (Quiet) Debug(string, ...any) {}
func (Quiet) Info(string, ...any)  {}
func (Quiet) Warn(string, ...any)  {}
func (Quiet) Error(string, ...any) {}
