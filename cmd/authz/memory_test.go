package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/service"
	"github.com/authz-dev/authz/internal/testutil"
)

// bigRequest is specRequest with lease.metadata.padding: an array of small objects that makes
// the body about size bytes, the shape that costs the most memory once decoded.
func bigRequest(t testing.TB, size int) []byte {
	t.Helper()
	var req map[string]any
	require.NoError(t, json.Unmarshal([]byte(specRequest), &req))
	var pad bytes.Buffer
	pad.WriteString("[")
	for i := 0; pad.Len() < size-len(specRequest)-64; i++ {
		if i > 0 {
			pad.WriteString(",")
		}
		fmt.Fprintf(&pad, `{"k":"v%d","n":%d}`, i%10, i%100)
	}
	pad.WriteString("]")
	req["lease"].(map[string]any)["metadata"].(map[string]any)["padding"] = json.RawMessage(pad.Bytes())
	b, err := json.Marshal(req)
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), size)
	return b
}

// loadCPU keeps every CPU of the machine busy until stop is called: the service then competes
// for the CPU as on a loaded machine, where its garbage collector falls behind.
func loadCPU() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 * runtime.NumCPU() {
		wg.Go(func() {
			for x := uint64(1); ; x = x*6364136223846793005 + 1 {
				if x%(1<<16) == 0 {
					select {
					case <-done:
						return
					default:
					}
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// TestServeMemoryBoundedUnderConcurrentBigBodies sends 60 bodies of just under 1 MiB at once,
// five times, while the machine's CPUs are kept busy: the service admits a bounded number,
// answers the rest 503 with Retry-After, and its peak resident memory stays within the bound
// docs/service.md states for the default configuration, and within a 256 MiB container.
func TestServeMemoryBoundedUnderConcurrentBigBodies(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	facts := testutil.WriteFile(t, t.TempDir(), "facts.json", specFacts)
	p := startServeProcess(t, "", "--facts", facts, "--addr", "127.0.0.1:0")
	base := "http://" + p.addr
	body := bigRequest(t, int(server.DefaultConfig().MaxBodyBytes))
	defer loadCPU()()
	for round := range 5 {
		burst(t, base+"/v1/authorize", body, round)
	}
	peak := p.peakRSS(t)
	t.Logf("peak RSS (VmHWM) under 5 × 60 concurrent %d-byte bodies on busy CPUs: %d MiB (bound %d MiB)", len(body), peak>>20, server.DefaultConfig().MemoryBound()>>20)
	assert.LessOrEqual(t, peak, server.DefaultConfig().MemoryBound(), "peak RSS %d MiB over the documented bound", peak>>20)
	assert.LessOrEqual(t, peak, int64(256<<20), "peak RSS %d MiB: the defaults do not fit a 256 MiB container", peak>>20)
	require.True(t, p.Alive())
	p.Signal(t, syscall.SIGTERM)
	assert.NoError(t, p.WaitExit(t, 60*time.Second))
}

// burst sends 60 bodies at once to url and checks the answers: decided, or 503 with Retry-After.
func burst(t *testing.T, url string, body []byte, round int) {
	t.Helper()
	const clients = 60
	var wg sync.WaitGroup
	statuses := make([]int, clients)
	retryAfter := make([]string, clients)
	errs := make([]error, clients)
	start := make(chan struct{})
	for i := range clients {
		wg.Go(func() {
			c := &http.Client{Timeout: 60 * time.Second}
			<-start
			resp, err := c.Post(url, "application/json", bytes.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			statuses[i], retryAfter[i] = resp.StatusCode, resp.Header.Get("Retry-After")
		})
	}
	close(start)
	wg.Wait()

	granted := 0
	for i := range clients {
		require.NoError(t, errs[i], "client %d", i)
		switch statuses[i] {
		case http.StatusOK:
			granted++
		case http.StatusServiceUnavailable:
			assert.NotEmpty(t, retryAfter[i], "a 503 for overload says when to retry")
		default:
			t.Errorf("client %d: status %d", i, statuses[i])
		}
	}
	assert.Positive(t, granted, "round %d: some requests were decided", round)
}

// bigAuthZENBatch is an AuthZEN evaluations request of about size bytes: the subject of
// specRequest's lease with lease.metadata.padding an array of empty objects (the shape that
// costs the most once decoded), and two evaluations that take it as their default.
func bigAuthZENBatch(t testing.TB, size int) []byte {
	t.Helper()
	var pad bytes.Buffer
	pad.WriteString("[")
	for i := 0; pad.Len() < size-1024; i++ {
		if i > 0 {
			pad.WriteString(",")
		}
		pad.WriteString("{}")
	}
	pad.WriteString("]")
	md := map[string]any{"driver": "sandbox", "sandboxProviderPlugin": true, "pluginId": "test.plugin", "provider": "daytona", "padding": json.RawMessage(pad.Bytes())}
	b, err := json.Marshal(map[string]any{
		"subject":     map[string]any{"type": "lease", "id": "lease-1", "properties": map[string]any{"leasePolicy": "ephemeral", "metadata": md}},
		"resource":    map[string]any{"type": "environment", "id": "env-1", "properties": map[string]any{"driver": "sandbox", "config": map[string]any{"provider": "daytona"}}},
		"action":      map[string]any{"name": "openDuplexChannel"},
		"evaluations": []any{map[string]any{}, map[string]any{"context": map[string]any{"command": []string{"sh"}}}},
	})
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), size)
	return b
}

// TestServeMemoryBoundedUnderConcurrentBigAuthZENBatches is the test above for AuthZEN
// evaluations requests, which are decoded in full before their evaluations are decided: 60
// batches of just under 1 MiB at once, five times, on busy CPUs, keep the peak resident memory
// within the documented bound and a 256 MiB container.
func TestServeMemoryBoundedUnderConcurrentBigAuthZENBatches(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	facts := testutil.WriteFile(t, t.TempDir(), "facts.json", specFacts)
	p := startServeProcess(t, "", "--facts", facts, "--addr", "127.0.0.1:0")
	body := bigAuthZENBatch(t, int(server.DefaultConfig().MaxBodyBytes))
	defer loadCPU()()
	for round := range 5 {
		burst(t, "http://"+p.addr+"/access/v1/evaluations", body, round)
	}
	peak := p.peakRSS(t)
	t.Logf("peak RSS (VmHWM) under 5 × 60 concurrent %d-byte AuthZEN batches on busy CPUs: %d MiB (bound %d MiB)", len(body), peak>>20, server.DefaultConfig().MemoryBound()>>20)
	assert.LessOrEqual(t, peak, server.DefaultConfig().MemoryBound(), "peak RSS %d MiB over the documented bound", peak>>20)
	assert.LessOrEqual(t, peak, int64(256<<20), "peak RSS %d MiB: the defaults do not fit a 256 MiB container", peak>>20)
	require.True(t, p.Alive())
	p.Signal(t, syscall.SIGTERM)
	assert.NoError(t, p.WaitExit(t, 60*time.Second))
}

// TestServeAppliesGCSettings: the service sets the garbage collector's target
// (service.DefaultGCPercent) and its soft memory limit (the live memory its limits allow, below the bound) unless
// GOGC or GOMEMLIMIT say otherwise, as the runtime reports them on /metrics.
func TestServeAppliesGCSettings(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	facts := testutil.WriteFile(t, t.TempDir(), "facts.json", specFacts)
	for _, tc := range []struct {
		name         string
		shell        string
		wantGOGC     float64
		wantMemLimit float64
	}{
		{"defaults", "unset GOGC GOMEMLIMIT;", service.DefaultGCPercent, float64(server.DefaultConfig().MemoryLimit())},
		{"GOGC and GOMEMLIMIT win", "export GOGC=50 GOMEMLIMIT=300MiB;", 50, 300 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startServeProcess(t, tc.shell, "--facts", facts, "--addr", "127.0.0.1:0")
			resp, err := http.Get("http://" + p.addr + "/metrics")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			got := map[string]float64{}
			for _, line := range strings.Split(string(body), "\n") {
				if f := strings.Fields(line); len(f) == 2 && (f[0] == "go_gc_gogc_percent" || f[0] == "go_gc_gomemlimit_bytes") {
					v, err := strconv.ParseFloat(f[1], 64)
					require.NoError(t, err)
					got[f[0]] = v
				}
			}
			assert.Equal(t, map[string]float64{"go_gc_gogc_percent": tc.wantGOGC, "go_gc_gomemlimit_bytes": tc.wantMemLimit}, got)
		})
	}
}
