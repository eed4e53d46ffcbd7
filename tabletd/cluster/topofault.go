package cluster

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

// topologyFault is the topology_down fault: while it is on, every Topology
// RPC answers UNAVAILABLE. Admin, on the same listener, and the tablet
// servers keep serving.
type topologyFault struct {
	mu   sync.Mutex
	down bool
	// until, if not zero, is when the fault heals by itself.
	until time.Time
}

// topologyMethodPrefix starts the full method name of every Topology RPC.
var topologyMethodPrefix = "/" + sourcepb.Topology_ServiceDesc.ServiceName + "/"

// set turns the fault on, until healed (d == 0) or for d. It replaces an
// earlier setting.
func (f *topologyFault) set(now time.Time, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = true
	f.until = time.Time{}
	if d > 0 {
		f.until = now.Add(d)
	}
}

// heal turns the fault off and reports whether it was on.
func (f *topologyFault) heal(now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := f.isDown(now)
	f.down, f.until = false, time.Time{}
	return was
}

// isDown reports whether the fault is on at now. Callers hold mu.
func (f *topologyFault) isDown(now time.Time) bool {
	return f.down && (f.until.IsZero() || now.Before(f.until))
}

// checkTopology returns the injected error for a Topology method while the fault
// is on, and nil otherwise.
func (c *Cluster) checkTopology(fullMethod string) error {
	if !strings.HasPrefix(fullMethod, topologyMethodPrefix) {
		return nil
	}
	f := &c.topoFault
	f.mu.Lock()
	down := f.isDown(c.now())
	f.mu.Unlock()
	if !down {
		return nil
	}
	return errInfo(codes.Unavailable, &sourcepb.ErrorInfo{Reason: sourcepb.Reason_INJECTED},
		"topology unavailable (fault injected)")
}

// topologyUnary and topologyStream intercept the topology/admin server's
// RPCs for the topology fault.
func (c *Cluster) topologyUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := c.checkTopology(info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (c *Cluster) topologyStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := c.checkTopology(info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// topologyDown injects the topology fault (see FaultRequest.topology_down).
func (c *Cluster) topologyDown(d time.Duration) {
	c.topoFault.set(c.now(), d)
	if d > 0 {
		c.log.Info("topology down (fault injected)", zap.Duration("for", d))
	} else {
		c.log.Info("topology down (fault injected) until healed")
	}
}

// healTopology ends the topology fault.
func (c *Cluster) healTopology() {
	if c.topoFault.heal(c.now()) {
		c.log.Info("topology healed")
	}
}
