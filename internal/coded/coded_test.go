package coded_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
)

func TestCodeOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want coded.Code
	}{
		{name: "nil", err: nil, want: ""},
		{name: "plain", err: io.EOF, want: ""},
		{name: "coded", err: coded.Errorf(coded.BadFacts, "facts: %w", io.EOF), want: coded.BadFacts},
		{name: "wrapped", err: fmt.Errorf("load: %w", &coded.Error{Code: coded.PinMismatch, Err: io.EOF}), want: coded.PinMismatch},
		{name: "outermost wins", err: &coded.Error{Code: coded.BrokerRefused, Err: &coded.Error{Code: coded.StartTimeout, Err: io.EOF}}, want: coded.BrokerRefused},
		{name: "joined", err: errors.Join(io.EOF, &coded.Error{Code: coded.KeyConflict, Err: io.EOF}), want: coded.KeyConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, coded.CodeOf(tt.err))
		})
	}
}

func TestErrorKeepsMessageAndCause(t *testing.T) {
	err := coded.Errorf(coded.BadRequest, "lease: %w", io.ErrUnexpectedEOF)
	assert.Equal(t, "lease: unexpected EOF", err.Error(), "the message is the cause's, without the code")
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	var ce *coded.Error
	require.ErrorAs(t, fmt.Errorf("parse: %w", err), &ce)
	assert.Equal(t, coded.BadRequest, ce.Code)
}

func TestCodeRoundTrips(t *testing.T) {
	err := fmt.Errorf("decide: %w", coded.Errorf(coded.EvalTimeout, "ran out of time"))
	code := coded.CodeOf(err)
	assert.Equal(t, coded.EvalTimeout, code, "CodeOf returns the Code the error was made with")
	assert.Equal(t, "EVAL_TIMEOUT", code.String())
	assert.Equal(t, "EVAL_TIMEOUT", fmt.Sprint(code))

	// A Code goes out in JSON as the plain string it names, and reads back as the same Code.
	typed, err2 := json.Marshal(struct {
		Code coded.Code `json:"code"`
	}{code})
	require.NoError(t, err2)
	plain, err2 := json.Marshal(struct {
		Code string `json:"code"`
	}{"EVAL_TIMEOUT"})
	require.NoError(t, err2)
	assert.JSONEq(t, string(plain), string(typed))
	assert.Equal(t, `{"code":"EVAL_TIMEOUT"}`, string(typed))
	var back struct {
		Code coded.Code `json:"code"`
	}
	require.NoError(t, json.Unmarshal(plain, &back))
	assert.Equal(t, coded.EvalTimeout, back.Code)

	// Marshalled from an interface value (as loggers and encoders of any do), too.
	asAny, err2 := json.Marshal(map[string]any{"code": code})
	require.NoError(t, err2)
	assert.Equal(t, `{"code":"EVAL_TIMEOUT"}`, string(asAny))
}
