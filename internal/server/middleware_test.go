package server

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testutil"
)

const (
	mwDecideToken  = "d3c1de-middleware-0123456789"
	mwInspectToken = "1nspect-middleware-0123456789"
)

// denyingDecider denies every request; the middlewares never ask it.
type denyingDecider struct{}

func (denyingDecider) Decide(context.Context, *snapshot.Request, snapshot.Facts) (decision.Document, snapshot.Input, error) {
	return decision.Document{}, nil, nil
}

func (denyingDecider) Revision() string { return "" }

// bodyReads counts the reads of a request body.
type bodyReads struct {
	r     io.Reader
	reads int
}

func (b *bodyReads) Read(p []byte) (int, error) {
	b.reads++
	return b.r.Read(p)
}

// middlewareServer is a server authenticating with bearer tokens, its log written to log.
func middlewareServer(t testing.TB, log io.Writer) *Server {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte(mwDecideToken+" decide\n"+mwInspectToken+" inspect\n"), 0o600))
	cfg := DefaultConfig()
	cfg.Authentication.Mode = AuthToken
	cfg.Authentication.TokensFile = tokens
	facts, err := LoadStaticFacts(filepath.Join("testdata", "facts.json"))
	require.NoError(t, err)
	s, err := New(cfg, denyingDecider{}, facts, Options{Logger: hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Debug})})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// requestCounts is authz_http_requests_total by "route status".
func requestCounts(t testing.TB, s *Server) map[string]float64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	require.NoError(t, err)
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "authz_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			counts[labels["route"]+" "+labels["status"]] = m.GetCounter().GetValue()
		}
	}
	return counts
}

// TestMiddlewares drives the route table's middlewares through each concern: the request
// counter, panic recovery, 404, access control and 405, in that order.
func TestMiddlewares(t *testing.T) {
	tests := []struct {
		name   string
		method string
		path   string
		token  string
		// host, when set, is the Host header of a request that arrived on a loopback address.
		host string
		// wantServed: the route's handler ran.
		wantServed bool
		wantStatus int
		wantCode   string // "" for the handler's own answer
		// wantDecisionShape: the error carries "allow": false (decision endpoints).
		wantDecisionShape bool
		wantHeader        map[string]string // "" asserts the header is absent
		wantCount         string            // the one "route status" counted; "" for none
		wantPanic         any
		wantLog           string
	}{
		{name: "served", method: http.MethodGet, path: "/inspect", token: mwInspectToken,
			wantServed: true, wantStatus: 200, wantCount: "/inspect 200"},
		{name: "HEAD on a GET route", method: http.MethodHead, path: "/inspect", token: mwInspectToken,
			wantServed: true, wantStatus: 200, wantCount: "/inspect 200"},
		{name: "unknown path, access not checked", method: http.MethodGet, path: "/nowhere",
			wantStatus: 404, wantCode: "NOT_FOUND", wantHeader: map[string]string{"WWW-Authenticate": ""},
			wantCount: "other 404"},
		{name: "unknown path, Host not checked", method: http.MethodGet, path: "/nowhere", host: "rebound.example",
			wantStatus: 404, wantCode: "NOT_FOUND", wantCount: "other 404"},
		{name: "path that needs unescaping", method: http.MethodGet, path: "/%69nspect", token: mwInspectToken,
			wantStatus: 404, wantCode: "NOT_FOUND", wantCount: "other 404"},
		{name: "wrong method on a GET route", method: http.MethodPost, path: "/inspect", token: mwInspectToken,
			wantStatus: 405, wantCode: "METHOD_NOT_ALLOWED", wantHeader: map[string]string{"Allow": "GET, HEAD"},
			wantCount: "/inspect 405"},
		{name: "wrong method on a POST route", method: http.MethodGet, path: "/decide", token: mwDecideToken,
			wantStatus: 405, wantCode: "METHOD_NOT_ALLOWED", wantHeader: map[string]string{"Allow": "POST"},
			wantCount: "/decide 405"},
		{name: "access before method", method: http.MethodPost, path: "/inspect",
			wantStatus: 401, wantCode: "UNAUTHORIZED",
			wantHeader: map[string]string{"WWW-Authenticate": `Bearer realm="authz"`, "Allow": ""},
			wantCount:  "/inspect 401", wantLog: "request refused: path=/inspect code=UNAUTHORIZED"},
		{name: "Host refused", method: http.MethodGet, path: "/inspect", token: mwInspectToken, host: "rebound.example",
			wantStatus: 403, wantCode: "HOST_NOT_ALLOWED", wantHeader: map[string]string{"WWW-Authenticate": ""},
			wantCount: "/inspect 403", wantLog: "request refused: path=/inspect code=HOST_NOT_ALLOWED"},
		{name: "no token on a decide route", method: http.MethodPost, path: "/decide",
			wantStatus: 401, wantCode: "UNAUTHORIZED", wantDecisionShape: true,
			wantHeader: map[string]string{"WWW-Authenticate": `Bearer realm="authz"`},
			wantCount:  "/decide 401", wantLog: "request refused: path=/decide code=UNAUTHORIZED"},
		{name: "unknown token on a decide route", method: http.MethodPost, path: "/decide", token: "not-a-token-0123456789",
			wantStatus: 401, wantCode: "UNAUTHORIZED", wantDecisionShape: true,
			wantHeader: map[string]string{"WWW-Authenticate": `Bearer realm="authz"`}, wantCount: "/decide 401"},
		{name: "wrong scope on a decide route", method: http.MethodPost, path: "/decide", token: mwInspectToken,
			wantStatus: 403, wantCode: "FORBIDDEN", wantDecisionShape: true,
			wantHeader: map[string]string{"WWW-Authenticate": ""}, wantCount: "/decide 403"},
		{name: "no token on a Data API path", method: http.MethodPost, path: "/v1/data/authz/allow",
			wantStatus: 401, wantCode: "UNAUTHORIZED", wantDecisionShape: true,
			wantHeader: map[string]string{"WWW-Authenticate": `Bearer realm="authz"`}, wantCount: labelDataOther + " 401"},
		{name: "panic", method: http.MethodGet, path: "/panic",
			wantServed: true, wantStatus: 500, wantCode: "INTERNAL_ERROR", wantCount: "/panic 500",
			wantLog: "handler panicked: path=/panic panic=boom"},
		{name: "panic after the answer began", method: http.MethodGet, path: "/panic-answered",
			wantServed: true, wantStatus: 200, wantCount: "/panic-answered 200",
			wantLog: "handler panicked: path=/panic-answered panic=boom"},
		{name: "abort", method: http.MethodGet, path: "/abort",
			wantServed: true, wantPanic: http.ErrAbortHandler},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log testutil.SyncBuffer
			s := middlewareServer(t, &log)
			served := false
			answer := func(w http.ResponseWriter, r *http.Request) {
				served = true
				_, _ = io.ReadAll(r.Body)
				writeJSON(w, http.StatusOK, map[string]string{"served": r.URL.Path})
			}
			h := s.serveRoutes(map[string]route{
				"/inspect": {http.MethodGet, answer, ScopeInspect},
				"/decide":  {http.MethodPost, answer, ScopeDecide},
				"/panic":   {http.MethodGet, func(http.ResponseWriter, *http.Request) { served = true; panic("boom") }, ""},
				"/panic-answered": {http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
					answer(w, r)
					panic("boom")
				}, ""},
				"/abort": {http.MethodGet, func(http.ResponseWriter, *http.Request) { served = true; panic(http.ErrAbortHandler) }, ""},
			})
			body := &bodyReads{r: strings.NewReader(`{}`)}
			r := httptest.NewRequest(tt.method, tt.path, body)
			if tt.host != "" {
				r.Host = tt.host
				r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8181}))
			}
			if tt.token != "" {
				r.Header.Set("Authorization", "Bearer "+tt.token)
			}
			w := httptest.NewRecorder()

			if tt.wantPanic != nil {
				assert.PanicsWithValue(t, tt.wantPanic, func() { h.ServeHTTP(w, r) })
			} else {
				h.ServeHTTP(w, r)
			}

			assert.Equal(t, tt.wantServed, served, "handler served")
			if !tt.wantServed {
				assert.Zero(t, body.reads, "the body of a request its handler did not serve is not read")
			}
			counts := requestCounts(t, s)
			if tt.wantCount == "" {
				assert.Empty(t, counts)
			} else {
				assert.Equal(t, map[string]float64{tt.wantCount: 1}, counts)
			}
			if tt.wantLog != "" {
				assert.Contains(t, log.String(), tt.wantLog)
			}
			if tt.wantPanic != nil {
				return
			}
			require.Equal(t, tt.wantStatus, w.Code, "body %s", w.Body)
			for k, v := range tt.wantHeader {
				assert.Equal(t, v, w.Header().Get(k), k)
			}
			var got map[string]any
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got), "body %s", w.Body)
			if tt.wantCode == "" {
				assert.Equal(t, map[string]any{"served": tt.path}, got)
				return
			}
			assert.Equal(t, tt.wantCode, got["code"])
			assert.NotEmpty(t, got["message"])
			if tt.wantDecisionShape {
				assert.Equal(t, false, got["allow"])
			} else {
				assert.NotContains(t, got, "allow")
			}
		})
	}
}
