package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testutil"
)

// startLogged starts a Source of cfg whose service log (at level) goes to the returned buffer.
func startLogged(tb testing.TB, cfg Config, level hclog.Level) (*decision.Engine, *Source, *testutil.SyncBuffer) {
	tb.Helper()
	out := &testutil.SyncBuffer{}
	eng := decision.New(decision.Options{})
	src, err := New(cfg, eng, Options{Logger: hclog.New(&hclog.LoggerOptions{Output: out, Level: level})})
	require.NoError(tb, err)
	require.NoError(tb, src.Start(tb.Context()))
	tb.Cleanup(func() { src.Close(tb.Context()) })
	return eng, src, out
}

// twoKeys is an opa section with keys release (a) and datateam (b) and one bundle "authz"
// served by srv with the given signing block.
func twoKeys(tb testing.TB, srv *policytest.BundleServer, signing map[string]any) Config {
	a, b := policytest.Keys(tb)
	return Config{OPA: map[string]any{
		"services": map[string]any{"bundles": map[string]any{"url": srv.URL}},
		"keys": map[string]any{
			"release":  map[string]any{"key": a.Public, "algorithm": "RS256"},
			"datateam": map[string]any{"key": b.Public, "algorithm": "RS256"},
		},
		"bundles": map[string]any{"authz": map[string]any{"service": "bundles", "resource": "/bundles/authz.tar.gz",
			"signing": signing, "polling": map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 2, "long_polling_timeout_seconds": 10}}},
	}}
}

// With several keys, a bundle that does not name its key is a configuration error naming the
// bundle and saying what to add; a bundle bound to release refuses a bundle signed by datateam.
func TestSeveralKeysBindEachBundleToItsKey(t *testing.T) {
	a, b := policytest.Keys(t)
	srv := policytest.NewBundleServer(t)
	err := twoKeys(t, srv, map[string]any{}).Validate()
	require.Error(t, err, "signing: {} with two keys lets either key sign the bundle")
	assert.Contains(t, err.Error(), "bundles.authz.signing")
	assert.Contains(t, err.Error(), "keyid: datateam")
	assert.Contains(t, err.Error(), "keyid: release")

	require.Error(t, twoKeys(t, srv, map[string]any{"keyid": "nobody"}).Validate(), "a keyid that names no key")

	eng, src := startSource(t, twoKeys(t, srv, map[string]any{"keyid": "release"}))
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	policytest.WaitFor(t, "the release bundle", 20*time.Second, func() bool { return eng.Revision() == "release-1" })
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "grant-all", Sign: policytest.Signing{Key: b.Private, KeyID: "datateam"}}))
	policytest.WaitFor(t, "the datateam bundle to be refused", 20*time.Second, func() bool {
		st := src.Status().Bundles["authz"]
		return eng.Revision() != "release-1" || st != nil && st.Code != ""
	})
	assert.Equal(t, "release-1", decideRevision(t, eng), "a bundle signed with another configured key must not be activated")
}

// TestRemoteRollbackRefusedAcrossRestart publishes v1 (iat 2000), then an older bundle and one
// without iat, which are refused (across a restart too), then the old content signed again with
// a newer iat, which is activated.
func TestRemoteRollbackRefusedAcrossRestart(t *testing.T) {
	a, _ := policytest.Keys(t)
	persist := t.TempDir()
	srv := policytest.NewBundleServer(t)
	sign := func(iat int64) policytest.Signing {
		return policytest.Signing{Key: a.Private, KeyID: DefaultVerificationKeyID, IssuedAt: iat}
	}
	cfg := remoteConfig(srv, a.Public, true, persist)
	refusedOrActive := func(src *Source, eng *decision.Engine, rev string) func() bool {
		return func() bool {
			st := src.Status().Bundles["authz"]
			return eng.Revision() == rev || st != nil && st.Code == string(coded.PolicyBundleRollback)
		}
	}

	eng, src, out := startLogged(t, cfg, hclog.Info)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "v1", Sign: sign(2000)}))
	policytest.WaitFor(t, "v1", 20*time.Second, func() bool { return eng.Revision() == "v1" })

	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "v0-old-buggy", Sign: sign(1000), Modules: policytest.MarkerModules("OLD")}))
	policytest.WaitFor(t, "the older bundle to be refused", 20*time.Second, refusedOrActive(src, eng, "v0-old-buggy"))
	assert.Equal(t, "v1", decideRevision(t, eng), "a bundle issued before the active one must not replace it")
	st := src.Status()
	assert.Equal(t, string(coded.PolicyBundleRollback), st.Bundles["authz"].Code)
	assert.Contains(t, st.Bundles["authz"].Message, "issued at 1970-01-01T00:16:40Z, before the active bundle")
	assert.Contains(t, st.LastError, coded.PolicyBundleRollback)
	assert.Contains(t, out.String(), coded.PolicyBundleRollback)
	state, err := os.ReadFile(filepath.Join(persist, orderStateName))
	require.NoError(t, err, "the order is kept beside OPA's persisted bundles")
	assert.JSONEq(t, `{"issued_at": {"authz": 2000}}`, string(state))
	src.Close(t.Context())

	// After a restart the order holds: the persisted v1 is served and v0 is refused again.
	eng2, src2, _ := startLogged(t, cfg, hclog.Info)
	assert.Equal(t, "v1", decideRevision(t, eng2))
	policytest.WaitFor(t, "the older bundle to be refused after a restart", 20*time.Second, refusedOrActive(src2, eng2, "v0-old-buggy"))
	assert.Equal(t, "v1", decideRevision(t, eng2))

	// A signed bundle without iat, while the active one has one, is refused.
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "no-iat", Sign: sign(0)}))
	policytest.WaitFor(t, "the bundle without iat to be refused", 20*time.Second, func() bool {
		st := src2.Status().Bundles["authz"]
		return eng2.Revision() == "no-iat" || st.Code == string(coded.PolicyBundleRollback) && strings.Contains(st.Message, "no iat")
	})
	assert.Equal(t, "v1", decideRevision(t, eng2))

	// A deliberate rollback: the old content signed again with a newer iat.
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "v0-resigned", Sign: sign(3000), Modules: policytest.MarkerModules("OLD")}))
	policytest.WaitFor(t, "the re-signed bundle", 20*time.Second, func() bool { return eng2.Revision() == "v0-resigned" })
	assert.Empty(t, src2.Status().Bundles["authz"].Code)
}

func TestFileBundleRollbackRefused(t *testing.T) {
	a, _ := policytest.Keys(t)
	dir := t.TempDir()
	pub := testutil.WriteFile(t, dir, "key.pem", a.Public)
	path := filepath.Join(dir, "bundle.tar.gz")
	publish := func(rev string, iat int64) {
		require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, policytest.BundleSpec{Revision: rev,
			Sign: policytest.Signing{Key: a.Private, KeyID: DefaultVerificationKeyID, IssuedAt: iat}}), 0o600))
	}
	publish("v1", 2000)
	eng := decision.New(decision.Options{})
	src, err := New(Config{Bundle: path, VerificationKey: pub}, eng, Options{})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	defer src.Close(t.Context())
	for _, tc := range []struct {
		name string
		iat  int64
		want string
	}{
		{"older", 1000, "before the active bundle"},
		{"no iat", 0, "no iat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			publish("v0-old-buggy", tc.iat)
			err := src.Reload(t.Context())
			var ce *coded.Error
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, coded.PolicyBundleRollback, ce.Code)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, "v1", decideRevision(t, eng))
			assert.Equal(t, string(coded.PolicyBundleRollback), src.Status().Bundles[path].Code)
		})
	}
	publish("v0-resigned", 3000)
	require.NoError(t, src.Reload(t.Context()))
	assert.Equal(t, "v0-resigned", decideRevision(t, eng))
}

// The system.log.mask and system.log.drop rules of a bundle file apply to OPA's decision log,
// as those of a remote bundle do.
func TestFileBundleMasksApplyToOPADecisionLogs(t *testing.T) {
	for _, layout := range []string{"file", "directory"} {
		t.Run(layout, func(t *testing.T) {
			mods := policytest.EmbeddedModules(t)
			mods["system/log.rego"] = "package system.log\n\nmask contains \"/input/secret\"\n\ndrop if input.input.dropme\n"
			spec := policytest.BundleSpec{Revision: "masked-1", Modules: mods}
			path := filepath.Join(t.TempDir(), "bundle")
			if layout == "file" {
				path += ".tar.gz"
				require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, spec), 0o600))
			} else {
				policytest.WriteBundleDir(t, path, spec)
			}
			cfg := Config{Bundle: path, OPA: map[string]any{"decision_logs": map[string]any{"console": true}}}
			eng, src, out := startLogged(t, cfg, hclog.Info)
			require.True(t, src.DecisionLogs())
			logged := func(id string, in map[string]any) {
				require.NoError(t, src.LogDecision(t.Context(), api.Decision{ID: id, Path: "authz/decision", Timestamp: time.Now(),
					Input: in, Result: map[string]any{"allow": false}, Revision: eng.Revision()}))
			}
			logged("d-dropped", map[string]any{"dropme": true, "secret": "S3CRET-DROPPED"})
			logged("d-masked", map[string]any{"operation": "openDuplexChannel", "secret": "S3CRET"})
			policytest.WaitFor(t, "the console decision log", 10*time.Second, func() bool { return strings.Contains(out.String(), "d-masked") })
			assert.NotContains(t, out.String(), "S3CRET", "system.log.mask removes /input/secret")
			assert.NotContains(t, out.String(), "d-dropped", "system.log.drop drops the event")
		})
	}
}

// evilBundle is a bundle whose one module has a name that holds a forged log line and a
// terminal escape sequence, and does not parse (OPA's error quotes the name).
func evilBundle(tb testing.TB) []byte {
	tb.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	add := func(name, body string) {
		require.NoError(tb, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		require.NoError(tb, err)
	}
	add("/.manifest", `{"revision": "evil"}`)
	add("/x.rego\n2026-01-01T00:00:00.000Z [INFO]  policy: policy activated: revision=v999\x1b[2J\u202e.rego", "package\n")
	require.NoError(tb, tw.Close())
	require.NoError(tb, zw.Close())
	return buf.Bytes()
}

// forged reports a line of out that starts (after hclog's indentation of multi-line values)
// with the forged timestamp, or a raw control character.
func forged(out string) string {
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " |"), "2026-01-01T00:00:00.000Z") {
			return line
		}
		if strings.ContainsAny(line, "\x1b\r\u202e") {
			return line
		}
	}
	return ""
}

func TestRemoteBundleTextCannotForgeLogLines(t *testing.T) {
	srv := policytest.NewBundleServer(t)
	eng, src, out := startLogged(t, remoteConfig(srv, "", true, ""), hclog.Debug)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "good"}))
	policytest.WaitFor(t, "the good bundle", 20*time.Second, func() bool { return eng.Revision() == "good" })
	srv.Publish(evilBundle(t))
	policytest.WaitFor(t, "the evil bundle to be refused", 20*time.Second, func() bool {
		st := src.Status().Bundles["authz"]
		return st != nil && st.Code != ""
	})
	policytest.WaitFor(t, "the refusal in the log", 10*time.Second, func() bool { return strings.Contains(out.String(), "x.rego") })
	assert.Empty(t, forged(out.String()), "a bundle entry name forged a log line or wrote a control character")
	st := src.Status()
	b, err := json.Marshal(st)
	require.NoError(t, err)
	var plain map[string]any
	require.NoError(t, json.Unmarshal(b, &plain))
	for _, s := range []string{st.LastError, st.Bundles["authz"].Message, string(b)} {
		assert.Empty(t, forged(s), "the status holds the raw text: %q", s)
		assert.NotContains(t, s, "\n")
	}
	require.NotEmpty(t, st.Bundles["authz"].Errors)
	for _, e := range st.Bundles["authz"].Errors {
		assert.Empty(t, forged(e.Error()), "%q", e.Error())
		assert.Contains(t, e.Error(), `x.rego\n2026`, "the entry name is shown, escaped")
	}
	assert.Equal(t, "good", decideRevision(t, eng))
}

func TestURLCredentialsRedactedInStatusAndLog(t *testing.T) {
	// A port nothing listens on: the download fails with an error that quotes the URL.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	cfg := Config{OPA: map[string]any{
		"services": map[string]any{"bundles": map[string]any{"url": "http://user:PASSWORD@" + addr}},
		"bundles": map[string]any{"authz": map[string]any{"service": "bundles", "resource": "bundles/authz.tar.gz?sig=SECRET&se=2030",
			"polling": map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 2}}},
	}}
	_, src, out := startLogged(t, cfg, hclog.Trace)
	policytest.WaitFor(t, "the download to fail", 20*time.Second, func() bool {
		st := src.Status().Bundles["authz"]
		return st != nil && st.Code != "" && strings.Contains(out.String(), "authz.tar.gz")
	})
	b, err := json.Marshal(src.Status())
	require.NoError(t, err)
	for what, s := range map[string]string{"status": string(b), "log": out.String()} {
		assert.NotContains(t, s, "SECRET", "%s: %s", what, s)
		assert.NotContains(t, s, "PASSWORD", "%s: %s", what, s)
		assert.NotContains(t, s, "2030", "%s", what)
	}
	assert.Contains(t, string(b), "sig=xxxxx", "the status still names the resource, without its credentials")
}

// A bundle server without ETag serves the same bundle at every poll: it is activated once,
// and the decision cache is kept.
func TestUnchangedBundleIsNotReactivated(t *testing.T) {
	body := policytest.MakeBundle(t, policytest.BundleSpec{Revision: "same"})
	var served atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	cfg := Config{OPA: map[string]any{
		"services": map[string]any{"bundles": map[string]any{"url": srv.URL}},
		"bundles": map[string]any{"authz": map[string]any{"service": "bundles", "resource": "b.tar.gz",
			"polling": map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 1}}},
	}}
	eng, src, out := startLogged(t, cfg, hclog.Info)
	policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return eng.Revision() == "same" })
	at := src.Status().ActivatedAt
	_, err := eng.Evaluate(t.Context(), snapshot.Input{"operation": "openDuplexChannel"})
	require.NoError(t, err)
	n := served.Load()
	policytest.WaitFor(t, "three more downloads", 20*time.Second, func() bool { return served.Load() >= n+3 })
	// The last download's activation has returned once the status has seen it.
	policytest.WaitFor(t, "the status of the last download", 10*time.Second, func() bool {
		return src.Status().Bundles["authz"].LastSuccessfulDownload.After(at)
	})
	_, err = eng.Evaluate(t.Context(), snapshot.Input{"operation": "openDuplexChannel"})
	require.NoError(t, err)
	activations := strings.Count(out.String(), "policy activated")
	t.Logf("%d downloads, %d activations, cache %+v", served.Load(), activations, eng.CacheStats())
	assert.Equal(t, 1, activations, "the unchanged bundle was activated again")
	assert.Equal(t, at, src.Status().ActivatedAt)
	assert.Equal(t, uint64(1), eng.CacheStats().Hits, "the decision cache was purged")

	// A server with ETag that publishes the same bundle under a new ETag: not activated again.
	esrv := policytest.NewBundleServer(t)
	eeng, esrc, eout := startLogged(t, remoteConfig(esrv, "", true, ""), hclog.Info)
	esrv.Publish(body)
	policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return eeng.Revision() == "same" })
	eat := esrc.Status().ActivatedAt
	esrv.Publish(body)
	policytest.WaitFor(t, "the new ETag's download", 20*time.Second, func() bool {
		return strings.Count(eout.String(), "Bundle loaded and activated successfully") >= 2
	})
	assert.Equal(t, 1, strings.Count(eout.String(), "policy activated"))
	assert.Equal(t, eat, esrc.Status().ActivatedAt)

	// A watched bundle file touched without a change is not activated again either.
	dir := t.TempDir()
	path := filepath.Join(dir, "b.tar.gz")
	require.NoError(t, os.WriteFile(path, body, 0o600))
	feng, fsrc, fout := startLogged(t, Config{Bundle: path}, hclog.Info)
	require.Equal(t, "same", feng.Revision())
	require.NoError(t, os.WriteFile(path, body, 0o600))
	require.NoError(t, fsrc.Reload(t.Context()))
	assert.Equal(t, 1, strings.Count(fout.String(), "policy activated"))
}

// A bundle's revision is shown in every answer, the status, the log and the metrics' revision
// label: a revision from outside is escaped and its URLs' credentials redacted.
func TestBundleRevisionIsCleaned(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.tar.gz")
	rev := "v1\n[INFO] forged https://u:PASSWORD@h.example/b?sig=SECRET"
	require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, policytest.BundleSpec{Revision: rev}), 0o600))
	eng, src, out := startLogged(t, Config{Bundle: path}, hclog.Info)
	want := `v1\n[INFO] forged https://xxxxx@h.example/b?sig=xxxxx`
	assert.Equal(t, want, eng.Revision())
	assert.Equal(t, want, src.Status().Revision)
	assert.Equal(t, want, decideRevision(t, eng))
	assert.NotContains(t, out.String(), "SECRET")
	for line := range strings.SplitSeq(out.String(), "\n") {
		assert.False(t, strings.HasPrefix(line, "[INFO] forged"), "a revision forged a log line: %q", line)
	}
}

// OPA's log lines and fields go through opaLogger: messages, field names and every string of a
// structured field (OPA's console decision log) are escaped and their URLs redacted; the
// structure stays for the JSON log format.
func TestOPALoggerCleansMessagesAndFields(t *testing.T) {
	for _, jsonFormat := range []bool{false, true} {
		out := &testutil.SyncBuffer{}
		lg := &opaLogger{l: hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Debug, JSONFormat: jsonFormat})}
		lg.WithFields(map[string]any{
			"url":   "https://u:PASSWORD@h.example/b.tar.gz?sig=SECRET",
			"input": map[string]any{"s": []any{"a\n2026-01-01T00:00:00.000Z [INFO] forged\x1b[2J", json.Number("7")}},
		}).Error("Bundle load failed: %v", "x.rego\n2026-01-01T00:00:00.000Z [INFO]  policy: policy activated")
		text := out.String()
		assert.Empty(t, forged(text), "json=%v: %s", jsonFormat, text)
		assert.NotContains(t, text, "SECRET")
		assert.NotContains(t, text, "PASSWORD")
		if jsonFormat {
			var line map[string]any
			require.NoError(t, json.Unmarshal([]byte(text), &line))
			assert.IsType(t, map[string]any{}, line["input"], "a structured field stays structured")
		}
	}
}

// A malformed order file stops the start: without the recorded order an older bundle would be
// accepted.
func TestRemoteOrderStateUnreadableStopsStart(t *testing.T) {
	a, _ := policytest.Keys(t)
	persist := t.TempDir()
	testutil.WriteFile(t, persist, orderStateName, "{not json")
	srv := policytest.NewBundleServer(t)
	src, err := New(remoteConfig(srv, a.Public, true, persist), decision.New(decision.Options{}), Options{})
	require.NoError(t, err)
	err = src.Start(t.Context())
	var ce *coded.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, coded.PolicyRemote, ce.Code)
	assert.Contains(t, err.Error(), orderStateName)
	assert.Contains(t, err.Error(), "restore or remove the file")
	src.Close(t.Context())
}
