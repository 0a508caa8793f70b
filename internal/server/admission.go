package server

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/authz-dev/authz/internal/coded"
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

// Memory model of the service, measured for docs/service.md ("Limits and memory"): the
// resident memory of the service with its policy loaded and room for the garbage collector,
// and the memory one request being decided holds per byte of its body (the decoded request,
// the input document's policy values, the log line) for the costliest body shape, an array
// of many small objects: about 56 bytes were measured live, and the rest is room for the
// garbage collector, which the service caps at the bound (debug.SetMemoryLimit).
const (
	baseResidentBytes        = 64 << 20
	decidingBytesPerBodyByte = 80
)

// MemoryBound is the peak resident memory the service stays within under any number of
// concurrent requests, for the body limit and admission limits of c (docs/service.md):
// the base, every admitted body, the decoding of the bodies being decided, and the read
// buffers of every open connection.
func (c Config) MemoryBound() int64 {
	return baseResidentBytes +
		int64(c.Limits.MaxReading)*c.MaxBodyBytes +
		int64(c.Limits.MaxDeciding)*decidingBytesPerBodyByte*c.MaxBodyBytes +
		int64(c.Limits.MaxConnections)*int64(c.HTTP.MaxHeaderBytes+8<<10)
}
