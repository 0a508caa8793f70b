package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
)

// brokerStreamMethod is go-plugin's broker stream, which the host opens on every driver
// connection. The host never dispenses anything that uses the broker.
const brokerStreamMethod = "/plugin.GRPCBroker/StartStream"

// guard ends a worker that abuses the host, once, and remembers why.
type guard struct {
	reason atomic.Pointer[string]
	mu     sync.Mutex
	kill   func()
}

// setKill sets what trip calls to end the worker.
func (g *guard) setKill(kill func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.kill = kill
}

// trip records reason (the first one wins) and ends the worker.
func (g *guard) trip(reason string) {
	if !g.reason.CompareAndSwap(nil, &reason) {
		return
	}
	g.mu.Lock()
	kill := g.kill
	g.mu.Unlock()
	if kill != nil {
		kill()
	}
}

// why returns the reason the guard ended the worker, or "".
func (g *guard) why() string {
	if r := g.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// refuseBroker is a gRPC stream interceptor for the host's connection to one driver. go-plugin's
// host side starts a goroutine and a map entry for every broker message a driver sends (a
// driver looping broker.Accept held tens of thousands of host goroutines). The interceptor
// never hands a broker message to go-plugin: it reads and drops them, logs the first, and after
// max of them ends the worker through g.
func refuseBroker(log hclog.Logger, g *guard, maxMessages int) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != brokerStreamMethod {
			return cs, err
		}
		return &refusedBroker{ClientStream: cs, log: log, guard: g, max: maxMessages}, nil
	}
}

// errBrokerRefused ends go-plugin's broker loop on the host.
var errBrokerRefused = errors.New("the go-plugin broker is not offered by the authz host")

type refusedBroker struct {
	grpc.ClientStream
	log   hclog.Logger
	guard *guard
	max   int
	n     int // only RecvMsg touches it, from go-plugin's one receiving goroutine
}

// RecvMsg drops every message; it returns only when the stream ends or the driver sent more
// than max messages.
func (s *refusedBroker) RecvMsg(m any) error {
	for {
		if err := s.ClientStream.RecvMsg(m); err != nil {
			return err
		}
		s.n++
		if s.n == 1 {
			s.log.Warn("driver uses the go-plugin broker, which the host does not offer; its messages are dropped",
				"limit", s.max)
		}
		if s.n > s.max {
			s.guard.trip(fmt.Sprintf("ended by the host: the driver sent more than %d go-plugin broker messages; "+
				"the host does not offer the broker, a driver must not call broker.Accept or AcceptAndServe", s.max))
			return errBrokerRefused
		}
	}
}
