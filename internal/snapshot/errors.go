package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Error codes of this package. They are stable: callers switch on them with errors.As.
const (
	// CodeBadRequest: the request is not a JSON object, one of its objects is not an object,
	// or its operation is unknown (docs/contract.md section 11, "Request shape").
	CodeBadRequest = "BAD_REQUEST"
	// CodeBadFacts: a facts document does not have the shape of docs/contract.md section 11, "Facts file".
	CodeBadFacts = "BAD_FACTS"
)

// Error carries a stable code and wraps its cause.
type Error struct {
	Code string
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// IsBadRequest reports whether err is a bad request.
func IsBadRequest(err error) bool { return hasCode(err, CodeBadRequest) }

// IsBadFacts reports whether err is a malformed facts document.
func IsBadFacts(err error) bool { return hasCode(err, CodeBadFacts) }

func hasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// decodeOne decodes exactly one JSON value (numbers kept exact) and refuses trailing data.
func decodeOne(r io.Reader) (any, error) {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty document")
		}
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON value")
	}
	return v, nil
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64:
		return "a number"
	default:
		return fmt.Sprintf("%T", v)
	}
}
