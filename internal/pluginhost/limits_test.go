//go:build unix

package pluginhost

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testutil"
)

// settled waits until the plugin is ready or in error.
func settled(tb testing.TB, h *Host, id string) api.PluginState {
	tb.Helper()
	waitFor(tb, 3*time.Minute, id+" ready or in error", func() bool {
		s := state(tb, h, id).Status
		return s == StatusReady || s == StatusError
	})
	return state(tb, h, id)
}

// TestDriverBeyondLimitsIsRefused: a driver that reports more than the host's limits is
// refused at start with a short lastError naming the bound; one at the bounds is ready, and
// repeated methods are reported once.
func TestDriverBeyondLimitsIsRefused(t *testing.T) {
	runParallel(t)
	tests := []struct {
		name    string
		flags   []string
		wantErr string // empty: ready
		methods []string
	}{
		{name: "a message beyond the size limit", flags: []string{"-methods", "200000", "-string-len", "32"},
			wantErr: "larger than the limit of 4194304 bytes per message"},
		{name: "too many methods", flags: []string{"-methods", "64"},
			wantErr: "SupportedMethods reported 65 distinct methods, more than the limit of 64"},
		{name: "too many manifest entries", flags: []string{"-entries", "256"},
			wantErr: "the manifest has 257 environmentDrivers entries, more than the limit of 256"},
		{name: "too many capability keys", flags: []string{"-unknown-caps", "32"},
			wantErr: "environmentDrivers[0].sandboxCapabilities has 33 keys, more than the limit of 32"},
		{name: "long strings", flags: []string{"-string-len", "257"},
			wantErr: "is 257 bytes, more than the limit of 256"},
		{name: "repeated methods are reported once", flags: []string{"-dup-methods", "100000"},
			methods: []string{"duplexChannelOpen"}},
		{name: "at the bounds", flags: []string{"-methods", "63", "-entries", "255", "-unknown-caps", "31", "-string-len", "256"}},
	}
	var plugins []PluginConfig
	for i, tt := range tests {
		// Distinct keys, so that no start is refused for a key collision.
		plugins = append(plugins, boundsPlugin(t, fmt.Sprintf("p%d", i), append([]string{"-key", fmt.Sprintf("bounds.p%d", i)}, tt.flags...)...))
	}
	cfg := testConfig(t, plugins...)
	cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Second
	h, rec := startHost(t, cfg)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf("p%d", i)
			st := settled(t, h, id)
			rec.record(h)
			if tt.wantErr == "" {
				require.Equal(t, StatusReady, st.Status, st.LastError)
				require.NotNil(t, st.Worker)
				if tt.methods != nil {
					assert.Equal(t, tt.methods, st.Worker.SupportedMethods)
				}
				return
			}
			assert.Equal(t, StatusError, st.Status)
			assert.Contains(t, st.LastError, tt.wantErr)
			assert.Contains(t, st.LastError, `see "Limits" in docs/drivers.md`)
			assert.Equal(t, string(coded.LimitExceeded), st.LastErrorCode)
			assert.LessOrEqual(t, len(st.LastError), defaultMaxLastErrorBytes+64)
			assert.Nil(t, st.Worker)
			_, ok := h.Worker(id)
			assert.False(t, ok)
			t.Logf("lastError: %s", st.LastError)
		})
	}
}

// TestUnknownCapabilitiesAreSummarised: unknown capability keys give one warning per start
// with a count and a few examples, not one line per key; 100,000 of them are refused.
func TestUnknownCapabilitiesAreSummarised(t *testing.T) {
	runParallel(t)
	var logged testutil.SyncBuffer
	cfg := testConfig(t,
		boundsPlugin(t, "some", "-key", "bounds.some", "-unknown-caps", "20"),
		boundsPlugin(t, "many", "-key", "bounds.many", "-unknown-caps", "100000"),
	)
	cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Second
	cfg.Logger = testLogger(t, &logged)
	h, rec := startHost(t, cfg)
	require.Equal(t, StatusReady, settled(t, h, "some").Status)
	rec.record(h)
	many := settled(t, h, "many")
	assert.Equal(t, StatusError, many.Status)
	assert.Contains(t, many.LastError, "sandboxCapabilities has 100001 keys, more than the limit of 32")
	assert.Equal(t, string(coded.LimitExceeded), many.LastErrorCode)

	var warnings, lines int
	for _, l := range strings.Split(logged.String(), "\n") {
		if strings.Contains(l, "nknown") || strings.Contains(l, "does not know") {
			lines++
		}
		if strings.Contains(l, "capabilities the host does not know") {
			warnings++
			assert.Contains(t, l, "count=20")
			assert.Contains(t, l, "bounds.unknownCapability0")
		}
	}
	assert.Equal(t, 1, warnings, "one summary per start of plugin some")
	assert.LessOrEqual(t, lines, 10, "lines about unknown capabilities")
}

// TestLastErrorIsCapped: a manifest with thousands of problems gives a short, one-line
// lastError.
func TestLastErrorIsCapped(t *testing.T) {
	runParallel(t)
	cfg := testConfig(t, boundsPlugin(t, "bad", "-entries", "200", "-bad-caps", "20"))
	cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Second
	h, _ := startHost(t, cfg)
	st := settled(t, h, "bad")
	require.Equal(t, StatusError, st.Status)
	assert.Contains(t, st.LastError, "invalid manifest")
	assert.Contains(t, st.LastError, "must be a boolean")
	assert.LessOrEqual(t, len(st.LastError), defaultMaxLastErrorBytes+64)
	assert.NotContains(t, st.LastError, "\n")
	t.Logf("lastError (%d bytes): %s", len(st.LastError), st.LastError)
}

// TestHugePluginDoesNotStarveAnother measures decisions per second on an honest plugin, alone
// and while other clients decide on a plugin at the limits and on one that reports a huge
// number of methods. It asserts what the host did with each plugin, and logs the throughputs (they depend
// on the machine, so they are figures, not assertions).
//
// AUTHZ_TEST_HUGE_METHODS sets how many methods the huge plugin reports (default 100,000; the
// figures in the docs were taken with 1,000,000, which takes long to generate under -race).
//
// Sequential: it measures the resident memory of the whole process.
func TestHugePluginDoesNotStarveAnother(t *testing.T) {
	hugeMethods := "100000"
	if n := os.Getenv("AUTHZ_TEST_HUGE_METHODS"); n != "" {
		hugeMethods = n
	}
	cfg := testConfig(t,
		driverPlugin(t, "small"),
		boundsPlugin(t, "atlimits", "-key", "bounds.atlimits", "-methods", "63", "-entries", "255", "-unknown-caps", "31", "-string-len", "256"),
		boundsPlugin(t, "huge", "-key", "bounds.huge", "-methods", hugeMethods),
	)
	cfg.MinBackoff, cfg.MaxBackoff = time.Second, 2*time.Second
	cfg.StartTimeout = 2 * time.Minute // time enough to take in the huge plugin's methods, were they accepted
	h, rec := startHost(t, cfg)
	for _, id := range []string{"small", "atlimits", "huge"} {
		settled(t, h, id)
	}
	rec.record(h)
	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 5 * time.Second})

	small := leaseOn(t, "small", "example", `{}`)
	doc, _, err := eng.Decide(t.Context(), small, h)
	require.NoError(t, err)
	require.True(t, doc.Allow, "the honest plugin grants: %v", doc.Reasons)

	// rate decides on small for window while loadClients decide on load (nil: no load), and
	// returns small's decisions per second and the load's.
	const window = 3 * time.Second
	rate := func(load *snapshot.Request, loadClients int) (smallPerSec, loadPerSec float64) {
		var loadN atomic.Int64
		stop := func() {}
		if load != nil {
			stop = testutil.Repeat(t, loadClients, func(int) bool {
				_, _, _ = eng.Decide(t.Context(), load, h)
				loadN.Add(1)
				return true
			})
		}
		var n int
		start := time.Now()
		for time.Since(start) < window {
			d, _, err := eng.Decide(t.Context(), small, h)
			require.NoError(t, err)
			require.True(t, d.Allow)
			n++
		}
		elapsed := time.Since(start)
		stop()
		return float64(n) / elapsed.Seconds(), float64(loadN.Load()) / elapsed.Seconds()
	}

	rss0 := rssKiB(t)
	alone, _ := rate(nil, 0)
	besideLimits, limitsRate := rate(leaseOn(t, "atlimits", "bounds"+strings.Repeat("x", 256-len("bounds")), `{}`), 2)
	rssLimits := rssKiB(t)
	besideHuge, hugeRate := rate(leaseOn(t, "huge", "bounds", `{}`), 2)
	rssHuge := rssKiB(t)
	t.Logf("decisions/s on plugin small: alone %.0f; beside 2 clients on a plugin at the limits %.0f (%.0f%%; their own %.0f/s); "+
		"beside 2 clients on a plugin reporting %s methods %.0f (%.0f%%; their own %.1f/s); host RSS %d MiB, %d MiB, %d MiB",
		alone, besideLimits, 100*besideLimits/alone, limitsRate, hugeMethods, besideHuge, 100*besideHuge/alone, hugeRate,
		rss0>>10, rssLimits>>10, rssHuge>>10)
	t.Logf("plugin huge: status %s, lastError %q", state(t, h, "huge").Status, state(t, h, "huge").LastError)

	assert.Equal(t, StatusReady, state(t, h, "atlimits").Status)
	huge := state(t, h, "huge")
	assert.Equal(t, StatusError, huge.Status)
	assert.Contains(t, huge.LastError, "than the limit of", "refused for its methods or its message size")
	assert.Equal(t, string(coded.LimitExceeded), huge.LastErrorCode)
}

// BenchmarkCheckBoundsAtTheLimits is the per-start cost of checking a driver at every limit.
func BenchmarkCheckBoundsAtTheLimits(b *testing.B) {
	l := Limits{}.withDefaults()
	pad := func(s string) string { return s + strings.Repeat("x", l.MaxStringBytes-len(s)) }
	var methods []string
	for i := range l.MaxMethods {
		methods = append(methods, pad(fmt.Sprintf("method%d", i)))
	}
	desc := driverplugin.Description{Key: pad("acme.key")}
	for i := range l.MaxManifestEntries {
		caps := map[string]any{}
		for j := range l.MaxCapabilityKeys {
			caps[pad(fmt.Sprintf("cap%d", j))] = true
		}
		desc.EnvironmentDrivers = append(desc.EnvironmentDrivers, driverplugin.EnvironmentDriver{
			DriverKey: pad(fmt.Sprintf("driver%d", i)), Kind: driverplugin.KindSandboxProvider, SandboxCapabilities: caps,
		})
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := checkBounds(l, desc, dedupeMethods(methods)); err != nil {
			b.Fatal(err)
		}
	}
}

func TestCheckBounds(t *testing.T) {
	l := Limits{}.withDefaults()
	entry := func(key string, caps map[string]any) driverplugin.EnvironmentDriver {
		return driverplugin.EnvironmentDriver{DriverKey: key, Kind: driverplugin.KindSandboxProvider, SandboxCapabilities: caps}
	}
	tests := []struct {
		name    string
		desc    driverplugin.Description
		methods []string
		wantErr string
	}{
		{name: "honest", desc: driverplugin.Description{Key: "acme.k", EnvironmentDrivers: []driverplugin.EnvironmentDriver{entry("d", map[string]any{"duplexCommandStream": true})}},
			methods: []string{"duplexChannelOpen"}},
		{name: "non-ASCII text is fine", desc: driverplugin.Description{Key: "acmé.k\tx"}},
		{name: "carriage return in a method", desc: driverplugin.Description{Key: "k"}, methods: []string{"ok", "evil\rforged"},
			wantErr: `SupportedMethods[1] "evil\rforged" holds a control character`},
		{name: "ANSI escape in the key", desc: driverplugin.Description{Key: "\x1b[2Jk"},
			wantErr: `key "\x1b[2Jk" holds a control character`},
		{name: "bidi override in a driver key", desc: driverplugin.Description{Key: "k", EnvironmentDrivers: []driverplugin.EnvironmentDriver{entry("a\u202eb", nil)}},
			wantErr: `environmentDrivers[0].driverKey "a\u202eb" holds a control character`},
		{name: "invalid UTF-8 in a capability key", desc: driverplugin.Description{Key: "k", EnvironmentDrivers: []driverplugin.EnvironmentDriver{entry("d", map[string]any{"a\xff": true})}},
			wantErr: "environmentDrivers[0].sandboxCapabilities key is not valid UTF-8"},
		{name: "long kind", desc: driverplugin.Description{Key: "k", EnvironmentDrivers: []driverplugin.EnvironmentDriver{{DriverKey: "d", Kind: strings.Repeat("k", 257)}}},
			wantErr: "environmentDrivers[0].kind is 257 bytes, more than the limit of 256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkBounds(l, tt.desc, tt.methods)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			assert.ErrorContains(t, err, `see "Limits" in docs/drivers.md`)
		})
	}
	assert.Equal(t, []string{"a", "b"}, dedupeMethods([]string{"a", "b", "a", "b", "a"}))
}
