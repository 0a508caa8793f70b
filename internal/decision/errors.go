package decision

import (
	"errors"
	"fmt"
)

// Codes of evaluation failures. Each failure is answered with FailedDocument; the code tells
// operators (logs, metrics, the X-Authz-Error header) which failure it was.
const (
	CodeNoPolicy        = "EVAL_NO_POLICY"        // no policy has been loaded
	CodeUndefined       = "EVAL_UNDEFINED"        // the entrypoint produced no result
	CodeMultipleResults = "EVAL_MULTIPLE_RESULTS" // the query produced more than one result
	CodeBadResult       = "EVAL_BAD_RESULT"       // the result is not a well-formed decision document
	CodeEvalError       = "EVAL_ERROR"            // OPA returned an error
	CodeCanceled        = "EVAL_CANCELED"         // the caller's context was cancelled
	CodeTimeout         = "EVAL_TIMEOUT"          // the evaluation ran out of time
	CodeBadInput        = "EVAL_BAD_INPUT"        // the input could not be converted for OPA
	CodeCompile         = "POLICY_COMPILE"        // a policy did not compile (load time only)
)

// Error carries a stable code and wraps its cause.
type Error struct {
	Code string
	Err  error
}

func (e *Error) Error() string { return e.Code + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ErrorCode returns the code of err's *Error, or "" when it has none.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func failf(code, format string, args ...any) *Error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}
