package audit

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/decision"
)

// ctxRecorder is an OPADecisionLogger that keeps the context and decision it was handed.
type ctxRecorder struct {
	ctxErr error
	got    *api.Decision
}

func (r *ctxRecorder) DecisionLogs() bool { return true }

func (r *ctxRecorder) LogDecision(ctx context.Context, d api.Decision) error {
	r.ctxErr, r.got = ctx.Err(), &d
	return nil
}

// TestLogToOPAOutlivesTheRequest: a caller that hung up (its request context cancelled) does
// not cancel the decision's entry in OPA's decision log.
func TestLogToOPAOutlivesTheRequest(t *testing.T) {
	rec := &ctxRecorder{}
	s := &Recorder{opa: rec, log: hclog.NewNullLogger()}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s.logToOPA(ctx, httptest.NewRequest("POST", "/v1/authorize", nil).RemoteAddr, time.Now(),
		logEntry{DecisionID: "d-1", Result: decision.Document{DecisionID: "d-1"}, Revision: "r"})
	require.NotNil(t, rec.got, "the decision was handed over")
	assert.NoError(t, rec.ctxErr)
	assert.Equal(t, "d-1", rec.got.ID)
	assert.Equal(t, "r", rec.got.Revision)
}
