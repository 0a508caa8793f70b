package opaplugin

import (
	"context"
	"fmt"
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

// metricValue is the value of the unlabelled metric name in a Prometheus text exposition; -1
// when it is not there.
func metricValue(text, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` ([0-9.e+]+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	var v float64
	_, _ = fmt.Sscan(m[1], &v)
	return v
}

// TestGateCachesDecisionsByDefault: the gate inside OPA answers a repeated decision from its
// decision cache unless decisionCache is off, and GET /metrics counts the hits and misses as
// under `authz serve`.
func TestGateCachesDecisionsByDefault(t *testing.T) {
	const repeats = 20
	reqJSON, _ := specexamples.NewFixture().JSON()
	for _, tt := range []struct {
		name       string
		cache      string
		hits, miss float64
	}{
		{name: "default", cache: "", hits: repeats - 1, miss: 1},
		{name: "off", cache: `, "decisionCache": "off"`, hits: 0, miss: 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := newManager(t, nil)
			p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"`+tt.cache+`}`, io.Discard)
			waitState(t, m, plugins.StateOK)
			base := "http://" + p.Addr().String()
			for range repeats {
				status, _, _ := post(t, base+"/v1/authorize", reqJSON)
				require.Equal(t, http.StatusOK, status)
			}
			c := &http.Client{Timeout: 10 * time.Second}
			defer c.CloseIdleConnections()
			resp, err := c.Get(base + "/metrics")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			hits := metricValue(string(body), "authz_decision_cache_hits_total")
			misses := metricValue(string(body), "authz_decision_cache_misses_total")
			t.Logf("decision cache %s: %v hits, %v misses of %d repeated decisions", tt.name, hits, misses, repeats)
			assert.Equal(t, tt.hits, hits, "cache hits")
			assert.Equal(t, tt.miss, misses, "cache misses")
		})
	}
}
