package policy

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Bounds in time of a bundle download's body (authz serve's remote bundles). OPA bounds the
// wait for the response headers (its services' response_header_timeout_seconds, 10 s, raised
// by long polling's wait), not the body: a server that sends the headers and then stalls, or
// trickles the body, held the download, and every later one of that bundle, for ever. A body
// that receives no byte for DefaultDownloadStall, or that after DefaultDownloadGrace averages
// less than DefaultDownloadMinRate bytes a second, is cut: OPA's downloader reports the
// error (in /v1/status) and retries with its back-off.
const (
	DefaultDownloadStall   = 30 * time.Second
	DefaultDownloadGrace   = 30 * time.Second
	DefaultDownloadMinRate = 1024 // bytes per second
)

// downloadTimes bound a download's body in time (zero fields take the defaults).
type downloadTimes struct {
	stall, grace time.Duration
	minRate      int64
}

func (t downloadTimes) withDefaults() downloadTimes {
	if t.stall <= 0 {
		t.stall = DefaultDownloadStall
	}
	if t.grace <= 0 {
		t.grace = DefaultDownloadGrace
	}
	if t.minRate <= 0 {
		t.minRate = DefaultDownloadMinRate
	}
	return t
}

// errDownloadStalled is the cause of every download cut for its pace.
var errDownloadStalled = errors.New("bundle download too slow, cut; OPA retries it with back-off: check the bundle server and the network to it")

// timedBody is a response body whose reads are cut (the body closed, Read failing with an
// errDownloadStalled error) when no byte arrived for stall, or when, past grace, the bytes
// received average less than minRate a second.
type timedBody struct {
	body  io.ReadCloser
	t     downloadTimes
	start time.Time

	mu    sync.Mutex
	n     int64
	last  time.Time
	cut   error
	timer *time.Timer
	done  bool
}

func newTimedBody(body io.ReadCloser, t downloadTimes) *timedBody {
	now := time.Now()
	b := &timedBody{body: body, t: t.withDefaults(), start: now, last: now}
	b.mu.Lock()
	b.timer = time.AfterFunc(b.tick(), b.check)
	b.mu.Unlock()
	return b
}

// tick is how often the pace is looked at.
func (b *timedBody) tick() time.Duration {
	return max(min(b.t.stall, b.t.grace)/4, time.Millisecond)
}

// check cuts the body when it is too slow, else looks again a tick later.
func (b *timedBody) check() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done || b.cut != nil {
		return
	}
	now := time.Now()
	switch elapsed := now.Sub(b.start); {
	case now.Sub(b.last) >= b.t.stall:
		b.cut = fmt.Errorf("no byte for %v (%d bytes in %v): %w", b.t.stall, b.n, elapsed.Round(time.Millisecond), errDownloadStalled)
	case elapsed >= b.t.grace && float64(b.n) < float64(b.t.minRate)*elapsed.Seconds():
		b.cut = fmt.Errorf("%d bytes in %v, under the minimum of %d bytes a second: %w", b.n, elapsed.Round(time.Millisecond), b.t.minRate, errDownloadStalled)
	}
	if b.cut != nil {
		_ = b.body.Close() // a Read blocked in the body returns
		return
	}
	b.timer.Reset(b.tick())
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cut != nil {
		return 0, b.cut
	}
	if n > 0 {
		b.n += int64(n)
		b.last = time.Now()
	}
	if err != nil {
		b.done = true
		b.timer.Stop()
	}
	return n, err
}

func (b *timedBody) Close() error {
	b.mu.Lock()
	b.done = true
	b.timer.Stop()
	b.mu.Unlock()
	return b.body.Close()
}
