package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// holdConnections keeps n connections to addr open until ctx ends: each one that the server
// closes is dialled again after a short pause. It returns how many were dialled.
func holdConnections(ctx context.Context, wg *sync.WaitGroup, addr string, n int) *atomic.Int64 {
	var dialled atomic.Int64
	for range n {
		wg.Go(func() {
			var d net.Dialer
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					sleepCtx(ctx, 20*time.Millisecond)
					continue
				}
				dialled.Add(1)
				stop := context.AfterFunc(ctx, func() { c.Close() })
				_, _ = c.Read(make([]byte, 1)) // until the server or ctx closes it
				stop()
				c.Close()
				sleepCtx(ctx, 20*time.Millisecond)
			}
		})
	}
	return &dialled
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// TestServeUnderHeldConnections runs the service with its example driver under a low
// descriptor limit (ulimit -n 128) while 250 connections are held open and re-opened as
// soon as they are closed: legitimate requests are still answered, the driver's worker is
// restarted after it is killed, and accept errors do not flood the log.
func TestServeUnderHeldConnections(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	p := startServeProcess(t, "ulimit -n 128;", "--addr", "127.0.0.1:0")
	base := "http://" + p.addr
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	testutil.WaitReady(t, c, base, 60*time.Second, p.Stderr)
	before := onlyPlugin(t, c, base)
	require.NotNil(t, before.Worker)
	assert.False(t, sigpipeIgnored(t, before.Worker.PID), "the plugin inherited an ignored SIGPIPE")

	grant, err := os.ReadFile(filepath.Join("..", "..", "examples", "grant.json"))
	require.NoError(t, err)
	decide := func() {
		t.Helper()
		status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", string(grant))
		require.Equal(t, http.StatusOK, status, "%v", doc)
		assert.Equal(t, true, doc["allow"], "%v", doc)
	}

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	dialled := holdConnections(ctx, &wg, p.addr, 250)
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool { return dialled.Load() >= 250 }, 20*time.Second, 10*time.Millisecond)
	started := time.Now()

	for range 5 {
		decide()
	}

	// Kill the driver's worker: the supervisor starts a new one, which needs descriptors.
	require.NoError(t, syscall.Kill(before.Worker.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		s := onlyPlugin(t, c, base)
		return s.Status == "ready" && s.Worker != nil && s.Worker.PID != before.Worker.PID && s.Restarts > before.Restarts
	}, 30*time.Second, 100*time.Millisecond, "the worker was not restarted; stderr:\n%s", p.Stderr)
	decide()

	cancel()
	wg.Wait()
	elapsed := time.Since(started)
	log := p.Stderr.String()
	assert.NotContains(t, log, "too many open files", "the service ran out of descriptors")
	acceptLines := strings.Count(log, "accepting a connection failed") + strings.Count(log, "http: Accept error")
	assert.LessOrEqual(t, acceptLines, int(elapsed/time.Second)+1, "accept errors are logged at most once a second")
	t.Logf("%d connections dialled in %v; %d accept-error lines", dialled.Load(), elapsed.Round(time.Millisecond), acceptLines)

	require.True(t, p.Alive())
	p.Signal(t, syscall.SIGTERM)
	assert.NoError(t, p.WaitExit(t, 30*time.Second))
}

// sigpipeIgnored reports whether process pid ignores SIGPIPE (its SigIgn mask).
func sigpipeIgnored(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64)
			require.NoError(t, err)
			return mask&(1<<(uint(syscall.SIGPIPE)-1)) != 0
		}
	}
	t.Fatalf("no SigIgn in /proc/%d/status", pid)
	return false
}
