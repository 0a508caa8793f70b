package service

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/testutil"
)

// servedGate assembles the gate of cfg on a loopback listener, starts it and serves it until
// Close; done is closed when Serve returned.
func servedGate(t *testing.T, cfg Config, log *testutil.SyncBuffer) (g *Gate, base string, done <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.Log.Level = "debug"
	g, err = NewGate(t.Context(), cfg, GateOptions{LogOutput: log, Listener: ln})
	require.NoError(t, err)
	require.NoError(t, g.Start(t.Context()))
	served := make(chan struct{})
	go func() {
		defer close(served)
		assert.NoError(t, g.Serve(context.Background()))
	}()
	base = "http://" + g.Addr().String()
	testutil.WaitReady(t, &http.Client{Timeout: 10 * time.Second}, base, 30*time.Second, log)
	return g, base, served
}

// closeWithin closes g and fails the test when Close has not returned within d.
func closeWithin(t *testing.T, g *Gate, d time.Duration) {
	t.Helper()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		g.Close()
	}()
	select {
	case <-closed:
	case <-time.After(d):
		t.Fatalf("Close did not return within %v", d)
	}
}

// TestGateCloseOrder: Close stops the parts of the gate one after the other, in this order:
// the HTTP server, the plugins, the decision log, the policy source, the tracing, and then the
// log says "stopped: exiting".
func TestGateCloseOrder(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Host.Plugins = []pluginhost.PluginConfig{}
	cfg.Server.DecisionLog.Path = filepath.Join(t.TempDir(), "decisions.log")
	log := &testutil.SyncBuffer{}
	g, _, served := servedGate(t, cfg, log)

	var mu sync.Mutex
	var order []string
	record := func(name string, stop func()) func() {
		return func() {
			if stop != nil {
				stop()
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		}
	}
	g.closeHost = record("plugins", g.closeHost)
	g.closeLog = record("decision log", g.closeLog)
	g.closePolicy = record("policy", g.closePolicy)
	g.closeTracing = record("tracing", g.closeTracing)

	closeWithin(t, g, time.Minute)
	<-served
	assert.Equal(t, []string{"plugins", "decision log", "policy", "tracing"}, order)
	testutil.AssertLogOrder(t, log.String(), "shutting down", "HTTP server stopped", "part=plugins", "stopping plugins",
		"plugins stopped", `part="decision log"`, "part=policy", "part=tracing", "stopped: exiting")
	g.Close() // a second Close does nothing
}

// TestGateCloseBoundedWithAStuckPart: a part that never stops holds up Close for the part
// time-out only: the log says which part did not stop, and the parts after it still stop, in
// order, before "stopped: exiting".
func TestGateCloseBoundedWithAStuckPart(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Facts = filepath.Join("..", "server", "testdata", "facts.json")
	cfg.Server.DecisionLog.Path = filepath.Join(t.TempDir(), "decisions.log")
	log := &testutil.SyncBuffer{}
	g, _, served := servedGate(t, cfg, log)

	release := make(chan struct{})
	stuck := make(chan struct{})
	defer close(release)
	g.partTimeout = 200 * time.Millisecond
	g.closeHost = func() { close(stuck); <-release } // a plugin host that never ends its workers
	logClosed := false
	g.closeLog = func() { logClosed = true }

	closeWithin(t, g, 30*time.Second)
	<-served
	<-stuck
	assert.True(t, logClosed, "the decision log is closed after the stuck part")
	testutil.AssertLogOrder(t, log.String(), "HTTP server stopped",
		"a part of the gate did not stop in time; stopping the next ones: part=plugins timeout=200ms",
		`stopping: part="decision log"`, "stopped: exiting")
}
