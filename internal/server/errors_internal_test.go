package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/authz-dev/authz/internal/coded"
)

// An error answer takes its status and code from the error's code, however deeply it is
// wrapped; an error without a code is a fault of the service (500 INTERNAL_ERROR), never a 2xx.
func TestErrorAnswers(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		decision   bool
		wantStatus int
		wantBody   string
	}{
		{name: "bad request wrapped", err: fmt.Errorf("input: %w", coded.Errorf(coded.BadRequest, "lease must be an object when present, got null")),
			wantStatus: http.StatusBadRequest, wantBody: `{"code":"BAD_REQUEST","message":"input: lease must be an object when present, got null"}`},
		{name: "too large", err: coded.Errorf(coded.RequestTooLarge, "request body is larger than the limit of %d bytes", 10),
			wantStatus: http.StatusRequestEntityTooLarge, wantBody: `{"code":"REQUEST_TOO_LARGE","message":"request body is larger than the limit of 10 bytes"}`},
		{name: "overloaded on a decision endpoint", err: coded.Errorf(coded.Overloaded, "retry"), decision: true,
			wantStatus: http.StatusServiceUnavailable, wantBody: `{"code":"SERVICE_OVERLOADED","message":"retry","allow":false}`},
		{name: "forbidden host", err: coded.Errorf(coded.HostNotAllowed, "no"),
			wantStatus: http.StatusForbidden, wantBody: `{"code":"HOST_NOT_ALLOWED","message":"no"}`},
		{name: "no code", err: errors.New("boom"),
			wantStatus: http.StatusInternalServerError, wantBody: `{"code":"INTERNAL_ERROR","message":"boom"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			if tt.decision {
				writeDecisionError(rec, tt.err)
			} else {
				writeError(rec, tt.err)
			}
			assert.Equal(t, tt.wantStatus, rec.Code)
			assert.Equal(t, tt.wantBody+"\n", rec.Body.String())
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		})
	}
}
