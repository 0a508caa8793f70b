package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/server"
)

// slowReader hands out its bytes in chunks with a pause before each: a client on a slow link.
type slowReader struct {
	b     []byte
	chunk int
	pause time.Duration
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.pause)
	n := copy(p[:min(len(p), r.chunk)], r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestServeSoak runs the service for a bounded time (about 30 s) under a mix of load: a few
// thousand decisions, some with bodies up to the 1 MiB limit, clients that send their bodies
// slowly, connections held open, and two log rotations (a rename with SIGHUP, then a rename
// without a signal). Every answered decision is in the decision log files exactly once, no
// decision is refused for want of the log, and the peak resident memory stays within the
// documented bound.
func TestServeSoak(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	p, logPath := startServeWithLog(t)
	base := "http://" + p.addr

	bodies := []struct {
		body  []byte
		every int // one request in every this many has this body
	}{
		{bigRequest(t, int(server.DefaultConfig().MaxBodyBytes)), 100},
		{bigRequest(t, 64<<10), 10},
		{[]byte(specRequest), 1},
	}
	pick := func(i int) []byte {
		for _, b := range bodies {
			if i%b.every == 0 {
				return b.body
			}
		}
		return nil
	}

	// The soak ends after target decisions or after the run time, whichever comes first (the
	// machine may be slow or shared); the rotations happen at a third and two thirds of it.
	const target = 3000
	const runTime = 25 * time.Second
	began := time.Now()
	deadline := began.Add(runTime)
	ctx, cancel := context.WithDeadline(t.Context(), deadline)
	defer cancel()

	var (
		mu         sync.Mutex
		answered   = map[string]int{}
		overloaded atomic.Int64
		logRefused atomic.Int64
		failures   atomic.Int64
		sent       atomic.Int64
	)
	record := func(resp *http.Response, err error) {
		if err != nil {
			if ctx.Err() == nil {
				failures.Add(1)
				t.Logf("request failed: %v", err)
			}
			return
		}
		defer resp.Body.Close()
		var doc struct {
			DecisionID string `json:"decision_id"`
			Code       string `json:"code"`
		}
		derr := json.NewDecoder(resp.Body).Decode(&doc)
		switch {
		case resp.StatusCode == http.StatusOK && derr == nil && doc.DecisionID != "":
			mu.Lock()
			answered[doc.DecisionID]++
			mu.Unlock()
		case resp.StatusCode == http.StatusServiceUnavailable && doc.Code == string(coded.Overloaded):
			overloaded.Add(1)
		case doc.Code == "DECISION_LOG_UNAVAILABLE":
			logRefused.Add(1)
		default:
			failures.Add(1)
			t.Logf("unexpected answer: status %d, %+v, %v", resp.StatusCode, doc, derr)
		}
	}
	post := func(c *http.Client, body io.Reader) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/authorize", body)
		if err != nil {
			failures.Add(1)
			return
		}
		req.Header.Set("Content-Type", "application/json")
		record(c.Do(req)) //nolint:bodyclose // record closes the body
	}

	var wg sync.WaitGroup
	// Held connections: 100, re-opened whenever the service closes one.
	holdConnections(ctx, &wg, p.addr, 100)
	// Slow clients: each sends a small body in 10 pieces over about a second.
	for range 4 {
		wg.Go(func() {
			c := &http.Client{Timeout: 20 * time.Second}
			for ctx.Err() == nil {
				post(c, &slowReader{b: []byte(specRequest), chunk: len(specRequest)/10 + 1, pause: 100 * time.Millisecond})
			}
		})
	}
	// Steady clients, keep-alive; each ends after the target decision was sent.
	var steady sync.WaitGroup
	for range 12 {
		steady.Go(func() {
			c := &http.Client{Timeout: 20 * time.Second}
			for ctx.Err() == nil {
				i := int(sent.Add(1))
				if i > target {
					return
				}
				post(c, bytes.NewReader(pick(i)))
			}
		})
	}

	// Rotations: rename + SIGHUP at a third of the run, rename without a signal at two
	// thirds (the service notices that its path names another file).
	rotated := make(chan struct{})
	var rotations atomic.Int64
	go func() {
		defer close(rotated)
		for _, r := range []struct {
			at     time.Duration
			suffix string
			hup    bool
		}{{runTime / 3, ".1", true}, {2 * runTime / 3, ".2", false}} {
			for time.Since(began) < r.at && sent.Load() < int64(r.at*target/runTime) {
				time.Sleep(10 * time.Millisecond)
			}
			if err := os.Rename(logPath, logPath+r.suffix); err != nil {
				t.Errorf("rotate: %v", err)
				return
			}
			if r.hup {
				_ = p.Cmd.Process.Signal(syscall.SIGHUP)
			}
			rotations.Add(1)
		}
	}()

	steady.Wait() // the target was sent and answered, or the run time is over
	cancel()
	wg.Wait()
	<-rotated
	loadTime := time.Since(began)
	peak := p.peakRSS(t)

	require.True(t, p.Alive(), "the service died; stderr:\n%s", p.Stderr)
	p.Signal(t, syscall.SIGTERM)
	require.NoError(t, p.WaitExit(t, 30*time.Second), "stderr:\n%s", p.Stderr)
	t.Logf("load for %v, stopped %v later", loadTime.Round(time.Millisecond), (time.Since(began) - loadTime).Round(time.Millisecond))

	logged := map[string]int{}
	records := 0
	require.Equal(t, int64(2), rotations.Load())
	for _, f := range []string{logPath + ".1", logPath + ".2", logPath} {
		for _, id := range decisionIDs(t, f) {
			logged[id]++
			records++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("in %v: answered %d decisions, %d records in the log files, %d overloaded (503), peak RSS %d MiB (bound %d MiB)",
		loadTime.Round(time.Second), len(answered), records, overloaded.Load(), peak>>20, server.DefaultConfig().MemoryBound()>>20)

	assert.GreaterOrEqual(t, len(answered), 300, "the soak decided too little to mean anything")
	assert.Zero(t, logRefused.Load(), "decisions refused because the log could not be written")
	assert.Zero(t, failures.Load(), "failed requests")
	for id, n := range answered {
		assert.Equal(t, 1, n, "decision %s answered %d times", id, n)
		assert.Equal(t, 1, logged[id], "decision %s is in the log %d times", id, logged[id])
	}
	for id, n := range logged {
		assert.Equal(t, 1, n, "record %s appears %d times", id, n)
	}
	assert.LessOrEqual(t, peak, server.DefaultConfig().MemoryBound(), "peak RSS over the documented bound")
}
