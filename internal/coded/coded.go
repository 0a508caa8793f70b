// Package coded is the one error type of authz: an error that carries a stable code and wraps
// its cause. Every layer reports its failures as a *coded.Error, or wraps one, so that a caller
// reads the code with CodeOf (or errors.As) however deeply the error was wrapped, and the code
// reaches logs, metrics, HTTP answers and a plugin's lastError without anyone parsing a message.
//
// Every code is defined once, in codes.go. The codes of the decision contract's deny documents
// (DUPLEX_CHANNEL_CAPABILITY_DENIED, …) are not errors: they are policy data, decided in Rego.
package coded

import (
	"errors"
	"fmt"
)

// Code is a stable error code, defined once in codes.go. It goes out as its string: in JSON,
// metric labels, log fields and a plugin's lastError.
type Code string

// String returns the code as it goes out.
func (c Code) String() string { return string(c) }

// Error is a failure with a stable code. Its message is the cause's: the code is for
// programs, the message for people (and says what to do next).
type Error struct {
	Code Code
	Err  error
}

// Error returns the cause's message, without the code.
func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an error with code whose cause is fmt.Errorf(format, args...), so %w wraps.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// CodeOf returns the code of the outermost *Error in err's chain, or "" when there is none.
func CodeOf(err error) Code {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	return ""
}
