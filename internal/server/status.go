package server

import (
	"context"
	"net/http"

	"github.com/authz-dev/authz/internal/api"
)

// pathStatus is the policy status endpoint.
const pathStatus = "/v1/status"

// PolicyStatus reports the state of the policy (*policy.Source is one).
type PolicyStatus interface {
	Status() api.Status
}

// statusDocument is the answer of GET /v1/status: the policy's status and, under "build",
// what the binary was built from.
type statusDocument struct {
	api.Status
	Build BuildInfo `json:"build"`
}

// handleStatus answers GET /v1/status: the active revision, where it came from, when it was
// activated, per bundle OPA's bundle status (with the last error), and the build (version,
// VCS revision, Go and OPA versions).
func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, statusDocument{Status: s.policyStatus(), Build: Build()})
}

func (s *Server) policyStatus() api.Status {
	if s.policy != nil {
		return s.policy.Status()
	}
	// A server made without a policy source serves whatever its decider has loaded.
	return api.Status{Revision: s.decider.Revision(), Origin: api.OriginEmbedded, Bundles: map[string]*api.BundleStatus{}}
}

// policyOrigin is the origin label of authz_policy_revision_info.
func (s *Server) policyOrigin() string {
	if s.policy != nil {
		if o := s.policy.Status().Origin; o != "" {
			return o
		}
	}
	return api.OriginEmbedded
}

// OPADecisionLogger hands decisions to OPA's decision-log plugin (*policy.Source is one).
type OPADecisionLogger interface {
	DecisionLogs() bool
	LogDecision(ctx context.Context, d api.Decision) error
}
