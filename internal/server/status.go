package server

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"

	"github.com/authz-dev/authz/internal/policystate"
)

// decisionPath is the path of every decision below data, whatever endpoint asked for it.
const decisionPath = "authz/decision"

// pathStatus is the policy status endpoint.
const pathStatus = "/v1/status"

// PolicyStatus reports the state of the policy (*policy.Source is one).
type PolicyStatus interface {
	Status() policystate.Status
}

// statusDocument is the answer of GET /v1/status: the policy's status and, under "build",
// what the binary was built from.
type statusDocument struct {
	policystate.Status
	Build BuildInfo `json:"build"`
}

// handleStatus answers GET /v1/status: the active revision, where it came from, when it was
// activated, per bundle OPA's bundle status (with the last error), and the build (version,
// VCS revision, Go and OPA versions).
func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, statusDocument{Status: s.policyStatus(), Build: Build()})
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

// opaLogMasks parses the decision log's masks for the OPA decision log, when l logs decisions
// through OPA: the masks of the local log apply there too, before OPA's system.log.mask.
func opaLogMasks(cfg Config, l OPADecisionLogger) ([][]string, error) {
	if l == nil {
		return nil, nil
	}
	var out [][]string
	for _, m := range cfg.DecisionLog.Mask {
		segs, err := parseMask(m)
		if err != nil {
			return nil, err
		}
		out = append(out, segs)
	}
	return out, nil
}

// logToOPA hands a decision, masked like the local log, to OPA's decision-log plugin when the
// opa section configures decision_logs. OPA buffers and uploads it in the background; a failure
// is logged and never changes the answer (the local log is the one a decision can require).
func (s *Server) logToOPA(ctx context.Context, r *http.Request, start time.Time, e logEntry) {
	l := s.opaLog
	if l == nil || !l.DecisionLogs() {
		return
	}
	if len(s.opaMasks) > 0 {
		e = maskEntry(e, s.opaMasks)
	}
	result, err := toJSONValue(e.Result)
	if err == nil {
		// Not cancelled with the request: a caller that hangs up after its answer does not take
		// the decision's log entry (and OPA's masking of it) with it.
		err = l.LogDecision(context.WithoutCancel(ctx), policystate.Decision{ID: e.DecisionID, Path: decisionPath,
			Timestamp: start.UTC(), Input: e.Input, Result: result, Revision: e.Revision, RemoteAddr: r.RemoteAddr, Error: string(e.Error)})
	}
	if err != nil {
		s.log.Error("OPA decision log: the decision could not be handed over", "decision_id", e.DecisionID, "error", err)
	}
}

// toJSONValue is v as JSON-shaped Go values (maps, slices, strings, numbers, booleans).
func toJSONValue(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}
