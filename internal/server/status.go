package server

import (
	"net/http"

	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"

	"github.com/authz-dev/authz/internal/policy"
)

// pathStatus is the policy status endpoint.
const pathStatus = "/v1/status"

// PolicyStatus reports the state of the policy (*policy.Source is one).
type PolicyStatus interface {
	Status() policy.Status
}

var _ PolicyStatus = (*policy.Source)(nil)

// handleStatus answers GET /v1/status: the active revision, where it came from, when it was
// activated, and per bundle OPA's bundle status (with the last error).
func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.policyStatus())
}

func (s *Server) policyStatus() policy.Status {
	if s.policy != nil {
		return s.policy.Status()
	}
	// A server made without a policy source serves whatever its decider has loaded.
	return policy.Status{Revision: s.decider.Revision(), Origin: policy.OriginEmbedded, Bundles: map[string]*bundleplugin.Status{}}
}

// policyOrigin is the origin label of authz_policy_revision_info.
func (s *Server) policyOrigin() string {
	if s.policy != nil {
		if o := s.policy.Status().Origin; o != "" {
			return o
		}
	}
	return policy.OriginEmbedded
}
