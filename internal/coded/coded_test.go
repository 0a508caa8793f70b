package coded_test

import (
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
		want string
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
