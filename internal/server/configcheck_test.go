package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
)

// twoPluginFacts are test.plugin, whose config checks answer at once, and slow.plugin, whose
// checks wait.
const twoPluginFacts = `{
  "plugins": [
    {"id": "test.plugin", "key": "acme.daytona", "status": "ready",
     "manifest": {"environmentDrivers": [{"driverKey": "daytona", "kind": "sandbox_provider",
        "sandboxCapabilities": {"duplexCommandStream": true}}]}},
    {"id": "slow.plugin", "key": "acme.slow", "status": "ready",
     "manifest": {"environmentDrivers": [{"driverKey": "daytona", "kind": "sandbox_provider",
        "sandboxCapabilities": {"duplexCommandStream": true}}]}}
  ],
  "workers": {
    "test.plugin": {"supportedMethods": ["duplexChannelOpen"], "configValid": true},
    "slow.plugin": {"supportedMethods": ["duplexChannelOpen"], "configValid": true}
  },
  "builtinProviders": {}
}`

// slowChecks are facts whose slow.plugin config checks wait until release is closed, or for
// delay when it is set, as a driver that hangs would; an answer is kept per config, as the
// plugin host keeps it. It offers the checks ahead of the decision (snapshot.ConfigCheckPreparer).
type slowChecks struct {
	*server.StaticFacts
	release chan struct{}
	delay   time.Duration
	waiting atomic.Int64 // checks waiting now
	mu      sync.Mutex
	answers map[string]bool // by the config's "n"
}

func newSlowChecks(t testing.TB, delay time.Duration) *slowChecks {
	t.Helper()
	path := filepath.Join(t.TempDir(), "facts.json")
	require.NoError(t, os.WriteFile(path, []byte(twoPluginFacts), 0o600))
	sf, err := server.LoadStaticFacts(path)
	require.NoError(t, err)
	return &slowChecks{StaticFacts: sf, release: make(chan struct{}), delay: delay, answers: map[string]bool{}}
}

func configName(config any) string {
	m, _ := config.(map[string]any)
	return fmt.Sprint(m["n"])
}

func (f *slowChecks) answer(config any) (valid, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	valid, ok = f.answers[configName(config)]
	return valid, ok
}

func (f *slowChecks) check(ctx context.Context, config any) (bool, error) {
	f.waiting.Add(1)
	defer f.waiting.Add(-1)
	var timeout <-chan time.Time
	if f.delay > 0 {
		t := time.NewTimer(f.delay)
		defer t.Stop()
		timeout = t.C
	}
	valid, err := false, error(nil)
	select {
	case <-f.release:
		valid = true
	case <-timeout:
		err = errors.New("the driver did not answer in time")
	case <-ctx.Done():
		return false, ctx.Err()
	}
	f.mu.Lock()
	f.answers[configName(config)] = valid
	f.mu.Unlock()
	return valid, err
}

func (f *slowChecks) ConfigValid(ctx context.Context, pluginID string, w *snapshot.Worker, driverKey string, config any) (bool, error) {
	if pluginID != "slow.plugin" {
		return f.StaticFacts.ConfigValid(ctx, pluginID, w, driverKey, config)
	}
	if valid, ok := f.answer(config); ok {
		return valid, nil
	}
	return f.check(ctx, config)
}

func (f *slowChecks) PrepareConfigCheck(pluginID string, _ *snapshot.Worker, _ string, config any) func(context.Context) (bool, error) {
	if _, ok := f.answer(config); ok || pluginID != "slow.plugin" {
		return nil
	}
	return func(ctx context.Context) (bool, error) { return f.check(ctx, config) }
}

// pluginRequest is the contract's request for plugin id with environment config number n.
func pluginRequest(t testing.TB, id string, n int) string {
	return fixture(t, func(req map[string]any) {
		metadata(req)["pluginId"] = id
		req["environment"].(map[string]any)["config"] = map[string]any{"provider": "daytona", "n": n}
	})
}

// postStatus posts body and returns the status, or 0 when the request failed; for goroutines.
func postStatus(ctx context.Context, url, body string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var doc map[string]any
	if json.NewDecoder(resp.Body).Decode(&doc) != nil {
		return 0
	}
	return resp.StatusCode
}

// TestConfigCheckHoldsNoDecidingSlot: with more callers of a plugin waiting in its config check
// than there are deciding slots, a decision on another plugin is answered at once.
func TestConfigCheckHoldsNoDecidingSlot(t *testing.T) {
	const deciding = 2
	facts := newSlowChecks(t, 0)
	s := newServer(t, withFacts(facts), withConfig(func(c *server.Config) {
		c.Limits.MaxDeciding = deciding
		c.Limits.QueueWait = 500 * time.Millisecond
	}))
	base := startHTTP(t, s)

	const slowCallers = 3 * deciding
	var wg sync.WaitGroup
	slowStatus := make(chan int, slowCallers)
	for i := range slowCallers {
		body := pluginRequest(t, "slow.plugin", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			slowStatus <- postStatus(t.Context(), base+"/v1/authorize", body)
		}()
	}
	waitUntil(t, 10*time.Second, "the slow plugin's checks to fill the deciding slots", func() bool {
		return facts.waiting.Load() >= deciding
	})

	a := post(t, base+"/v1/authorize", pluginRequest(t, "test.plugin", 0))
	t.Logf("with %d checks of slow.plugin waiting: test.plugin answered %d", facts.waiting.Load(), a.status)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	assert.Equal(t, true, a.json(t)["allow"])

	close(facts.release)
	wg.Wait()
	close(slowStatus)
	for st := range slowStatus {
		assert.Equal(t, http.StatusOK, st, "the slow plugin's decisions are decided once their checks answer")
	}
}

// TestConfigCheckLoadOtherPluginThroughput measures the decisions on test.plugin while eight
// callers of slow.plugin send new configs whose checks each take two seconds (a driver that
// answers at configCheckTimeout). It prints the figures; it asserts only that test.plugin is
// never answered 503.
func TestConfigCheckLoadOtherPluginThroughput(t *testing.T) {
	facts := newSlowChecks(t, 2*time.Second)
	s := newServer(t, withFacts(facts), withConfig(func(c *server.Config) {
		c.Limits.QueueWait = time.Second // the default
	}))
	base := startHTTP(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()

	l := loadBeside(ctx, base, 8, func(n int) string { return pluginRequest(t, "slow.plugin", n) }, func(n int) string { return pluginRequest(t, "test.plugin", n) })
	t.Logf("in %.1fs beside 8 callers of a plugin whose checks take 2s: test.plugin answered %d (%.0f/s), %d times 503, %d other; slow.plugin %d",
		l.elapsed.Seconds(), l.fastOK, float64(l.fastOK)/l.elapsed.Seconds(), l.fastOverloaded, l.fastOther, l.slowAnswered)
	assert.Zero(t, l.fastOverloaded, "a decision on another plugin is never refused for the slow plugin's checks")
	assert.Positive(t, l.fastOK)
}

// loadFigures is what loadBeside measured.
type loadFigures struct {
	elapsed                                         time.Duration
	fastOK, fastOverloaded, fastOther, slowAnswered int64
}

// loadBeside runs slowCallers callers of slowReq beside two callers of fastReq until ctx ends
// (each request numbered anew, so each a new config) and counts what the fast callers were
// answered: 200, 503, or anything else.
func loadBeside(ctx context.Context, base string, slowCallers int, slowReq, fastReq func(n int) string) loadFigures {
	var n atomic.Int64
	var wg sync.WaitGroup
	var fastOK, fastOverloaded, fastOther, slowAnswered atomic.Int64
	loop := func(req func(int) string, count func(status int)) {
		defer wg.Done()
		for ctx.Err() == nil {
			st := postStatus(ctx, base+"/v1/authorize", req(int(n.Add(1))))
			if ctx.Err() == nil {
				count(st)
			}
		}
	}
	for range slowCallers {
		wg.Add(1)
		go loop(slowReq, func(int) { slowAnswered.Add(1) })
	}
	start := time.Now()
	for range 2 {
		wg.Add(1)
		go loop(fastReq, func(st int) {
			switch st {
			case http.StatusOK:
				fastOK.Add(1)
			case http.StatusServiceUnavailable:
				fastOverloaded.Add(1)
			default:
				fastOther.Add(1)
			}
		})
	}
	wg.Wait()
	return loadFigures{elapsed: time.Since(start), fastOK: fastOK.Load(), fastOverloaded: fastOverloaded.Load(),
		fastOther: fastOther.Load(), slowAnswered: slowAnswered.Load()}
}

// waitUntil polls cond every millisecond until it holds or timeout passes.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}
