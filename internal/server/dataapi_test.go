package server_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
)

// countingDecider counts the decisions it makes.
type countingDecider struct {
	server.Decider
	n atomic.Int64
}

func (d *countingDecider) Decide(ctx context.Context, req *snapshot.Request, f snapshot.Facts) (decision.Document, snapshot.Input, error) {
	d.n.Add(1)
	return d.Decider.Decide(ctx, req, f)
}

func inputBody(request string) string { return `{"input":` + request + `}` }

func gzipped(t testing.TB, s string) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return &b
}

// withoutID drops the decision ids (they differ per decision), also inside "result".
func withoutID(m map[string]any) map[string]any {
	delete(m, "decision_id")
	if r, ok := m["result"].(map[string]any); ok {
		delete(r, "decision_id")
	}
	return m
}

func TestDataAPIServesEveryPathOfTheDecision(t *testing.T) {
	counter := &countingDecider{Decider: testEngine(t)}
	url := startHTTP(t, newServer(t, withDecider(counter)))
	deny := fixture(t, func(r map[string]any) { metadata(r)["pluginId"] = "missing.plugin" })
	grant := fixture(t, nil)

	tests := []struct {
		name    string
		request string
		path    string
		want    any
		// undefined: the answer has no "result", as OPA answers an undefined document.
		undefined bool
	}{
		{name: "allow of a grant", request: grant, path: "allow", want: true},
		{name: "allow of a deny", request: deny, path: "allow", want: false},
		{name: "code", request: deny, path: "code", want: "DUPLEX_CHANNEL_CAPABILITY_DENIED"},
		{name: "message", request: deny, path: "message", want: "Sandbox lease does not grant the duplex command stream capability."},
		{name: "reasons", request: deny, path: "reasons", want: []any{"plugin_not_found"}},
		{name: "one reason", request: deny, path: "reasons/0", want: "plugin_not_found"},
		{name: "a reason past the end", request: deny, path: "reasons/1", undefined: true},
		{name: "no reasons on a grant", request: grant, path: "reasons/0", undefined: true},
		{name: "one capability", request: grant, path: "capabilities/duplexCommandStream", want: true},
		{name: "another capability", request: grant, path: "capabilities/persistentProcessSessions", want: false},
		{name: "revision", request: grant, path: "revision", want: testEngine(t).Revision()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := counter.n.Load()
			a := post(t, url+"/v1/data/authz/decision/"+tt.path, inputBody(tt.request))
			require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
			assert.Equal(t, int64(1), counter.n.Load()-before, "one evaluation per request")
			m := a.json(t)
			assert.NotEmpty(t, m["decision_id"])
			if tt.undefined {
				assert.NotContains(t, m, "result")
				return
			}
			assert.Equal(t, tt.want, m["result"])
		})
	}

	t.Run("the capabilities object and the decision id agree with the whole document", func(t *testing.T) {
		whole := post(t, url+"/v1/authorize", grant).json(t)
		caps := post(t, url+"/v1/data/authz/decision/capabilities", inputBody(grant)).json(t)
		assert.Equal(t, whole["capabilities"], caps["result"])
		id := post(t, url+"/v1/data/authz/decision/decision_id", inputBody(grant)).json(t)
		assert.Equal(t, id["decision_id"], id["result"], "the id answered is the decision's own")
	})
}

func TestDataAPIUnknownPathIsNotFound(t *testing.T) {
	url := startHTTP(t, newServer(t))
	tests := []struct {
		name, path, wantInMsg string
	}{
		{name: "misspelt key", path: "alow", wantInMsg: "allow, code, message"},
		{name: "unknown capability", path: "capabilities/duplex", wantInMsg: "duplexCommandStream"},
		{name: "reasons by name", path: "reasons/first", wantInMsg: "index"},
		{name: "negative index", path: "reasons/-1", wantInMsg: "index"},
		{name: "inside a boolean", path: "allow/x", wantInMsg: "no member"},
		{name: "too deep", path: "capabilities/duplexCommandStream/x", wantInMsg: "no member"},
		{name: "trailing slash", path: "", wantInMsg: "allow, code"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := post(t, url+"/v1/data/authz/decision/"+tt.path, inputBody(fixture(t, nil)))
			requireAPIError(t, a, http.StatusNotFound, "NOT_FOUND")
			assert.Contains(t, a.json(t)["message"], tt.wantInMsg)
		})
	}
}

func TestDefaultDecisionAtRoot(t *testing.T) {
	url := startHTTP(t, newServer(t))
	for _, name := range []string{"grant", "deny"} {
		t.Run(name+": the decision document itself, as /v1/authorize answers it", func(t *testing.T) {
			req := fixture(t, nil)
			if name == "deny" {
				req = fixture(t, func(r map[string]any) { metadata(r)["driver"] = "local" })
			}
			a := post(t, url+"/", req)
			require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
			doc := a.json(t)
			requireDocument(t, doc)
			assert.Equal(t, withoutID(post(t, url+"/v1/authorize", req).json(t)), withoutID(doc))
		})
	}
	t.Run("a Data API body is a 400 that names the right endpoint", func(t *testing.T) {
		a := post(t, url+"/", inputBody(fixture(t, nil)))
		requireAPIError(t, a, http.StatusBadRequest, "BAD_REQUEST")
		assert.Contains(t, a.json(t)["message"], "/v1/data/authz/decision")
	})
	t.Run("GET is not allowed", func(t *testing.T) {
		a := get(t, url+"/")
		requireAPIError(t, a, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")
		assert.Equal(t, "POST", a.header.Get("Allow"))
	})
}

func TestAuthorizeRefusesADataAPIBody(t *testing.T) {
	url := startHTTP(t, newServer(t))
	for _, path := range []string{"/v1/authorize", "/v1/capabilities"} {
		t.Run(path, func(t *testing.T) {
			a := post(t, url+path, inputBody(fixture(t, nil)))
			requireAPIError(t, a, http.StatusBadRequest, "BAD_REQUEST")
			assert.Contains(t, a.json(t)["message"], "POST {\"input\": <request>} to /v1/data/authz/decision")
		})
	}
	t.Run("a request that also has an input member is a request", func(t *testing.T) {
		a := post(t, url+"/v1/authorize", fixture(t, func(r map[string]any) { r["input"] = "ignored" }))
		require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
		assert.Equal(t, true, a.json(t)["allow"])
	})
}

func TestDataAPIBodyAsOPAReadsIt(t *testing.T) {
	cfg := withConfig(func(c *server.Config) { c.MaxBodyBytes = 4096 })
	url := startHTTP(t, newServer(t, cfg))
	body := inputBody(fixture(t, nil))
	want := withoutID(post(t, url+"/v1/data/authz/decision", body).json(t))
	require.Equal(t, true, want["result"].(map[string]any)["allow"])

	tests := []struct {
		name, path, contentType, encoding string
		body                              func() *bytes.Buffer
		wantStatus                        int
		wantCode                          string
	}{
		{name: "no content type", path: "/v1/data/authz/decision", body: func() *bytes.Buffer { return bytes.NewBufferString(body) }, wantStatus: 200},
		{name: "form content type, as curl -d sends", path: "/v1/data/authz/decision", contentType: "application/x-www-form-urlencoded", body: func() *bytes.Buffer { return bytes.NewBufferString(body) }, wantStatus: 200},
		{name: "text/plain at the default decision", path: "/", contentType: "text/plain", body: func() *bytes.Buffer { return bytes.NewBufferString(fixture(t, nil)) }, wantStatus: 200},
		{name: "gzip", path: "/v1/data/authz/decision", contentType: "application/json", encoding: "gzip", body: func() *bytes.Buffer { return gzipped(t, body) }, wantStatus: 200},
		{name: "gzip below the decision", path: "/v1/data/authz/decision/allow", encoding: "gzip", body: func() *bytes.Buffer { return gzipped(t, body) }, wantStatus: 200},
		{name: "gzip that is not gzip", path: "/v1/data/authz/decision", encoding: "gzip", body: func() *bytes.Buffer { return bytes.NewBufferString(body) }, wantStatus: 400, wantCode: "BAD_REQUEST"},
		{name: "gzip that expands past the limit", path: "/v1/data/authz/decision", encoding: "gzip", body: func() *bytes.Buffer {
			return gzipped(t, `{"input":{"pad":"`+strings.Repeat("a", 8192)+`"}}`)
		}, wantStatus: 413, wantCode: "REQUEST_TOO_LARGE"},
		{name: "another encoding", path: "/v1/data/authz/decision", encoding: "br", body: func() *bytes.Buffer { return bytes.NewBufferString(body) }, wantStatus: 415, wantCode: "UNSUPPORTED_MEDIA_TYPE"},
		{name: "the other endpoints still want JSON", path: "/v1/authorize", contentType: "application/x-www-form-urlencoded", body: func() *bytes.Buffer { return bytes.NewBufferString(fixture(t, nil)) }, wantStatus: 415, wantCode: "UNSUPPORTED_MEDIA_TYPE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+tt.path, tt.body())
			require.NoError(t, err)
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			if tt.encoding != "" {
				req.Header.Set("Content-Encoding", tt.encoding)
			}
			resp, err := testClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			var m map[string]any
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
			require.Equal(t, tt.wantStatus, resp.StatusCode, "answer %v", m)
			if tt.wantCode != "" {
				assert.Equal(t, tt.wantCode, m["code"])
				assert.NotContains(t, m, "result")
				return
			}
			switch tt.path {
			case "/":
				assert.Equal(t, true, m["allow"])
			case "/v1/data/authz/decision/allow":
				assert.Equal(t, true, m["result"])
			default:
				assert.Equal(t, want, withoutID(m))
			}
		})
	}
}

func TestDataAPIQueryParameters(t *testing.T) {
	url := startHTTP(t, newServer(t))
	body := inputBody(fixture(t, nil))
	tests := []struct {
		name, query string
		wantStatus  int
		wantPretty  bool
		wantInMsg   string
	}{
		{name: "pretty=true", query: "?pretty=true", wantStatus: 200, wantPretty: true},
		{name: "pretty alone", query: "?pretty", wantStatus: 200, wantPretty: true},
		{name: "pretty=false", query: "?pretty=false", wantStatus: 200},
		{name: "pretty=yes", query: "?pretty=yes", wantStatus: 400, wantInMsg: "pretty"},
		{name: "explain", query: "?explain=full", wantStatus: 400, wantInMsg: `"explain" is not implemented`},
		{name: "metrics", query: "?pretty=true&metrics=true", wantStatus: 400, wantInMsg: `"metrics" is not implemented`},
		{name: "provenance", query: "?provenance", wantStatus: 400, wantInMsg: `"provenance" is not implemented`},
		{name: "instrument", query: "?instrument=true", wantStatus: 400, wantInMsg: `"instrument" is not implemented`},
		{name: "strict-builtin-errors", query: "?strict-builtin-errors=true", wantStatus: 400, wantInMsg: `"strict-builtin-errors" is not implemented`},
		{name: "unknown", query: "?foo=bar", wantStatus: 400, wantInMsg: `unknown query parameter "foo"`},
		{name: "malformed", query: "?pretty=%zz", wantStatus: 400, wantInMsg: "malformed"},
	}
	for _, tt := range tests {
		for _, path := range []string{"/v1/data/authz/decision", "/v1/data/authz/decision/allow", "/"} {
			t.Run(tt.name+" "+path, func(t *testing.T) {
				b := body
				if path == "/" {
					b = fixture(t, nil)
				}
				a := post(t, url+path+tt.query, b)
				if tt.wantStatus != http.StatusOK {
					requireAPIError(t, a, tt.wantStatus, "BAD_REQUEST")
					assert.Contains(t, a.json(t)["message"], tt.wantInMsg)
					return
				}
				require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
				assert.Equal(t, tt.wantPretty, bytes.Contains(a.body, []byte("\n  ")), "indented: %s", a.body)
				a.json(t)
			})
		}
	}
}

func TestDataAPISubpathFailsClosed(t *testing.T) {
	url := startHTTP(t, newServer(t, withDecider(failingDecider{err: &coded.Error{Code: coded.EvalTimeout, Err: context.DeadlineExceeded}})))
	for _, path := range []string{"allow", "capabilities/duplexCommandStream"} {
		t.Run(path, func(t *testing.T) {
			a := post(t, url+"/v1/data/authz/decision/"+path, inputBody(fixture(t, nil)))
			require.Equal(t, http.StatusInternalServerError, a.status)
			assert.Equal(t, "EVAL_TIMEOUT", a.header.Get("X-Authz-Error"))
			assert.Equal(t, false, a.json(t)["result"])
		})
	}
	t.Run("default decision", func(t *testing.T) {
		a := post(t, url+"/", fixture(t, nil))
		require.Equal(t, http.StatusInternalServerError, a.status)
		doc := a.json(t)
		assert.Equal(t, false, doc["allow"])
		assert.Equal(t, []any{"evaluation_failed"}, doc["reasons"])
	})
}

func TestDataAPIMetricsLabel(t *testing.T) {
	url := startHTTP(t, newServer(t))
	post(t, url+"/v1/data/authz/decision/reasons/7", inputBody(fixture(t, nil)))
	post(t, url+"/", fixture(t, nil))
	m := string(get(t, url+"/metrics").body)
	assert.Contains(t, m, `authz_http_requests_total{route="/v1/data/authz/decision/*",status="200"} 1`)
	assert.Contains(t, m, `authz_http_requests_total{route="/",status="200"} 1`)
}

// Paths of the data tree outside the decision document are OPA's undefined document: 200 with
// no "result" (and so never a grant-shaped answer), without a decision being made or logged.
func TestDataAPIOutsideTheDecisionIsUndefined(t *testing.T) {
	counter := &countingDecider{Decider: testEngine(t)}
	var log lockedBuffer
	url := startHTTP(t, newServer(t, withDecider(counter), withDecisionLog(&log)))
	grant := fixture(t, nil)
	tests := []struct {
		name, path, body string
	}{
		{name: "a rule beside the decision", path: "/v1/data/authz/allow", body: inputBody(grant)},
		{name: "the package", path: "/v1/data/authz", body: inputBody(grant)},
		{name: "the root of the data tree", path: "/v1/data", body: inputBody(grant)},
		{name: "another package", path: "/v1/data/system/main", body: inputBody(grant)},
		{name: "a name that starts like the decision", path: "/v1/data/authz/decisions", body: inputBody(grant)},
		{name: "no input", path: "/v1/data/authz/allow", body: `{}`},
		{name: "an empty body", path: "/v1/data/authz", body: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := post(t, url+tt.path, tt.body)
			require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
			assert.Equal(t, "application/json", a.header.Get("Content-Type"))
			assert.Equal(t, map[string]any{}, a.json(t), "an undefined document has no result")
		})
	}
	assert.Zero(t, counter.n.Load(), "no decision is made for a path outside the decision")
	assert.Empty(t, log.lines(t), "nothing is logged: no decision was made")

	t.Run("a malformed body is still 400", func(t *testing.T) {
		for _, body := range []string{`{"input":`, `[1]`, `"input"`} {
			requireAPIError(t, post(t, url+"/v1/data/authz/allow", body), http.StatusBadRequest, "BAD_REQUEST")
		}
	})
	t.Run("only POST", func(t *testing.T) {
		a := do(t, http.MethodGet, url+"/v1/data/authz/allow", "", nil)
		requireAPIError(t, a, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")
	})
	t.Run("the body limit holds", func(t *testing.T) {
		big := `{"input":"` + strings.Repeat("x", int(testConfig().MaxBodyBytes)) + `"}`
		requireAPIError(t, post(t, url+"/v1/data/authz", big), http.StatusRequestEntityTooLarge, "REQUEST_TOO_LARGE")
	})
	t.Run("a percent-encoded path is still no path", func(t *testing.T) {
		requireAPIError(t, post(t, url+"/v1/data/authz%2Fallow", inputBody(grant)), http.StatusNotFound, "NOT_FOUND")
	})
	t.Run("one bounded metrics label", func(t *testing.T) {
		m := string(get(t, url+"/metrics").body)
		assert.Contains(t, m, `authz_http_requests_total{route="/v1/data/*",status="200"} 7`)
	})
}

// A path outside the decision needs the decide scope like the decision itself: an undefined
// answer is not given to a caller the decision would refuse.
func TestDataAPIOutsideTheDecisionNeedsTheDecideScope(t *testing.T) {
	url := startHTTP(t, newServer(t, withTokens(t)))
	tests := []struct {
		name       string
		header     map[string]string
		wantStatus int
	}{
		{name: "no token", wantStatus: http.StatusUnauthorized},
		{name: "inspect token", header: bearer(inspectToken), wantStatus: http.StatusForbidden},
		{name: "decide token", header: bearer(decideToken), wantStatus: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, path := range []string{"/v1/data/authz/allow", "/v1/data/authz", "/v1/data"} {
				a := call(t, http.DefaultClient, http.MethodPost, url+path, "", tt.header, `{"input":{}}`)
				assert.Equal(t, tt.wantStatus, a.status, "%s: %s", path, a.body)
				assert.NotContains(t, a.json(t), "result", path)
			}
		})
	}
}
