//go:build unix

package pluginhost

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
)

// leaseOn is a duplex request on a plugin-backed sandbox lease.
func leaseOn(t testing.TB, pluginID, provider, config string) *snapshot.Request {
	t.Helper()
	req, err := snapshot.ParseRequest(strings.NewReader(`{
		"environment": {"driver": "sandbox", "config": ` + config + `},
		"lease": {"leasePolicy": "ephemeral", "metadata": {"driver": "sandbox", "sandboxProviderPlugin": true,
			"pluginId": "` + pluginID + `", "provider": "` + provider + `"}}}`))
	require.NoError(t, err)
	return req
}

// TestDecisionsFromLiveDrivers: a host with two real driver processes answers decisions from
// live facts. The honest driver grants; the one that declares duplex without implementing it is
// denied; a lease never borrows another plugin's declaration; a refused config narrows; a
// SIGKILLed worker turns decisions into denies until its restart, then into grants again.
func TestDecisionsFromLiveDrivers(t *testing.T) {
	runParallel(t)
	h, rec := startHost(t, testConfig(t,
		driverPlugin(t, "honest"),
		driverPlugin(t, "lying", "-plugin-key", "acme.lying", "-driver-key", "lying", "-omit-method", "duplexChannelOpen"),
	))
	waitStarted(t, h, rec)
	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 5 * time.Second})
	decide := func(req *snapshot.Request) decision.Document {
		t.Helper()
		doc, _, err := eng.Decide(t.Context(), req, h)
		require.NoError(t, err)
		return doc
	}

	tests := []struct {
		name    string
		req     *snapshot.Request
		allow   bool
		reasons []string
	}{
		{name: "honest driver grants", req: leaseOn(t, "honest", "example", `{"provider": "example"}`), allow: true},
		{name: "declared but not implemented", req: leaseOn(t, "lying", "lying", `{}`), reasons: []string{"method_not_verified"}},
		{name: "another plugin's entry is never read", req: leaseOn(t, "honest", "lying", `{}`), reasons: []string{"driver_entry_missing"}},
		{name: "unknown plugin", req: leaseOn(t, "absent", "example", `{}`), reasons: []string{"plugin_not_found"}},
		{name: "config refused by the driver", req: leaseOn(t, "honest", "example", `{"reject": true}`), reasons: []string{"capability_narrowed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := decide(tt.req)
			assert.Equal(t, tt.allow, doc.Allow)
			if !tt.allow {
				assert.Equal(t, "DUPLEX_CHANNEL_CAPABILITY_DENIED", doc.Code)
				assert.Equal(t, tt.reasons, doc.Reasons)
			}
		})
	}

	grant := leaseOn(t, "honest", "example", `{}`)
	before := state(t, h, "honest").Worker
	require.NotNil(t, before)
	require.NoError(t, syscall.Kill(before.PID, syscall.SIGKILL))
	killed := time.Now()
	var denied decision.Document
	toDeny := waitFor(t, 5*time.Second, "a deny after SIGKILL", func() bool {
		denied = decide(grant)
		return !denied.Allow
	})
	// Until the host has reaped the process, the dying worker may still be listed; its config
	// check then fails, which counts as a refused config (docs/contract.md, "Resolving the snapshot"): a deny either way.
	assert.Contains(t, [][]string{{"worker_not_running"}, {"capability_narrowed"}}, denied.Reasons)
	waitFor(t, 5*time.Second, "worker_not_running once the exit is noticed", func() bool {
		d := decide(grant)
		return !d.Allow && len(d.Reasons) == 1 && d.Reasons[0] == "worker_not_running" || d.Allow
	})
	waitFor(t, 30*time.Second, "a grant after the restart", func() bool { return decide(grant).Allow })
	t.Logf("SIGKILL → deny %s, → grant again %s", toDeny, time.Since(killed))
	rec.record(h)
	after := state(t, h, "honest").Worker
	require.NotNil(t, after)
	assert.Greater(t, after.Generation, before.Generation)

	// The lying driver was never touched by the crash of the honest one.
	assert.Equal(t, uint64(1), state(t, h, "lying").Worker.Generation)
}
