//go:build unix

package pluginhost

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/examples/exampledriver"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testutil"
)

func TestConfigValidate(t *testing.T) {
	good := strings.Repeat("ab", 32)
	tests := []struct {
		name    string
		cfg     Config
		wantErr []string
	}{
		{name: "default is valid", cfg: DefaultConfig()},
		{name: "zero config is valid", cfg: Config{}},
		{name: "one plugin", cfg: Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a", SHA256: good}}}},
		{name: "upper-case hex", cfg: Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a", SHA256: strings.ToUpper(good)}}}},
		{
			name:    "empty id",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a", SHA256: good}, {Path: "/bin/b", SHA256: good}}},
			wantErr: []string{"plugins[1].id: must not be empty"},
		},
		{
			name:    "duplicate id",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a", SHA256: good}, {ID: "a", Path: "/bin/b", SHA256: good}}},
			wantErr: []string{`plugins[1].id: "a" is already the id of plugins[0]`},
		},
		{
			name:    "bad sha256",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a", SHA256: good}, {ID: "b", Path: "/bin/b", SHA256: "abc"}}},
			wantErr: []string{"plugins[1].sha256: must be 64 hex characters"},
		},
		{
			name:    "non-hex sha256",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a", SHA256: strings.Repeat("zz", 32)}}},
			wantErr: []string{"plugins[0].sha256: must be 64 hex characters"},
		},
		{
			name:    "missing sha256",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a"}}},
			wantErr: []string{"plugins[0].sha256: must be 64 hex characters"},
		},
		{
			name: "missing sha256 allowed when the pin check is off",
			cfg:  Config{InsecureSkipPinCheck: true, Plugins: []PluginConfig{{ID: "a", Path: "/bin/a"}}},
		},
		{
			name:    "relative path",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", Path: "bin/a", SHA256: good}}},
			wantErr: []string{`plugins[0].path: "bin/a" must be an absolute path`},
		},
		{
			name:    "empty path",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", SHA256: good}}},
			wantErr: []string{"plugins[0].path: must not be empty"},
		},
		{
			name:    "null builtin provider",
			cfg:     Config{BuiltinProviders: map[string]map[string]any{"fake": nil}},
			wantErr: []string{`builtinProviders.fake: must be an object`},
		},
		{
			name:    "negative timeout and inverted back-off",
			cfg:     Config{StartTimeout: -1, MinBackoff: time.Second, MaxBackoff: time.Millisecond},
			wantErr: []string{"pluginStartTimeout: must not be negative", "maxBackoff: 1ms must be at least minBackoff (1s)"},
		},
		{
			name: "duplicate configured key",
			cfg: Config{Plugins: []PluginConfig{
				{ID: "a", Key: "acme.k", Path: "/bin/a", SHA256: good},
				{ID: "b", Path: "/bin/b", SHA256: good},
				{ID: "c", Key: "acme.k", Path: "/bin/c", SHA256: good},
			}},
			wantErr: []string{`plugins[2].key: "acme.k" is already the key of plugins[0]`},
		},
		{
			name:    "configured key with a lookalike letter",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", Key: "\u0435xample.sandbox", Path: "/bin/a", SHA256: good}}},
			wantErr: []string{`plugins[0].key: "\u0435xample.sandbox" holds byte 0xd0 at offset 0: a plugin key must be printable ASCII without spaces (0x21-0x7e)`},
		},
		{
			name:    "tmpfs smaller than 1 MiB",
			cfg:     Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a", SHA256: good, ResourceLimits: ResourceLimits{TempDirBytes: 4096}}}},
			wantErr: []string{"plugins[0].limits.tempDirBytes: 4096 is less than 1048576 (1 MiB)"},
		},
		{
			name: "tmpfs of 1 MiB",
			cfg:  Config{Plugins: []PluginConfig{{ID: "a", Path: "/bin/a", SHA256: good, ResourceLimits: ResourceLimits{TempDirBytes: 1 << 20}}}},
		},
		{
			name:    "negative limit",
			cfg:     Config{Limits: Limits{MaxMethods: -1, LogBurst: -2}},
			wantErr: []string{"limits.maxMethods: must not be negative", "limits.logBurst: must not be negative"},
		},
		{
			name: "several problems at once",
			cfg:  Config{Plugins: []PluginConfig{{}, {ID: "x", Path: "/x", SHA256: "1"}}},
			wantErr: []string{
				"plugins[0].id: must not be empty", "plugins[0].path: must not be empty",
				"plugins[0].sha256", "plugins[1].sha256",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.wantErr) == 0 {
				require.NoError(t, err)
				_, err := New(tt.cfg)
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, want := range tt.wantErr {
				assert.ErrorContains(t, err, want)
			}
			_, err = New(tt.cfg)
			require.Error(t, err, "New must refuse what Validate refuses")
		})
	}
}

func TestValidateManifest(t *testing.T) {
	entry := func(mod func(e *driverplugin.EnvironmentDriver)) driverplugin.Description {
		e := driverplugin.EnvironmentDriver{DriverKey: "d", Kind: driverplugin.KindSandboxProvider, SandboxCapabilities: map[string]any{"duplexCommandStream": true}}
		if mod != nil {
			mod(&e)
		}
		return driverplugin.Description{Key: "k", EnvironmentDrivers: []driverplugin.EnvironmentDriver{e}}
	}
	tests := []struct {
		name    string
		desc    driverplugin.Description
		wantErr string
	}{
		{name: "valid", desc: entry(nil)},
		{name: "no declaration", desc: entry(func(e *driverplugin.EnvironmentDriver) { e.SandboxCapabilities = nil })},
		{name: "environment driver kind", desc: entry(func(e *driverplugin.EnvironmentDriver) { e.Kind = driverplugin.KindEnvironmentDriver })},
		{name: "legacy field", desc: entry(func(e *driverplugin.EnvironmentDriver) { e.SupportsReusableLeases = testutil.Ptr(true) })},
		{name: "no entries", desc: driverplugin.Description{Key: "k"}},
		{name: "empty key", desc: driverplugin.Description{}, wantErr: "key: must not be empty"},
		{name: "zero-width space in the key", desc: driverplugin.Description{Key: "example.sandbox\u200b"}, wantErr: `key: "example.sandbox\u200b" holds byte 0xe2 at offset 15: a plugin key must be printable ASCII without spaces (0x21-0x7e)`},
		{name: "cyrillic letter in the key", desc: driverplugin.Description{Key: "\u0435xample.sandbox"}, wantErr: `key: "\u0435xample.sandbox" holds byte 0xd0 at offset 0`},
		{name: "space in the key", desc: driverplugin.Description{Key: "acme key"}, wantErr: `key: "acme key" holds byte 0x20 at offset 4`},
		{name: "control character in the key", desc: driverplugin.Description{Key: "acme\x7f"}, wantErr: `holds byte 0x7f at offset 4`},
		{name: "every printable ASCII byte", desc: driverplugin.Description{Key: "!~azAZ09._-/:@"}},
		{name: "string capability", desc: entry(func(e *driverplugin.EnvironmentDriver) {
			e.SandboxCapabilities = map[string]any{"duplexCommandStream": "true"}
		}), wantErr: `environmentDrivers[0].sandboxCapabilities.duplexCommandStream: must be a boolean, got "true"`},
		{name: "numeric capability", desc: entry(func(e *driverplugin.EnvironmentDriver) {
			e.SandboxCapabilities = map[string]any{"nativeSyncIn": 1.0}
		}), wantErr: "sandboxCapabilities.nativeSyncIn: must be a boolean, got 1"},
		{name: "null capability", desc: entry(func(e *driverplugin.EnvironmentDriver) {
			e.SandboxCapabilities = map[string]any{"nativeSyncIn": nil}
		}), wantErr: "sandboxCapabilities.nativeSyncIn: must be a boolean, got null"},
		{name: "empty driver key", desc: entry(func(e *driverplugin.EnvironmentDriver) { e.DriverKey = "" }), wantErr: "environmentDrivers[0].driverKey: must not be empty"},
		{name: "unknown kind", desc: entry(func(e *driverplugin.EnvironmentDriver) { e.Kind = "Sandbox_Provider" }), wantErr: `environmentDrivers[0].kind: "Sandbox_Provider" is neither`},
		{name: "duplicate driver key", desc: driverplugin.Description{Key: "k", EnvironmentDrivers: []driverplugin.EnvironmentDriver{
			{DriverKey: "d", Kind: driverplugin.KindSandboxProvider}, {DriverKey: "d", Kind: driverplugin.KindEnvironmentDriver},
		}}, wantErr: `environmentDrivers[1].driverKey: "d" is also the driver key of environmentDrivers[0]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateManifest(tt.desc)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// Sequential: it checks the child processes of the whole test process.
func TestHandshakeAndReady(t *testing.T) {
	cfg := testConfig(t, driverPlugin(t, "test.plugin"), PluginConfig{ID: "off", Path: "/nonexistent/driver", SHA256: strings.Repeat("0", 64), Enabled: testutil.Ptr(false)})
	cfg.BuiltinProviders = map[string]map[string]any{"fake": {"execute": true, "supportsReusableLeases": false}}
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)

	st := state(t, h, "test.plugin")
	assert.Equal(t, StatusReady, st.Status)
	assert.Equal(t, exampledriver.DefaultPluginKey, st.Key)
	assert.Empty(t, st.LastError)
	require.NotNil(t, st.Worker)
	assert.Equal(t, uint64(1), st.Worker.Generation)
	assert.Equal(t, exampledriver.DefaultMethods, st.Worker.SupportedMethods)
	assert.True(t, processExists(st.Worker.PID))
	// The child of the init of its pid namespace, which is the host's child.
	assert.Contains(t, descendantsOf(os.Getpid()), st.Worker.PID)

	pf, ok := h.Plugin("test.plugin")
	require.True(t, ok)
	p := pf.Record
	assert.Equal(t, map[string]any{
		"id": "test.plugin", "key": "example.sandbox", "status": "ready",
		"manifest": map[string]any{"environmentDrivers": []any{map[string]any{
			"driverKey": "example", "kind": "sandbox_provider",
			"sandboxCapabilities": map[string]any{"duplexCommandStream": true, "incrementalSessionOutput": true},
		}}},
	}, p)

	w, ok := h.Worker("test.plugin")
	require.True(t, ok)
	assert.Same(t, pf.Worker, w, "one rendered worker per generation")
	assert.Equal(t, uint64(1), w.Generation)
	assert.Equal(t, exampledriver.DefaultMethods, w.SupportedMethods)
	assert.True(t, w.Alive())

	off := state(t, h, "off")
	assert.Equal(t, StatusDisabled, off.Status)
	assert.Nil(t, off.Worker)
	pf, ok = h.Plugin("off")
	require.True(t, ok)
	assert.Nil(t, pf.Worker)
	assert.Equal(t, map[string]any{"id": "off", "key": "", "status": "disabled", "manifest": map[string]any{"environmentDrivers": []any{}}}, pf.Record)
	_, ok = h.Worker("off")
	assert.False(t, ok)

	_, ok = h.Plugin("nope")
	assert.False(t, ok)
	_, ok = h.Worker("nope")
	assert.False(t, ok)

	b, ok := h.BuiltinProvider("fake")
	require.True(t, ok)
	assert.Equal(t, map[string]any{"execute": true, "supportsReusableLeases": false}, b)
	b["execute"] = false // a caller's change must not reach the host
	b, _ = h.BuiltinProvider("fake")
	assert.Equal(t, true, b["execute"])
	_, ok = h.BuiltinProvider("other")
	assert.False(t, ok)

	// The facts file replays the same facts.
	raw, err := json.Marshal(h.FactsFile())
	require.NoError(t, err)
	ff, err := snapshot.ParseFacts(bytes.NewReader(raw))
	require.NoError(t, err, "facts file: %s", raw)
	for _, id := range []string{"test.plugin", "off", "nope"} {
		live, liveOK := h.Plugin(id)
		file, fileOK := ff.Plugin(id)
		require.Equal(t, liveOK, fileOK, id)
		if liveOK {
			assert.Equal(t, mustJSON(t, live.Record), mustJSON(t, file.Record), id)
			require.Equal(t, live.Worker == nil, file.Worker == nil, id)
			if live.Worker != nil {
				assert.Equal(t, live.Worker.SupportedMethods, file.Worker.SupportedMethods, id)
			}
		}
	}
	fb, ok := ff.BuiltinProvider("fake")
	require.True(t, ok)
	assert.Equal(t, map[string]any{"execute": true, "supportsReusableLeases": false}, fb)

	// Starting twice is refused.
	require.Error(t, h.Start(t.Context()))
}

func mustJSON(tb testing.TB, v any) string {
	tb.Helper()
	b, err := json.Marshal(v)
	require.NoError(tb, err)
	return string(b)
}

func TestEmptyFactsFileIsWellFormed(t *testing.T) {
	h, err := New(Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, h.Close()) }()
	raw, err := json.Marshal(h.FactsFile())
	require.NoError(t, err)
	assert.JSONEq(t, `{"plugins":[],"workers":{},"builtinProviders":{}}`, string(raw))
	_, err = snapshot.ParseFacts(bytes.NewReader(raw))
	require.NoError(t, err)
	require.NoError(t, h.WaitStarted(t.Context()), "no enabled plugin: started at once")
}

// Sequential: it checks the child processes of the whole test process.
func TestPinMismatchRefused(t *testing.T) {
	p := driverPlugin(t, "pinned")
	_, realSum := driverBinary(t)
	p.SHA256 = strings.Repeat("0", 64)
	h, rec := startHost(t, testConfig(t, p))

	waitFor(t, 30*time.Second, "status error", func() bool { return state(t, h, "pinned").Status == StatusError })
	st := state(t, h, "pinned")
	assert.Equal(t, "sha256 mismatch for "+p.Path+": got "+realSum+", configured "+p.SHA256+
		" (refusing to start it; if the binary was upgraded on purpose, configure its new sha256)", st.LastError)
	assert.Nil(t, st.Worker)
	_, ok := h.Worker("pinned")
	assert.False(t, ok)
	pl, _ := h.Plugin("pinned")
	assert.Equal(t, "error", pl.Record["status"])

	// It keeps being retried with back-off, and never runs.
	waitFor(t, 30*time.Second, "a retry", func() bool { return state(t, h, "pinned").Restarts >= 2 })
	assert.Empty(t, childProcesses(t), "a binary with the wrong pin must never run")

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := h.WaitStarted(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "pinned (status error: sha256 mismatch")
	rec.record(h)
}

func TestInsecureSkipPinCheckWarns(t *testing.T) {
	runParallel(t)
	p := driverPlugin(t, "unpinned")
	p.SHA256 = ""
	logs := &testutil.SyncBuffer{}
	cfg := testConfig(t, p)
	cfg.InsecureSkipPinCheck = true
	cfg.Logger = testLogger(t, logs)
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	assert.Equal(t, StatusReady, state(t, h, "unpinned").Status)
	assert.Contains(t, logs.String(), "[WARN]  pluginhost.unpinned: INSECURE: starting a plugin binary WITHOUT checking its SHA-256 pin")
}

func TestCrashIsNoticedAtOnceAndRestarted(t *testing.T) {
	runParallel(t)
	h, rec := startHost(t, testConfig(t, driverPlugin(t, "crashy")))
	waitStarted(t, h, rec)
	first := state(t, h, "crashy").Worker
	require.NotNil(t, first)

	require.NoError(t, syscall.Kill(first.PID, syscall.SIGKILL))
	killed := time.Now()
	gone := waitFor(t, 2*time.Second, "Worker() false after SIGKILL", func() bool {
		_, ok := h.Worker("crashy")
		return !ok
	})
	t.Logf("SIGKILL to Worker() false: %s", gone)
	// Its methods are gone: nothing of the dead worker is reported anywhere.
	_, inFile := h.FactsFile().Workers["crashy"]
	assert.False(t, inFile)
	_, err := h.ConfigValid(t.Context(), "crashy", snapshot.NewWorker(first.Generation, nil, nil), "example", map[string]any{})
	require.Error(t, err)

	var w *snapshot.Worker
	back := waitFor(t, 30*time.Second, "a restarted worker", func() bool {
		var ok bool
		w, ok = h.Worker("crashy")
		return ok
	})
	t.Logf("SIGKILL to restored worker: %s", time.Since(killed))
	_ = back
	rec.record(h)
	st := state(t, h, "crashy")
	assert.Equal(t, uint64(2), w.Generation)
	assert.Equal(t, exampledriver.DefaultMethods, w.SupportedMethods)
	assert.Equal(t, StatusReady, st.Status)
	assert.Equal(t, uint64(1), st.Restarts)
	require.NotNil(t, st.Worker)
	assert.NotEqual(t, first.PID, st.Worker.PID)
	assert.Contains(t, st.LastError, "worker generation 1 (pid")
	assert.Contains(t, st.LastError, "signal: killed")
	assert.False(t, processExists(first.PID), "the killed worker must be reaped")
}

func TestCrashAfterRPCs(t *testing.T) {
	runParallel(t)
	// The driver exits with status 3 on its third RPC: the first config check.
	h, rec := startHost(t, testConfig(t, driverPlugin(t, "flaky", "-crash-after", "2")))
	waitStarted(t, h, rec)
	w, ok := h.Worker("flaky")
	require.True(t, ok)

	valid, err := h.ConfigValid(t.Context(), "flaky", w, "example", map[string]any{"x": 1})
	assert.False(t, valid)
	require.Error(t, err, "a worker that dies during the check gives an error, so: not valid")
	waitFor(t, 2*time.Second, "Worker() false after the crash", func() bool {
		_, ok := h.Worker("flaky")
		return !ok
	})
	waitFor(t, 30*time.Second, "generation 2", func() bool {
		w2, ok := h.Worker("flaky")
		return ok && w2.Generation == 2
	})
	rec.record(h)
	st := state(t, h, "flaky")
	assert.Contains(t, st.LastError, "exit status 3")
	assert.Equal(t, StatusReady, st.Status)
}

// Sequential: it checks the child processes of the whole test process.
func TestHangAtStartTimesOut(t *testing.T) {
	cfg := testConfig(t, driverPlugin(t, "hangs", "-hang-at-start"))
	cfg.StartTimeout = 500 * time.Millisecond
	cfg.MinBackoff = 5 * time.Second // one attempt is enough to look at
	cfg.MaxBackoff = 5 * time.Second
	h, _ := startHost(t, cfg)
	waitFor(t, 30*time.Second, "status error", func() bool { return state(t, h, "hangs").Status == StatusError })
	st := state(t, h, "hangs")
	assert.Contains(t, st.LastError, "did not complete the go-plugin handshake within the start timeout (500ms)")
	assert.Nil(t, st.Worker)
	waitFor(t, 5*time.Second, "the hung process to be killed", func() bool { return len(childProcesses(t)) == 0 })
}

// Sequential: it checks the child processes of the whole test process.
func TestCloseDuringStartIsQuick(t *testing.T) {
	cfg := testConfig(t, driverPlugin(t, "hangs", "-hang-at-start"))
	cfg.StartTimeout = time.Minute
	h, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, h.Start(t.Context()))
	waitFor(t, 30*time.Second, "the driver process", func() bool { return len(childProcesses(t)) > 0 })
	start := time.Now()
	require.NoError(t, h.Close())
	assert.Less(t, time.Since(start), 5*time.Second, "Close must not wait for the start timeout")
	assert.Empty(t, childProcesses(t))
	assert.Equal(t, StatusInstalled, state(t, h, "hangs").Status, "closing is not the plugin's fault")
	require.NoError(t, h.Close(), "Close twice")
	require.ErrorIs(t, h.Start(t.Context()), ErrClosed)
	require.ErrorIs(t, h.WaitStarted(t.Context()), ErrClosed)
}

func TestInvalidManifestIsRefused(t *testing.T) {
	runParallel(t)
	tests := []struct {
		name    string
		flags   []string
		wantErr string
	}{
		{name: "duplex declared as a string", flags: []string{"-declare", `duplexCommandStream="true"`},
			wantErr: `environmentDrivers[0].sandboxCapabilities.duplexCommandStream: must be a boolean, got "true"`},
		{name: "capability declared as a number", flags: []string{"-declare", "nativeSyncIn=1"},
			wantErr: "sandboxCapabilities.nativeSyncIn: must be a boolean, got 1"},
		{name: "empty driver key", flags: []string{"-driver-key", ""},
			wantErr: "environmentDrivers[0].driverKey: must not be empty"},
		{name: "unknown kind", flags: []string{"-kind", "sandbox"},
			wantErr: `environmentDrivers[0].kind: "sandbox" is neither`},
		{name: "empty plugin key", flags: []string{"-plugin-key", ""},
			wantErr: "key: must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, driverPlugin(t, "liar", tt.flags...))
			cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Second
			h, _ := startHost(t, cfg)
			waitFor(t, 30*time.Second, "status error", func() bool { return state(t, h, "liar").Status == StatusError })
			st := state(t, h, "liar")
			assert.Contains(t, st.LastError, "invalid manifest")
			assert.Contains(t, st.LastError, tt.wantErr)
			assert.Nil(t, st.Worker)
			_, ok := h.Worker("liar")
			assert.False(t, ok)
			p, _ := h.Plugin("liar")
			assert.Equal(t, map[string]any{"environmentDrivers": []any{}}, p.Record["manifest"], "an invalid manifest is never published")
		})
	}
}

func TestMissingMethodIsReported(t *testing.T) {
	runParallel(t)
	h, rec := startHost(t, testConfig(t, driverPlugin(t, "nodup", "-omit-method", "duplexChannelOpen")))
	waitStarted(t, h, rec)
	w, ok := h.Worker("nodup")
	require.True(t, ok)
	assert.Equal(t, []string{"environmentExecute", "environmentSyncIn", "environmentSyncOut"}, w.SupportedMethods)
	assert.Equal(t, StatusReady, state(t, h, "nodup").Status)
}

func TestStdoutNoiseBeforeHandshake(t *testing.T) {
	runParallel(t)
	cfg := testConfig(t, driverPlugin(t, "noisy", "-stdout-noise"))
	cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Second
	h, _ := startHost(t, cfg)
	waitFor(t, 30*time.Second, "status error", func() bool { return state(t, h, "noisy").Status == StatusError })
	st := state(t, h, "noisy")
	assert.Contains(t, st.LastError, "plugin wrote to stdout before the go-plugin handshake")
	assert.Contains(t, st.LastError, "hello from stdout")
}

func TestConfigValid(t *testing.T) {
	runParallel(t)
	cfg := testConfig(t,
		// Crashes on its first config check: any call that reaches it shows.
		driverPlugin(t, "strict", "-crash-after", "3"),
		driverPlugin(t, "slow", "-config-delay", "10s", "-plugin-key", "example.slow"),
		driverPlugin(t, "rejecting", "-reject-config", "-plugin-key", "example.rejecting"),
	)
	cfg.ConfigCheckTimeout = 300 * time.Millisecond
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	strict, ok := h.Worker("strict")
	require.True(t, ok)

	t.Run("accepted", func(t *testing.T) {
		valid, err := h.ConfigValid(t.Context(), "strict", strict, "example", map[string]any{"region": "eu"})
		require.NoError(t, err)
		assert.True(t, valid)
	})
	t.Run("cached: the same config does not reach the driver again", func(t *testing.T) {
		// Keys in another order: the same canonical JSON.
		var cfg map[string]any
		require.NoError(t, json.Unmarshal([]byte(`{"region":"eu"}`), &cfg))
		valid, err := h.ConfigValid(t.Context(), "strict", strict, "example", cfg)
		require.NoError(t, err)
		assert.True(t, valid)
		w, ok := h.Worker("strict")
		require.True(t, ok, "a driver call would have crashed the worker")
		assert.Equal(t, strict.Generation, w.Generation)
	})
	t.Run("not an object: not valid, driver not asked", func(t *testing.T) {
		for _, c := range []any{nil, "x", []any{}, 1.0, true} {
			valid, err := h.ConfigValid(t.Context(), "strict", strict, "example", c)
			require.NoError(t, err)
			assert.False(t, valid)
		}
		_, ok := h.Worker("strict")
		assert.True(t, ok)
	})
	t.Run("wrong generation", func(t *testing.T) {
		valid, err := h.ConfigValid(t.Context(), "strict", snapshot.NewWorker(7, nil, nil), "example", map[string]any{})
		assert.False(t, valid)
		require.ErrorIs(t, err, errStaleWorker)
	})
	t.Run("unknown plugin", func(t *testing.T) {
		valid, err := h.ConfigValid(t.Context(), "nope", strict, "example", map[string]any{})
		assert.False(t, valid)
		require.ErrorIs(t, err, errUnknownPlugin)
	})
	t.Run("rejected", func(t *testing.T) {
		w, ok := h.Worker("rejecting")
		require.True(t, ok)
		valid, err := h.ConfigValid(t.Context(), "rejecting", w, "example", map[string]any{})
		require.NoError(t, err)
		assert.False(t, valid)
		// Numbers as the request decoder keeps them (json.Number) reach the driver too.
		valid, err = h.ConfigValid(t.Context(), "rejecting", w, "example", map[string]any{"n": json.Number("12.50"), "l": []any{json.Number("1")}})
		require.NoError(t, err)
		assert.False(t, valid)
	})
	t.Run("the caller's deadline applies", func(t *testing.T) {
		w, ok := h.Worker("slow")
		require.True(t, ok)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		valid, err := h.ConfigValid(ctx, "slow", w, "example", map[string]any{"reject": true})
		assert.False(t, valid)
		require.ErrorIs(t, err, context.DeadlineExceeded, "the caller's deadline applies")
		assert.Less(t, time.Since(start), 2*time.Second)
	})
	t.Run("time-out counts as not valid and is kept for failureTTL only", func(t *testing.T) {
		w, ok := h.Worker("slow")
		require.True(t, ok)
		for range 2 {
			valid, err := h.ConfigValid(t.Context(), "slow", w, "example", map[string]any{})
			assert.False(t, valid)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Equal(t, coded.ConfigCheckTimeout, coded.CodeOf(err))
		}
		h.checks.mu.Lock()
		defer h.checks.mu.Unlock()
		for k, e := range h.checks.entries {
			if k.pluginID == "slow" {
				assert.False(t, e.expires.IsZero(), "a time-out is kept for failureTTL only")
			}
		}
	})
}

func TestConfigValidCachePerGeneration(t *testing.T) {
	runParallel(t)
	// Three RPCs per process: Describe, SupportedMethods and one config check; the next crashes.
	h, rec := startHost(t, testConfig(t, driverPlugin(t, "gen", "-crash-after", "3")))
	waitStarted(t, h, rec)
	w1, ok := h.Worker("gen")
	require.True(t, ok)
	require.Equal(t, uint64(1), w1.Generation)

	valid, err := h.ConfigValid(t.Context(), "gen", w1, "example", map[string]any{"a": 1})
	require.NoError(t, err)
	require.True(t, valid)
	valid, err = h.ConfigValid(t.Context(), "gen", w1, "example", map[string]any{"a": 1})
	require.NoError(t, err)
	require.True(t, valid, "second answer from the cache")

	// A new config reaches the driver, which crashes: error, so not valid, and not cached.
	valid, err = h.ConfigValid(t.Context(), "gen", w1, "example", map[string]any{"a": 2})
	require.Error(t, err)
	require.False(t, valid)

	var w2 *snapshot.Worker
	waitFor(t, 30*time.Second, "generation 2", func() bool {
		w2, ok = h.Worker("gen")
		return ok && w2.Generation == 2
	})
	rec.record(h)

	// The cached answer belonged to generation 1 only.
	valid, err = h.ConfigValid(t.Context(), "gen", w1, "example", map[string]any{"a": 1})
	require.ErrorIs(t, err, errStaleWorker)
	require.False(t, valid)
	h.checks.mu.Lock()
	for k := range h.checks.entries {
		assert.Equal(t, uint64(2), k.generation, "older generations' answers are dropped")
	}
	h.checks.mu.Unlock()

	// Generation 2 is asked afresh (its third RPC), and then answers from the cache.
	valid, err = h.ConfigValid(t.Context(), "gen", w2, "example", map[string]any{"a": 1})
	require.NoError(t, err)
	require.True(t, valid)
	valid, err = h.ConfigValid(t.Context(), "gen", w2, "example", map[string]any{"a": 1})
	require.NoError(t, err)
	require.True(t, valid)
	w, ok := h.Worker("gen")
	require.True(t, ok)
	assert.Equal(t, uint64(2), w.Generation)
}

func TestBackoff(t *testing.T) {
	b := newBackoff(100*time.Millisecond, time.Second)
	var got []time.Duration
	for range 7 {
		got = append(got, b.step())
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, time.Second}, got)
	b.reset()
	assert.Equal(t, 100*ms, b.peek())
	assert.Equal(t, 100*ms, b.step())
	assert.Equal(t, 200*ms, b.peek())
}

func TestFailingPluginIsRetried(t *testing.T) {
	runParallel(t)
	p := driverPlugin(t, "bad")
	p.SHA256 = strings.Repeat("1", 64)
	cfg := testConfig(t, p)
	cfg.MinBackoff = 10 * time.Millisecond
	cfg.MaxBackoff = 40 * time.Millisecond
	h, _ := startHost(t, cfg)
	// Uncapped, five restarts would wait 10+20+40+80+160 ms; capped, 10+20+40+40+40.
	waitFor(t, 30*time.Second, "5 restarts", func() bool { return state(t, h, "bad").Restarts >= 5 })
	assert.Equal(t, StatusError, state(t, h, "bad").Status)
}

// FuzzValidateManifest: whatever a driver declares, the host publishes a declaration only when
// every value is a JSON boolean, and never panics.
func FuzzValidateManifest(f *testing.F) {
	for _, seed := range []string{
		`{"duplexCommandStream":true}`, `{"duplexCommandStream":"true"}`, `{"a":null}`, `{}`,
		`{"a":1,"b":[true]}`, `{"nativeSyncIn":false,"x":{"y":true}}`,
	} {
		f.Add(seed, "example", driverplugin.KindSandboxProvider)
	}
	f.Fuzz(func(t *testing.T, capsJSON, driverKey, kind string) {
		var caps map[string]any
		if json.Unmarshal([]byte(capsJSON), &caps) != nil {
			return
		}
		err := validateManifest(driverplugin.Description{Key: "k", EnvironmentDrivers: []driverplugin.EnvironmentDriver{
			{DriverKey: driverKey, Kind: kind, SandboxCapabilities: caps},
		}})
		allBool := true
		for _, v := range caps {
			if _, ok := v.(bool); !ok {
				allBool = false
			}
		}
		wantOK := allBool && driverKey != "" &&
			(kind == driverplugin.KindSandboxProvider || kind == driverplugin.KindEnvironmentDriver)
		if wantOK != (err == nil) {
			t.Fatalf("caps %s key %q kind %q: err %v", capsJSON, driverKey, kind, err)
		}
	})
}
