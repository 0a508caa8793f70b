package snapshot

import (
	"fmt"
	"io"
)

// The two operations of SPEC section 5.
const (
	OpOpenDuplexChannel        = "openDuplexChannel"
	OpGetRunnerIngressEndpoint = "getRunnerIngressEndpoint"
)

// Request is a checked request of SPEC section 3. Environment, Lease and Metadata are never nil.
type Request struct {
	Operation   string
	Environment map[string]any
	Lease       map[string]any
	Metadata    map[string]any // Lease["metadata"]
	Command     any
	HasCommand  bool
}

// ParseRequest reads one JSON request and checks its shape.
func ParseRequest(r io.Reader) (*Request, error) {
	doc, err := decodeOne(r)
	if err != nil {
		return nil, badRequest("request is not valid JSON: %v", err)
	}
	return RequestFromValue(doc)
}

// RequestFromValue checks a decoded JSON value (as encoding/json decodes into any, numbers as
// json.Number or float64) and returns the request. The value's maps are used, not copied.
func RequestFromValue(doc any) (*Request, error) {
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, badRequest("request must be a JSON object, got %s", typeName(doc))
	}
	req := &Request{Operation: OpOpenDuplexChannel}
	var err error
	if op, present := top["operation"]; present {
		s, _ := op.(string)
		if s != OpOpenDuplexChannel && s != OpGetRunnerIngressEndpoint {
			return nil, badRequest("operation must be %q or %q, got %s", OpOpenDuplexChannel, OpGetRunnerIngressEndpoint, describe(op))
		}
		req.Operation = s
	}
	if req.Environment, err = optionalObject(top, "environment", "environment"); err != nil {
		return nil, err
	}
	if req.Lease, err = optionalObject(top, "lease", "lease"); err != nil {
		return nil, err
	}
	if req.Metadata, err = optionalObject(req.Lease, "metadata", "lease.metadata"); err != nil {
		return nil, err
	}
	req.Command, req.HasCommand = top["command"]
	return req, nil
}

func optionalObject(parent map[string]any, field, name string) (map[string]any, error) {
	raw, present := parent[field]
	if !present {
		return map[string]any{}, nil
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return nil, badRequest("%s must be an object when present, got %s", name, typeName(raw))
	}
	return obj, nil
}

func badRequest(format string, args ...any) error {
	return &Error{Code: CodeBadRequest, Err: fmt.Errorf(format, args...)}
}

func describe(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return typeName(v)
}
