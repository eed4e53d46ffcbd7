package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

// tabletServer is one tablet server: an alias in a cell, its own gRPC
// listener, and the faults injected into it.
type tabletServer struct {
	cluster *Cluster
	alias   string
	cell    string

	mu   sync.Mutex
	addr string // fixed after the first listen, so a server comes back where it was
	// advertised is the address the topology reports: addr, or with
	// Config.AdvertiseHost, that host and addr's port.
	advertised string
	srv        *grpc.Server
	isDown     bool
	// faults holds the server-wide fault under "" and per-tablet ones under
	// the tablet ID.
	faults map[string]*fault
}

// fault is what an operator injected into a server or one replica.
type fault struct {
	notServing       bool
	positionMismatch bool
	unhealthy        bool
	code             codes.Code
	errorRate        float64
	latency          time.Duration
	lag              time.Duration
}

// up starts serving on addr (or on the address used before).
func (ts *tabletServer) up(addr string) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.srv != nil {
		return nil
	}
	if ts.addr != "" {
		addr = ts.addr
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("tablet server %s: listen %s: %w", ts.alias, addr, err)
	}
	ts.addr = lis.Addr().String()
	ts.advertised = ts.addr
	if h := ts.cluster.cfg.AdvertiseHost; h != "" {
		_, port, _ := net.SplitHostPort(ts.addr)
		ts.advertised = net.JoinHostPort(h, port)
	}
	ts.srv = grpc.NewServer(ts.cluster.serverOptions(nil, nil)...)
	ts.isDown = false
	sourcepb.RegisterTabletServerServer(ts.srv, &tabletService{ts: ts})
	srv := ts.srv
	ts.cluster.wg.Add(1)
	go func() { defer ts.cluster.wg.Done(); _ = srv.Serve(lis) }()
	return nil
}

// down closes the listener and every connection: clients get UNAVAILABLE.
func (ts *tabletServer) down() {
	ts.mu.Lock()
	srv := ts.srv
	ts.srv = nil
	ts.isDown = true
	ts.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// effectiveFault merges the server-wide fault with the replica's own.
func (ts *tabletServer) effectiveFault(tabletID string) fault {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var f fault
	for _, key := range []string{"", tabletID} {
		g := ts.faults[key]
		if g == nil {
			continue
		}
		f.notServing = f.notServing || g.notServing
		f.positionMismatch = f.positionMismatch || g.positionMismatch
		f.unhealthy = f.unhealthy || g.unhealthy
		if g.code != codes.OK {
			f.code, f.errorRate = g.code, g.errorRate
		}
		f.latency = max(f.latency, g.latency)
		f.lag = max(f.lag, g.lag)
	}
	return f
}

// health reports whether the server is up and the replica healthy.
func (ts *tabletServer) health(tabletID string) (serving, healthy bool, extraLag time.Duration) {
	f := ts.effectiveFault(tabletID)
	ts.mu.Lock()
	down := ts.isDown
	ts.mu.Unlock()
	return !f.notServing && !down, !down && !f.unhealthy, f.lag
}

// inject applies a fault request to the server or one replica.
func (ts *tabletServer) inject(tabletID string, req *sourcepb.FaultRequest) error {
	ts.mu.Lock()
	f := ts.faults[tabletID]
	if f == nil {
		f = &fault{}
		ts.faults[tabletID] = f
	}
	f.notServing = f.notServing || req.NotServing
	f.positionMismatch = f.positionMismatch || req.PositionMismatch
	f.unhealthy = f.unhealthy || req.Unhealthy
	if req.Code != "" {
		f.code = parseCode(req.Code)
		f.errorRate = req.ErrorRate
		if f.errorRate == 0 {
			f.errorRate = 1
		}
	}
	if req.Latency != nil {
		f.latency = req.Latency.AsDuration()
	}
	if req.Lag != nil {
		f.lag = req.Lag.AsDuration()
	}
	ts.mu.Unlock()
	if req.Down {
		ts.down()
	}
	return nil
}

// heal removes the server's faults (or one replica's) and brings it up.
func (ts *tabletServer) heal(tabletID string) error {
	ts.mu.Lock()
	if tabletID == "" {
		clear(ts.faults)
	} else {
		delete(ts.faults, tabletID)
	}
	down := ts.isDown
	ts.mu.Unlock()
	if down && tabletID == "" {
		return ts.up("")
	}
	return nil
}

// apply waits out injected latency and returns an injected error, if any.
// checkMismatch is false for requests that read no history (Ack).
func (ts *tabletServer) apply(ctx context.Context, tabletID string, checkMismatch bool) error {
	f := ts.effectiveFault(tabletID)
	if f.latency > 0 {
		t := time.NewTimer(f.latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	switch {
	case f.code != codes.OK && rand.Float64() < f.errorRate:
		return errInfo(f.code, &sourcepb.ErrorInfo{Reason: sourcepb.Reason_INJECTED, Tablet: tabletID},
			fmt.Sprintf("injected %s on %s", f.code, ts.alias))
	case f.notServing:
		return errInfo(codeFailedPrecondition, &sourcepb.ErrorInfo{Reason: sourcepb.Reason_NOT_SERVING, Tablet: tabletID},
			fmt.Sprintf("replica %s of tablet %s is not serving", ts.alias, tabletID))
	case checkMismatch && f.positionMismatch:
		return errInfo(codeInvalidArgument, &sourcepb.ErrorInfo{Reason: sourcepb.Reason_POSITION_MISMATCH, Tablet: tabletID},
			fmt.Sprintf("replica %s of tablet %s lost the history the request needs (position mismatch)", ts.alias, tabletID))
	}
	return nil
}

// parseCode maps a gRPC code name ("UNAVAILABLE") to its code; Unknown if
// the name is not a code.
func parseCode(name string) codes.Code {
	var c codes.Code
	if err := c.UnmarshalJSON([]byte(`"` + name + `"`)); err != nil {
		return codes.Unknown
	}
	return c
}

// validCode reports whether name is a gRPC code name other than OK.
func validCode(name string) bool {
	var c codes.Code
	return c.UnmarshalJSON([]byte(`"`+name+`"`)) == nil && c != codes.OK
}
