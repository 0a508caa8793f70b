//go:build unix

package server_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/testdrivers/checks"
)

// BenchmarkAuthorizePluginHost measures one repeated grant through the whole handler, in
// process, over a plugin host with a real driver: the config check's answer is kept and the
// decision cached, so it measures what a cached decision costs on the plugin host's facts.
func BenchmarkAuthorizePluginHost(b *testing.B) {
	self, sum := driverProgram(b)
	dir := b.TempDir()
	p := pluginhost.PluginConfig{ID: "fast", Path: self, SHA256: sum,
		Args:    []string{checks.Marker, "-plugin-key", "checks.fast", "-dir", dir},
		Sandbox: pluginhost.SandboxConfig{WritePaths: []string{dir}}}
	if os.Getuid() == 0 {
		p.User = "root" // the driver writes to dir, a directory of the benchmark's own
	}
	cfg := pluginhost.DefaultConfig()
	cfg.Plugins = []pluginhost.PluginConfig{p}
	cfg.StartTimeout = 30 * time.Second
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: testWriter{b}})
	host, err := pluginhost.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = host.Close() })
	if err := host.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.Context(), 60*time.Second)
	defer cancel()
	if err := host.WaitStarted(ctx); err != nil {
		b.Fatal(err)
	}
	h := newServer(b, withFacts(host)).Handler()
	body := []byte(driverRequest(b, "fast", 0))
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/authorize", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"allow":true`)) {
			b.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
	}
}
