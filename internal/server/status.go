package server

import (
	"context"
	"net/http"

	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"

	"github.com/authz-dev/authz/internal/policystate"
)

// pathStatus is the policy status endpoint.
const pathStatus = "/v1/status"

// PolicyStatus reports the state of the policy (*policy.Source is one).
type PolicyStatus interface {
	Status() policystate.Status
}

// handleStatus answers GET /v1/status: the active revision, where it came from, when it was
// activated, and per bundle OPA's bundle status (with the last error).
func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.policyStatus())
}

func (s *Server) policyStatus() policystate.Status {
	if s.policy != nil {
		return s.policy.Status()
	}
	// A server made without a policy source serves whatever its decider has loaded.
	return policystate.Status{Revision: s.decider.Revision(), Origin: policystate.OriginEmbedded, Bundles: map[string]*bundleplugin.Status{}}
}

// policyOrigin is the origin label of authz_policy_revision_info.
func (s *Server) policyOrigin() string {
	if s.policy != nil {
		if o := s.policy.Status().Origin; o != "" {
			return o
		}
	}
	return policystate.OriginEmbedded
}

// OPADecisionLogger hands decisions to OPA's decision-log plugin (*policy.Source is one).
type OPADecisionLogger interface {
	DecisionLogs() bool
	LogDecision(ctx context.Context, d policystate.Decision) error
}
