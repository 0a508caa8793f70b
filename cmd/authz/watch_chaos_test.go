package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// chaosWatchConfig is a configuration with the example driver enabled or not, and room for the
// chaos run's watches.
func chaosWatchConfig(enabled bool) string {
	return fmt.Sprintf(`limits:
  maxConnections: 512
plugins:
  - id: example.sandbox
    path: "@self"
    key: example.sandbox
    args: [example-driver]
    enabled: %t
`, enabled)
}

// chaosStream is one watch of the chaos run: open from opened until ended.
type chaosStream struct {
	opened  time.Time
	granted bool
	w       *watcher
}

// TestWatchChaos: a watch never outlives its grant. For AUTHZ_WATCH_CHAOS (10 s by default),
// with 64 watches held open (each reopened, as a client would, once it ends) and decisions
// under load, the state changes every few hundred milliseconds: the worker is SIGKILLed, a
// deny-all policy or the real one is activated (SIGHUP), the plugin is disabled or enabled
// again (SIGHUP). After each change settles, while the service denies the watched request
// (asked twice, before and after the look), no stream that was open before the first ask may
// still be open after the second: such a stream would hold a grant the service now denies.
func TestWatchChaos(t *testing.T) {
	run := 10 * time.Second
	if v := os.Getenv("AUTHZ_WATCH_CHAOS"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		run = d
	}
	dir := t.TempDir()
	bundleDir := filepath.Join(dir, "bundle")
	copyPolicy(t, bundleDir)
	cfg := testutil.WriteFile(t, dir, "config.yaml", chaosWatchConfig(true))
	require.NoError(t, os.Chmod(cfg, 0o600))
	proc := startServeProcess(t, "", "--addr", "127.0.0.1:0", "--config", cfg, "--bundle", bundleDir)
	base := "http://" + proc.addr
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 60*time.Second, proc.Stderr)
	grant, err := os.ReadFile(filepath.Join("..", "..", "examples", "grant.json"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The watches, each reopened once it ends.
	var (
		mu      sync.Mutex
		streams []*chaosStream
		wg      sync.WaitGroup
	)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				opened := time.Now()
				ws, err := openWatch(ctx, base, string(grant))
				if err == nil {
					s := &chaosStream{opened: opened, granted: ws.first["allow"] == true, w: ws}
					mu.Lock()
					streams = append(streams, s)
					mu.Unlock()
					select {
					case <-ws.ended:
					case <-ctx.Done():
						return
					}
				}
				// A client asks again a little later, not in a tight loop.
				select {
				case <-time.After(50 * time.Millisecond):
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	// Decisions under load.
	var decisions atomic.Int64
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := decide(ctx, c, base, string(grant)); err == nil {
					decisions.Add(1)
				}
			}
		}()
	}

	actions := map[string]int{}
	checks, stale := 0, 0
	// seen: a watch opened on a grant was revoked, and a deny was checked.
	seen := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range streams {
			if kind, _, _ := s.w.lastEvent(); s.granted && kind == "revoke" {
				return checks > 0
			}
		}
		return false
	}
	// The run lasts run, and goes on (within a bound) until what it checks has been seen:
	// random changes can keep the service denying for the whole run on a busy machine. Past
	// run, the changes alternate between a grant (real policy, plugin enabled) and a deny
	// (plugin disabled) instead of being drawn.
	deadline, bound := time.Now().Add(run), time.Now().Add(run+time.Minute)
	for now := time.Now(); now.Before(deadline) || (now.Before(bound) && !seen()); now = time.Now() {
		a := rand.IntN(5)
		if now.After(deadline) {
			a = 3 // disable the plugin while the service grants
			if granting, err := decide(ctx, c, base, string(grant)); err == nil && !granting {
				require.NoError(t, os.RemoveAll(bundleDir))
				copyPolicy(t, bundleDir)
				a = 4 // enable it, on the real policy, while it denies
			}
		}
		switch a {
		case 0, 1:
			if p := onlyPlugin(t, c, base); p.Worker != nil && p.Worker.PID > 0 {
				_ = syscall.Kill(p.Worker.PID, syscall.SIGKILL)
				actions["kill worker"]++
			}
		case 2:
			require.NoError(t, os.RemoveAll(bundleDir))
			require.NoError(t, os.MkdirAll(bundleDir, 0o755))
			if rand.IntN(2) == 0 {
				testutil.WriteFile(t, bundleDir, "deny.rego", policytest.DenyAllModule)
				actions["deny-all policy"]++
			} else {
				copyPolicy(t, bundleDir)
				actions["real policy"]++
			}
			proc.Signal(t, syscall.SIGHUP)
		case 3, 4:
			enabled := a == 4
			require.NoError(t, os.WriteFile(cfg, []byte(chaosWatchConfig(enabled)), 0o600))
			proc.Signal(t, syscall.SIGHUP)
			actions[fmt.Sprintf("plugin enabled=%t", enabled)]++
		}
		// Let the change settle: a revoke takes milliseconds; a SIGHUP's reload a little more.
		time.Sleep(time.Duration(300+rand.IntN(300)) * time.Millisecond) // the chaos pace, not a synchronisation
		asked := time.Now()
		first, err := decide(ctx, c, base, string(grant))
		if err != nil || first {
			continue
		}
		mu.Lock()
		var open []*chaosStream
		for _, s := range streams {
			if s.granted && s.opened.Before(asked) && !isEnded(s.w) {
				open = append(open, s)
			}
		}
		mu.Unlock()
		time.Sleep(150 * time.Millisecond) // the revoke's allowance after the deny was seen
		again, err := decide(ctx, c, base, string(grant))
		if err != nil || again {
			continue // the state changed meanwhile (a worker restarted): no verdict
		}
		checks++
		for _, s := range open {
			if !isEnded(s.w) {
				stale++
			}
		}
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	granted, revokes := 0, 0
	for _, s := range streams {
		if s.granted {
			granted++
		}
		if kind, _, _ := s.w.lastEvent(); kind == "revoke" {
			revokes++
		}
	}
	t.Logf("watch chaos for %v: actions %v; %d watches opened (%d on a grant), %d revoked; %d decisions under load; %d checks while denying: %d stale streams",
		run, actions, len(streams), granted, revokes, decisions.Load(), checks, stale)
	assert.Zero(t, stale, "streams still open on a grant the service denies")
	assert.Positive(t, checks, "the run saw the service deny")
	assert.Positive(t, granted, "the run opened watches on a grant")
	assert.Positive(t, revokes)
}

// isEnded reports whether the watcher's stream has ended.
func isEnded(w *watcher) bool {
	select {
	case <-w.ended:
		return true
	default:
		return false
	}
}

// decide posts body to /v1/authorize and reports whether it was granted (status 200 and
// "allow": true).
func decide(ctx context.Context, c *http.Client, base, body string) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, base+"/v1/authorize", strings.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var doc map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return false, err
	}
	return resp.StatusCode == http.StatusOK && doc["allow"] == true, nil
}
