//go:build unix

package pluginhost

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
)

// rssKiB is this process's resident set size (Linux /proc).
func rssKiB(tb testing.TB) int {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(tb, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			require.NoError(tb, err)
			return n
		}
	}
	tb.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// TestBrokerFloodIsRefused: a driver that loops broker.Accept costs the host no goroutine per
// message, and the host ends it, saying why in lastError. An honest plugin beside it stays
// ready.
//
// Sequential: it measures the goroutines and resident memory of the whole process.
func TestBrokerFloodIsRefused(t *testing.T) {
	cfg := testConfig(t, driverPlugin(t, "honest"), boundsPlugin(t, "flood", "-broker-flood"))
	cfg.MinBackoff, cfg.MaxBackoff = 500*time.Millisecond, time.Second
	goroutines0, rss0 := runtime.NumGoroutine(), rssKiB(t)
	h, rec := startHost(t, cfg)

	// Sample until the host has ended the flooding driver and restarted it, the honest plugin
	// is ready, and for at least 3 s: the flooding driver is started, ended and restarted
	// meanwhile.
	maxGoroutines, maxRSS := 0, 0
	start := time.Now()
	for {
		maxGoroutines = max(maxGoroutines, runtime.NumGoroutine())
		maxRSS = max(maxRSS, rssKiB(t))
		rec.record(h)
		flood := state(t, h, "flood")
		ended := strings.Contains(flood.LastError, "ended by the host") && flood.Restarts > 0 // ended and started again
		if ended && state(t, h, "honest").Status == StatusReady && time.Since(start) >= 3*time.Second {
			break
		}
		require.Less(t, time.Since(start), time.Minute, "the flooding driver was not ended within a minute")
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("under a broker flood: host goroutines %d before start, at most %d; RSS %d MiB before, at most %d MiB",
		goroutines0, maxGoroutines, rss0>>10, maxRSS>>10)

	st := state(t, h, "flood")
	assert.Contains(t, st.LastError, "go-plugin broker messages")
	assert.Contains(t, st.LastError, "ended by the host")
	assert.Equal(t, string(coded.BrokerRefused), st.LastErrorCode)
	assert.Less(t, maxGoroutines, goroutines0+300, "host goroutines stay bounded")
	assert.Equal(t, StatusReady, state(t, h, "honest").Status)
}
