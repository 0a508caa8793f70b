package opaplugin

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/service"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// lifecycleLines are the log lines of a gate's start and stop, in the order a gate logs them.
var lifecycleLines = regexp.MustCompile(`(?m)using static facts|listening|shutting down|HTTP server stopped|stopping plugins|plugins stopped|authz: stopped(: exiting)?$`)

// lifecycle is the sequence of lifecycle lines in log.
func lifecycle(log string) []string {
	return lifecycleLines.FindAllString(log, -1)
}

// endpoints answers each endpoint of the gate at base, as "METHOD PATH STATUS".
func endpoints(t *testing.T, base string) []string {
	t.Helper()
	reqJSON, _ := specexamples.NewFixture().JSON()
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	var out []string
	for _, e := range []struct{ method, path, body string }{
		{"GET", "/health", ""}, {"GET", "/health/ready", ""}, {"GET", "/v1/plugins", ""}, {"GET", "/v1/facts", ""},
		{"GET", "/v1/status", ""}, {"GET", "/metrics", ""}, {"GET", "/nowhere", ""},
		{"POST", "/v1/authorize", string(reqJSON)}, {"POST", "/v1/capabilities", string(reqJSON)},
		{"POST", "/v1/data/authz/decision", `{"input": ` + string(reqJSON) + `}`},
		{"POST", "/v1/authorize", "{"},
	} {
		req, err := http.NewRequestWithContext(t.Context(), e.method, base+e.path, strings.NewReader(e.body))
		require.NoError(t, err)
		if e.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, e.method+" "+e.path+" "+http.StatusText(resp.StatusCode))
	}
	return out
}

// TestGateAssembledLikeServe: `authz serve` (service.Run) and the gate inside OPA are one
// assembly: with the same facts file they answer the same endpoints with the same statuses,
// and they log their start and their stop in the same order, ending with "stopped: exiting".
func TestGateAssembledLikeServe(t *testing.T) {
	facts := specFactsFile(t)

	serveLog := &testutil.SyncBuffer{}
	cfg := service.DefaultConfig()
	cfg.Facts = facts
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	stop := testutil.RunUntilStopped(t, "Run", 30*time.Second, func(ctx context.Context) error {
		return service.Run(ctx, cfg, service.Options{LogOutput: serveLog, Listener: ln})
	})
	serveURL := "http://" + ln.Addr().String()
	testutil.WaitReady(t, &http.Client{Timeout: 10 * time.Second}, serveURL, 30*time.Second, serveLog)

	gateLog := &testutil.SyncBuffer{}
	m := newManager(t, nil)
	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+facts+`"}`, gateLog)
	waitState(t, m, plugins.StateOK)
	gateURL := "http://" + p.Addr().String()

	assert.Equal(t, endpoints(t, serveURL), endpoints(t, gateURL))

	require.NoError(t, stop())
	p.Stop(t.Context())
	assert.Equal(t, []string{"using static facts", "listening", "shutting down", "HTTP server stopped", "authz: stopped: exiting"},
		lifecycle(serveLog.String()), "authz serve:\n%s", serveLog)
	assert.Equal(t, lifecycle(serveLog.String()), lifecycle(gateLog.String()), "the gate in OPA:\n%s", gateLog)
}
