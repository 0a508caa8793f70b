//go:build unix

package pluginhost

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testdrivers/checks"
	"github.com/authz-dev/authz/internal/testutil"
)

// The test binary serves as the driver of internal/testdrivers/checks when started with its
// marker; init runs before TestMain, so no other test file needs to know it.
func init() {
	if len(os.Args) > 1 && os.Args[1] == checks.Marker {
		os.Exit(checks.Main(os.Args[2:]))
	}
}

// checksPlugin configures the test driver as the checks driver with control directory dir.
func checksPlugin(tb testing.TB, id, dir string, flags ...string) PluginConfig {
	tb.Helper()
	path, sum := driverBinary(tb)
	args := append([]string{checks.Marker, "-plugin-key", "checks." + id, "-dir", dir}, flags...)
	return PluginConfig{ID: id, Path: path, SHA256: sum, Args: args, User: fixtureUser()} // it writes to dir, the test's
}

// startChecksHost starts a host with one checks driver and returns it with the driver's worker.
func startChecksHost(t *testing.T, change func(*Config), flags ...string) (h *Host, w *snapshot.Worker, dir string) {
	t.Helper()
	dir = t.TempDir()
	cfg := testConfig(t, checksPlugin(t, "chk", dir, flags...))
	if change != nil {
		change(&cfg)
	}
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	w, ok := h.Worker("chk")
	require.True(t, ok)
	return h, w, dir
}

func hold(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, checks.HoldFile), nil, 0o600))
}

func unhold(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.Remove(filepath.Join(dir, checks.HoldFile)))
}

// TestConfigCheckFailureCachedBriefly: a check that fails is not asked again for every decision
// within configCheck.failureTTL, and is asked again after it.
func TestConfigCheckFailureCachedBriefly(t *testing.T) {
	runParallel(t)
	h, w, dir := startChecksHost(t, func(c *Config) { c.ConfigCheck.FailureTTL = 500 * time.Millisecond }, "-fail")
	cfg := map[string]any{"region": "eu"}
	const asks = 20
	for range asks {
		valid, err := h.ConfigValid(t.Context(), "chk", w, "example", cfg)
		require.False(t, valid)
		require.Error(t, err)
		assert.Equal(t, coded.ConfigCheckFailed, coded.CodeOf(err))
	}
	t.Logf("%d checks of one failing config made %d RPCs", asks, checks.Calls(dir))
	assert.Equal(t, 1, checks.Calls(dir), "a failure is kept for failureTTL")
	waitFor(t, 30*time.Second, "the failure to expire and the driver to be asked again", func() bool {
		valid, _ := h.ConfigValid(t.Context(), "chk", w, "example", cfg)
		return !valid && checks.Calls(dir) == 2
	})
}

// TestConfigCheckCoalesced: concurrent identical checks make one RPC, and every caller gets its
// answer.
func TestConfigCheckCoalesced(t *testing.T) {
	runParallel(t)
	h, w, dir := startChecksHost(t, nil)
	hold(t, dir)
	const callers = 8
	var wg sync.WaitGroup
	results := make(chan bool, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			valid, err := h.ConfigValid(t.Context(), "chk", w, "example", map[string]any{"same": true})
			results <- err == nil && valid
		}()
	}
	waitFor(t, 30*time.Second, "every caller to wait on the check", func() bool {
		return checks.Calls(dir) >= callers || h.checks.waiting() == callers
	})
	unhold(t, dir)
	wg.Wait()
	close(results)
	for ok := range results {
		assert.True(t, ok)
	}
	t.Logf("%d concurrent identical checks made %d RPCs", callers, checks.Calls(dir))
	assert.Equal(t, 1, checks.Calls(dir))
}

// TestConfigCheckAnswerBounded: a driver that answers a config check with megabytes of text
// costs the host little memory, and what is kept of its text is short.
//
// Sequential: it counts what the whole process allocates.
func TestConfigCheckAnswerBounded(t *testing.T) {
	const big = 4 << 20
	for _, flag := range []string{"-error-bytes", "-reason-bytes"} {
		t.Run(flag, func(t *testing.T) {
			h, w, _ := startChecksHost(t, nil, flag, fmt.Sprint(big))
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			valid, err := h.ConfigValid(t.Context(), "chk", w, "example", map[string]any{})
			runtime.ReadMemStats(&after)
			require.False(t, valid)
			require.Error(t, err)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("a %d-byte answer: the host allocated %d bytes; error %d bytes", big, allocated, len(err.Error()))
			assert.Less(t, allocated, uint64(1<<20), "the answer did not reach the host's memory")
			assert.LessOrEqual(t, len(err.Error()), 8<<10, "what is kept of the driver's text is short")
		})
	}
}

// TestConfigCheckBreaker: after configCheck.breakerTimeouts consecutive time-outs a plugin's
// checks fail fast without asking the driver; after the cool-down one probe is let through, and
// an answer closes the breaker.
func TestConfigCheckBreaker(t *testing.T) {
	runParallel(t)
	h, w, dir := startChecksHost(t, func(c *Config) {
		c.ConfigCheckTimeout = 100 * time.Millisecond
		c.ConfigCheck.BreakerTimeouts = 3
		c.ConfigCheck.BreakerCooldown = 300 * time.Millisecond
	})
	hold(t, dir)
	n := 0
	ask := func() (bool, error) {
		n++ // a new config each time: no cached answer
		return h.ConfigValid(t.Context(), "chk", w, "example", map[string]any{"n": n})
	}
	for range 3 {
		valid, err := ask()
		require.False(t, valid)
		assert.Equal(t, coded.ConfigCheckTimeout, coded.CodeOf(err), "%v", err)
	}
	require.Equal(t, 3, checks.Calls(dir))
	start := time.Now()
	valid, err := ask()
	t.Logf("after 3 time-outs: the next check answered in %s, %d RPCs", time.Since(start), checks.Calls(dir))
	require.False(t, valid)
	assert.Equal(t, coded.ConfigCheckUnavailable, coded.CodeOf(err), "%v", err)
	assert.Equal(t, 3, checks.Calls(dir), "the open breaker does not ask the driver")

	unhold(t, dir)
	waitFor(t, 30*time.Second, "a probe after the cool-down", func() bool {
		valid, _ := ask()
		return valid
	})
	calls := checks.Calls(dir)
	valid, err = ask()
	require.NoError(t, err)
	assert.True(t, valid)
	assert.Equal(t, calls+1, checks.Calls(dir), "the closed breaker asks the driver")
}

// TestConfigCheckShed: past configCheck.maxConcurrent checks of a plugin in progress, the next
// waits at most configCheck.maxWait and is then "not valid" without asking the driver.
func TestConfigCheckShed(t *testing.T) {
	runParallel(t)
	h, w, dir := startChecksHost(t, func(c *Config) {
		c.ConfigCheck.MaxConcurrent = 2
		c.ConfigCheck.MaxWait = 50 * time.Millisecond
	})
	hold(t, dir)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = h.ConfigValid(t.Context(), "chk", w, "example", map[string]any{"held": i})
		}()
	}
	waitFor(t, 30*time.Second, "two checks at the driver", func() bool { return checks.Calls(dir) == 2 })
	start := time.Now()
	valid, err := h.ConfigValid(t.Context(), "chk", w, "example", map[string]any{"third": true})
	elapsed := time.Since(start)
	t.Logf("third check answered in %s; %d RPCs", elapsed, checks.Calls(dir))
	assert.False(t, valid)
	assert.Equal(t, coded.ConfigCheckShed, coded.CodeOf(err), "%v", err)
	assert.Equal(t, 2, checks.Calls(dir))
	unhold(t, dir)
	wg.Wait()
}

// TestConfigCheckFailuresLogged: failed checks are logged at WARN, at most one line per plugin
// per interval with the count of those left out, the driver's text escaped.
func TestConfigCheckFailuresLogged(t *testing.T) {
	runParallel(t)
	var logged testutil.SyncBuffer
	dir := t.TempDir()
	cfg := testConfig(t, checksPlugin(t, "chk", dir, "-error-text", "no\x1b[31m\nforged line"))
	cfg.Logger = testLogger(t, &logged)
	cfg.ConfigCheck.FailureTTL = time.Nanosecond // every check asks the driver
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	w, ok := h.Worker("chk")
	require.True(t, ok)
	for i := range 5 {
		valid, err := h.ConfigValid(t.Context(), "chk", w, "example", map[string]any{"i": i})
		require.False(t, valid)
		require.Error(t, err)
	}
	out := logged.String()
	lines := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "[WARN]") && strings.Contains(l, "config check") {
			lines++
			assert.Contains(t, l, `\x1b[31m`, "driver text escaped")
		}
	}
	t.Logf("5 failed checks: %d WARN lines", lines)
	assert.Equal(t, 1, lines, "rate-limited: one line per plugin per interval\n%s", out)
	assert.NotContains(t, out, "\x1b[31m")
	assert.NotContains(t, out, "\nforged line")

	h.checks.logEvery = 0 // the next failure's line says how many were left out
	_, _ = h.ConfigValid(t.Context(), "chk", w, "example", map[string]any{"i": "last"})
	assert.Contains(t, logged.String(), "suppressed=4")
}

// TestConfigCheckKeptAnswerTakesNoLock: a kept answer is read without the config checks' lock,
// so a decision whose check is kept never waits on another check's bookkeeping.
func TestConfigCheckKeptAnswerTakesNoLock(t *testing.T) {
	runParallel(t)
	h, w, dir := startChecksHost(t, nil)
	cfg := map[string]any{"region": "eu"}
	valid, err := h.ConfigValid(t.Context(), "chk", w, "example", cfg)
	require.NoError(t, err)
	require.True(t, valid)

	h.checks.mu.Lock()
	locked := true
	defer func() {
		if locked {
			h.checks.mu.Unlock()
		}
	}()
	answered := make(chan bool, 1)
	go func() {
		valid, err := h.ConfigValid(context.Background(), "chk", w, "example", map[string]any{"region": "eu"})
		answered <- err == nil && valid
	}()
	select {
	case ok := <-answered:
		assert.True(t, ok)
	case <-time.After(10 * time.Second):
		t.Error("a kept answer waited on the config checks' lock")
	}
	h.checks.mu.Unlock()
	locked = false
	assert.Equal(t, 1, checks.Calls(dir), "the answer was kept")
}

// TestConfigCheckKeptAnswerAllocatesNothing: a decision whose config check is kept reads the
// answer without making the config's canonical JSON: no allocation.
//
// Sequential: it counts what the whole process allocates.
func TestConfigCheckKeptAnswerAllocatesNothing(t *testing.T) {
	h, w, dir := startChecksHost(t, nil)
	asked := map[string]any{"region": "eu", "size": json.Number("2"), "tags": []any{"a", true, nil}}
	valid, err := h.ConfigValid(t.Context(), "chk", w, "example", asked)
	require.NoError(t, err)
	require.True(t, valid)
	same := map[string]any{"tags": []any{"a", true, nil}, "size": json.Number("2"), "region": "eu"} // decoded from another body
	ctx := t.Context()
	allocs := testing.AllocsPerRun(1000, func() {
		if valid, err := h.ConfigValid(ctx, "chk", w, "example", same); err != nil || !valid {
			t.Fatalf("kept answer: %v %v", valid, err)
		}
	})
	assert.Zero(t, allocs, "allocations per kept answer")
	assert.Equal(t, 1, checks.Calls(dir), "the answer was kept")
}

// TestKeptConfigMatch: a kept answer is found only for a config of the same value and types: the
// members of an object in any order, nothing else (another number literal, another type, one
// more member, another array order).
func TestKeptConfigMatch(t *testing.T) {
	t.Parallel()
	kept, _ := keptConfig([]byte(`{"a":1,"b":["x",true,null,{"c":1.50}],"d":{"e":"f"}}`))
	require.NotNil(t, kept)
	for _, tt := range []struct {
		config string
		equal  bool
	}{
		{`{"d":{"e":"f"},"b":["x",true,null,{"c":1.50}],"a":1}`, true},
		{`{"a":1.0,"b":["x",true,null,{"c":1.50}],"d":{"e":"f"}}`, false},
		{`{"a":1,"b":["x",true,null,{"c":1.5}],"d":{"e":"f"}}`, false},
		{`{"a":"1","b":["x",true,null,{"c":1.50}],"d":{"e":"f"}}`, false},
		{`{"a":1,"b":[true,"x",null,{"c":1.50}],"d":{"e":"f"}}`, false},
		{`{"a":1,"b":["x",true,null,{"c":1.50}],"d":{"e":"f"},"g":null}`, false},
		{`{"a":1,"b":["x",true,false,{"c":1.50}],"d":{"e":"f"}}`, false},
		{`{"a":1,"b":["x",true,null,{"c":1.50}],"d":{"e":"F"}}`, false},
	} {
		var config map[string]any
		dec := json.NewDecoder(strings.NewReader(tt.config))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&config))
		assert.Equal(t, tt.equal, equalConfig(kept, config, 0), tt.config)
		if tt.equal {
			a, _ := hashConfig(kept, 0)
			b, _ := hashConfig(config, 0)
			assert.Equal(t, a, b, tt.config)
		}
	}
	_, ok := hashConfig(map[string]any{"n": 1}, 0) // an int is no type the decoder makes
	assert.False(t, ok)
}
