//go:build unix

package pluginhost

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
)

// keysShown counts how often each key appears in Plugins().
func keysShown(h *Host) map[string]int {
	n := map[string]int{}
	for _, p := range h.Plugins() {
		if p.Key != "" {
			n[p.Key]++
		}
	}
	return n
}

// TestPluginKeyCollisionIsRefused: a driver that reports the key configured for another plugin,
// or the key another plugin already reports, or not the key configured for its own plugin, is
// refused; no listing shows one key twice.
func TestPluginKeyCollisionIsRefused(t *testing.T) {
	runParallel(t)
	owner := driverPlugin(t, "owner")
	owner.Key = "example.sandbox"
	renamed := driverPlugin(t, "renamed", "-plugin-key", "acme.real")
	renamed.Key = "acme.expected"
	cfg := testConfig(t,
		owner,
		boundsPlugin(t, "impostor", "-key", "example.sandbox"),
		boundsPlugin(t, "first", "-key", "bounds.same"),
		boundsPlugin(t, "second", "-key", "bounds.same"),
		renamed,
	)
	cfg.MinBackoff, cfg.MaxBackoff = 500*time.Millisecond, time.Second
	h, rec := startHost(t, cfg)

	done := func() bool {
		for _, id := range []string{"owner", "impostor", "first", "second", "renamed"} {
			if s := state(t, h, id).Status; s != StatusReady && s != StatusError {
				return false
			}
		}
		return true
	}
	// Keys are checked while the plugins start concurrently.
	waitFor(t, 2*time.Minute, "every plugin ready or in error", func() bool {
		for k, n := range keysShown(h) {
			require.Equal(t, 1, n, "key %q shown %d times", k, n)
		}
		return done()
	})
	rec.record(h)

	assert.Equal(t, StatusReady, state(t, h, "owner").Status)
	imp := state(t, h, "impostor")
	assert.Equal(t, StatusError, imp.Status)
	assert.Contains(t, imp.LastError, `the driver reports plugin key "example.sandbox", which is configured for plugin "owner"`)
	assert.Equal(t, string(coded.KeyConflict), imp.LastErrorCode)
	assert.Empty(t, imp.Key)
	_, ok := h.Worker("impostor")
	assert.False(t, ok)

	// Of two plugins reporting one key, the first to be ready holds it.
	first, second := state(t, h, "first"), state(t, h, "second")
	winner, loser := first, second
	if second.Status == StatusReady {
		winner, loser = second, first
	}
	assert.Equal(t, StatusReady, winner.Status)
	assert.Equal(t, StatusError, loser.Status)
	assert.Contains(t, loser.LastError, `the driver reports plugin key "bounds.same", which plugin "`+winner.ID+`" already reports`)
	assert.Equal(t, string(coded.KeyConflict), loser.LastErrorCode)

	ren := state(t, h, "renamed")
	assert.Equal(t, StatusError, ren.Status)
	assert.Contains(t, ren.LastError, `the driver reports plugin key "acme.real", but plugin "renamed" is configured with key "acme.expected"`)
	assert.Equal(t, string(coded.KeyConflict), ren.LastErrorCode)

	for k, n := range keysShown(h) {
		assert.Equal(t, 1, n, "key %q", k)
	}
	for _, p := range h.FactsFile().Plugins {
		if p["id"] == "impostor" || p["id"] == loser.ID {
			assert.Empty(t, p["key"])
		}
	}
}

// TestLookalikePluginKeysAreRefused: two plugins without a configured key reporting keys that
// read as example.sandbox (one with a zero-width space, one with a Cyrillic "е") are refused
// (INVALID_MANIFEST) and never ready, next to the plugin that holds example.sandbox.
func TestLookalikePluginKeysAreRefused(t *testing.T) {
	runParallel(t)
	owner := driverPlugin(t, "owner")
	owner.Key = "example.sandbox"
	cfg := testConfig(t,
		owner,
		boundsPlugin(t, "zwsp", "-key", "example.sandbox\u200b"),
		boundsPlugin(t, "cyrillic", "-key", "\u0435xample.sandbox"),
	)
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 100*time.Millisecond
	h, rec := startHost(t, cfg)
	waitFor(t, 2*time.Minute, "the owner ready and a second refused start of each lookalike", func() bool {
		rec.record(h)
		for _, id := range []string{"zwsp", "cyrillic"} {
			st := state(t, h, id)
			require.NotEqual(t, StatusReady, st.Status, "a lookalike key was ready: %q", st.Key)
			require.Empty(t, st.Key)
			if st.Restarts < 1 || st.Status != StatusError {
				return false
			}
		}
		return state(t, h, "owner").Status == StatusReady
	})
	for id, bad := range map[string]string{"zwsp": `"example.sandbox\u200b" holds byte 0xe2 at offset 15`, "cyrillic": `"\u0435xample.sandbox" holds byte 0xd0 at offset 0`} {
		st := state(t, h, id)
		assert.Equal(t, string(coded.InvalidManifest), st.LastErrorCode, "%s: %s", id, st.LastError)
		assert.Contains(t, st.LastError, bad)
		assert.Contains(t, st.LastError, "a plugin key must be printable ASCII without spaces (0x21-0x7e)")
	}
	assert.Equal(t, map[string]int{"example.sandbox": 1}, keysShown(h))
}

// TestConfiguredKeyWinsOverAnEarlierDriver: a driver of a plugin without a configured key
// reports example.sandbox and is ready first; a plugin configured with that key added later
// becomes ready, and the earlier driver loses the key and is refused from then on.
func TestConfiguredKeyWinsOverAnEarlierDriver(t *testing.T) {
	runParallel(t)
	impostor := boundsPlugin(t, "impostor", "-key", "example.sandbox")
	cfg := testConfig(t, impostor)
	cfg.MinBackoff, cfg.MaxBackoff = 200*time.Millisecond, 500*time.Millisecond
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	require.Equal(t, StatusReady, state(t, h, "impostor").Status)
	require.Equal(t, "example.sandbox", state(t, h, "impostor").Key)

	owner := driverPlugin(t, "owner")
	owner.Key = "example.sandbox"
	_, err := h.Reconfigure(t.Context(), []PluginConfig{impostor, owner})
	require.NoError(t, err)
	waitFor(t, time.Minute, "owner ready, impostor refused", func() bool {
		for k, n := range keysShown(h) {
			require.Equal(t, 1, n, "key %q shown %d times", k, n)
		}
		imp := state(t, h, "impostor")
		return state(t, h, "owner").Status != StatusInstalled && imp.Status == StatusError && imp.LastErrorCode == string(coded.KeyConflict)
	})
	rec.record(h)
	own := state(t, h, "owner")
	assert.Equal(t, StatusReady, own.Status, "%s", own.LastError)
	assert.Equal(t, "example.sandbox", own.Key)
	imp := state(t, h, "impostor")
	assert.Empty(t, imp.Key)
	assert.Contains(t, imp.LastError, `the driver reports plugin key "example.sandbox", which is configured for plugin "owner"`)
	_, ok := h.Worker("impostor")
	assert.False(t, ok)
}
