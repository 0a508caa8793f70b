package server

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/tracing"
)

// startDecisionSpan opens the span of one decision (tracing.DecisionTracer.StartDecision) and
// returns the context the decision runs in; the span is nil when the decision is not traced.
func (s *Server) startDecisionSpan(r *http.Request, path string, req *snapshot.Request) (context.Context, trace.Span) {
	pluginID, _ := req.Metadata["pluginId"].(string)
	return s.tracer.StartDecision(r, path, req.Operation, pluginID)
}

// endDecisionSpan records what the caller was answered and ends the span: the decision, or,
// when the required decision log could not record it (answered is false), the deny that
// replaced it.
func endDecisionSpan(span trace.Span, doc decision.Document, evalCode coded.Code, answered bool) {
	tracing.EndDecision(span, tracing.Outcome{DecisionID: doc.DecisionID, Allow: doc.Allow, Code: doc.Code,
		Revision: doc.Revision, EvalError: evalCode, LogFailed: !answered})
}
