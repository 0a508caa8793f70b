package opaplugin

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestGuardOPA: in front of OPA's routes, a write (any method but GET, HEAD, POST, whatever
// the path's spelling) is refused (403 OPA_WRITE_API_OFF) unless opaWriteAPI; reads and queries pass; a Host that does not
// name the loopback listener is refused (403 HOST_NOT_ALLOWED) unless allowed.
func TestGuardOPA(t *testing.T) {
	local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8181}
	tests := []struct {
		method, path, host string
		st                 settings
		want               int
		code               string
	}{
		{method: "PUT", path: "/v1/policies/x", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "DELETE", path: "/v1/policies/x", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "PUT", path: "/v1/data", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "PATCH", path: "/v1/data/authz/x", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "DELETE", path: "/v1/data/system/bundles/authz", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "PUT", path: "/v1/policies/x", st: settings{writeAPI: true}, want: 200},
		{method: "GET", path: "/v1/policies", want: 200},
		{method: "POST", path: "/v1/data/authz/decision", want: 200},
		{method: "GET", path: "/v1/data/authz", want: 200},
		{method: "PUT", path: "/v1/policiesx", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "PUT", path: "//v1/policies/x", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "PUT", path: "/v1/./policies/x", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "PUT", path: "/v1/%70olicies/x", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "PATCH", path: "/v1/data/../data/x", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "OPTIONS", path: "/v1/data", want: 403, code: "OPA_WRITE_API_OFF"},
		{method: "GET", path: "/health", host: "attacker.example:8181", want: 403, code: "HOST_NOT_ALLOWED"},
		{method: "PUT", path: "/v1/policies/x", host: "attacker.example:8181", st: settings{writeAPI: true}, want: 403, code: "HOST_NOT_ALLOWED"},
		{method: "GET", path: "/health", host: "opa.internal:8181", st: settings{allowedHosts: []string{"opa.internal"}}, want: 200},
		{method: "GET", path: "/health", host: "attacker.example:8181", st: settings{anyHost: true}, want: 200},
		{method: "GET", path: "/health", host: "localhost:8181", want: 200},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path+" "+tt.host, func(t *testing.T) {
			g := &gate{}
			st := tt.st
			g.settings.Store(&st)
			h := g.guardOPA(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
			req := httptest.NewRequest(tt.method, "http://127.0.0.1:8181"+tt.path, strings.NewReader("{}"))
			if tt.host != "" {
				req.Host = tt.host
			}
			req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, net.Addr(local)))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, tt.want, rec.Code, rec.Body.String())
			if tt.code != "" {
				assert.Contains(t, rec.Body.String(), `"code":"`+tt.code+`"`)
			}
		})
	}
}
