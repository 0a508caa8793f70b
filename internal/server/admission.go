package server

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policystate"
)

// admission bounds the decision requests in progress, in two stages. A request is admitted
// (a reading slot) before a byte of its body is read, and holds the slot until it is answered:
// so at most maxReading bodies are in memory. It then takes a deciding slot for decoding,
// evaluating and logging, where memory grows in proportion to the body: at most maxDeciding
// at once. A driver's config check is waited for outside the deciding slot, holding nothing
// that grows with the body (Server.admitted). A request that waits longer than queueWait for
// a slot is answered 503.
type admission struct {
	reading, deciding chan struct{}
	wait              time.Duration
}

func newAdmission(c LimitsConfig) *admission {
	return &admission{
		reading:  make(chan struct{}, c.MaxReading),
		deciding: make(chan struct{}, c.MaxDeciding),
		wait:     c.QueueWait,
	}
}

// acquire takes a slot of stage within the admission wait. It returns the function that gives
// the slot back, or nil when none came free in time or ctx ended.
func (a *admission) acquire(ctx context.Context, stage chan struct{}) (release func()) {
	select {
	case stage <- struct{}{}:
		return func() { <-stage }
	default:
	}
	t := time.NewTimer(a.wait)
	defer t.Stop()
	select {
	case stage <- struct{}{}:
		return func() { <-stage }
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}

// retryAfter is the Retry-After of an overload answer: the admission wait in whole seconds,
// at least 1.
func (a *admission) retryAfter() string {
	return strconv.Itoa(max(1, int(math.Ceil(a.wait.Seconds()))))
}

// overloaded is the answer to a decision request that was not admitted.
func (a *admission) overloaded() error {
	return coded.Errorf(coded.Overloaded,
		"the service is deciding as many requests as it is configured to hold (limits.maxReading, limits.maxDeciding); retry after the time in Retry-After")
}

// Memory model of the service, measured for docs/service.md ("Limits and memory"). Live memory:
// the service with its policy loaded (about 27 MiB measured with the embedded policy), the
// decision cache filled to its bound, a bundle being read before it is verified, OPA's
// decision-log buffer at its default bound, every admitted body, the requests being decided
// (about 56 bytes live per byte of body for the costliest shape, an array of many small
// objects: the decoded request, the input document's policy values, the log line), and the
// read buffers of every open connection. The service sets the Go runtime's soft memory limit to
// that sum (MemoryLimit); the resident memory may pass it by the garbage the collector has not
// returned yet, which on busy CPUs (the collector takes at most half of them) was up to a
// fifth of it: the bound leaves a third.
const (
	// watchBytes is one open watch besides its connection and its request's body: its state in
	// the hub, its stream's goroutine and timer, the last decision it was sent.
	watchBytes               = 4 << 10
	baseResidentBytes        = 32 << 20
	decidingBytesPerBodyByte = 56
	connectionBufferBytes    = 8 << 10
)

// MemoryLimit is the live memory the service holds at most, for the limits of c and the
// default bounds of the decision cache, bundles and OPA's decision-log buffer: `authz serve`
// sets the Go runtime's soft memory limit to it (unless GOMEMLIMIT is set).
func (c Config) MemoryLimit() int64 {
	return baseResidentBytes +
		decision.DefaultCacheBytes +
		policystate.BundleReadBytes +
		policystate.DefaultDecisionLogBufferBytes +
		int64(c.Limits.MaxReading)*c.MaxBodyBytes +
		int64(c.Limits.MaxDeciding)*decidingBytesPerBodyByte*c.MaxBodyBytes +
		int64(c.Limits.MaxConnections)*int64(c.HTTP.MaxHeaderBytes+connectionBufferBytes) +
		int64(c.Limits.MaxWatches)*watchBytes + c.Limits.MaxWatchBytes
}

// MemoryBound is the peak resident memory the service stays within under any number of
// concurrent requests (docs/service.md): MemoryLimit and a third more for the garbage the
// collector has not returned yet.
func (c Config) MemoryBound() int64 {
	l := c.MemoryLimit()
	return l + l/3
}
