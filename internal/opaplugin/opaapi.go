package opaplugin

import (
	"encoding/json"
	"net/http"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/server"
)

// guardOPA wraps every handler of OPA's own server (OPA's plugin manager puts it around each
// route): the gate's Host check against DNS rebinding, and, unless plugins.authz.opaWriteAPI
// is true, a refusal of OPA's write APIs (PUT, PATCH and DELETE, on any path).
// The gate never decides with what these APIs write; OPA's own queries would.
func (g *gate) guardOPA(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := g.settings.Load()
		if err := server.CheckLoopbackHost(r, st.allowedHosts); err != nil && !st.anyHost {
			writeOPAError(w, http.StatusForbidden, coded.HostNotAllowed, err.Error())
			return
		}
		if !st.writeAPI && isOPAWrite(r) {
			writeOPAError(w, http.StatusForbidden, coded.OPAWriteAPIOff,
				"OPA's policy and data write APIs are off under authz run: the policy comes from the configured bundles; set plugins.authz.opaWriteAPI: true to open them for OPA's own queries")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// isOPAWrite reports whether r may write OPA's policies or data: any method but GET, HEAD and
// POST (a query), whatever the path. OPA's API writes only with PUT, PATCH and DELETE; judging by
// method alone leaves no spelling of a path (doubled slashes, dot segments, escapes) that a
// router might clean into /v1/policies or /v1/data unchecked.
func isOPAWrite(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
		return false
	}
	return true
}

// writeOPAError answers as OPA's server answers an error: {"code": ..., "message": ...}.
func writeOPAError(w http.ResponseWriter, status int, code coded.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": string(code), "message": msg})
}
