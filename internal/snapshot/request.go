package snapshot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/authz-dev/authz/internal/coded"
)

// Bounds of a request, so that its decision log line (which carries the request) stays readable
// by ordinary JSON tools and cheap to write. A request over either is a bad request.
const (
	// MaxRequestDepth is the deepest nesting of objects and arrays in a request; the request
	// object itself is level 1.
	MaxRequestDepth = 64
	// MaxRequestStringBytes is the longest string (value or object key) in a request, in bytes.
	MaxRequestStringBytes = 64 << 10
	// DecodedBytesPerBodyByte bounds the bytes a request's decoding allocates per byte of its
	// body, whatever its shape and face: what the service's memory bound counts for a body
	// being decoded. The costliest shape measured is an array of one-member objects such as
	// {"":0}: 56.1 bytes per byte by ParseRequestBytes (TestDecodeCostWithinTheMemoryBudget),
	// 80.2 by the AuthZEN face, which checks and decodes its shape with encoding/json
	// (internal/server TestAuthZENDecodeCostWithinTheMemoryBudget).
	DecodedBytesPerBodyByte = 82
)

// The two operations of docs/contract.md, "The decision, in order".
const (
	OpOpenDuplexChannel        = "openDuplexChannel"
	OpGetRunnerIngressEndpoint = "getRunnerIngressEndpoint"
)

// Request is a checked request of docs/contract.md, "The request". Environment, Lease and Metadata are never nil.
type Request struct {
	Operation   string
	Environment map[string]any
	Lease       map[string]any
	Metadata    map[string]any // Lease["metadata"]
	Command     any
	HasCommand  bool
}

// ParseRequest reads one JSON request and checks its shape, as ParseRequestBytes does.
func ParseRequest(r io.Reader) (*Request, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, badRequest("request is not valid JSON: %v", err)
	}
	return ParseRequestBytes(body)
}

// ParseRequestBytes checks one JSON request held in body and returns it. A request of plain
// ASCII strings (the usual case) is decoded in one pass by decodeFast; any other is decoded by
// encoding/json, which also words every error. The request never shares memory with body: the
// caller may reuse body at once.
func ParseRequestBytes(body []byte) (*Request, error) {
	doc, members, direct, ok := decodeRequestFast(body, withinRequestBounds)
	switch {
	case !ok:
		var err error
		if doc, err = decodeOne(bytes.NewReader(body)); err != nil {
			return nil, badRequest("request is not valid JSON: %v", err)
		}
	case direct:
		// The fast decoder measured the document on its way: within the bounds and without
		// a number with an exponent (the only values boundValue may rewrite), it needs no
		// second walk, and the request is made from the top-level members without a map of
		// them.
		return requestFromMembers(members)
	}
	return requestFromValue(doc)
}

// withinRequestBounds reports whether a document of these measurements is within the request
// bounds and holds no number with an exponent, so that boundValue would find nothing to refuse
// or rewrite: only a number with an exponent can be beyond what the policy engine represents
// (ast.NumberChecked; TestOnlyExponentsAreRewritten holds it to that).
func withinRequestBounds(st fastStats) bool {
	return st.maxDepth <= MaxRequestDepth && st.maxString <= MaxRequestStringBytes && !st.exponents
}

// requestFromValue checks a decoded JSON value (as encoding/json decodes into any, numbers as
// json.Number or float64) and returns the request. The value's maps are used, not copied.
//
// The request is bounded (MaxRequestDepth, MaxRequestStringBytes). A number the policy engine
// cannot represent (a binary exponent beyond what OPA accepts, such as 1e40000) is replaced, in
// place, by the string of its literal: the policy reads no number of the request, so the
// request is still decided, and the input document (and its log line) stays evaluable.
func requestFromValue(doc any) (*Request, error) {
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, badRequest("request must be a JSON object, got %s", typeName(doc))
	}
	if err := boundValue(top, 1); err != nil {
		return nil, badRequest("request %v", err)
	}
	var m requestMembers
	m.operation, m.hasOperation = top["operation"]
	m.environment, m.hasEnvironment = top["environment"]
	m.lease, m.hasLease = top["lease"]
	m.command, m.hasCommand = top["command"]
	return requestFromMembers(m)
}

// RequestFromDocument checks a request already decoded as encoding/json decodes JSON into an
// any with UseNumber (maps, slices, strings, json.Number, booleans, nil) and returns it, as
// ParseRequestBytes of its encoding would: the same bounds, rewrites and errors. The request
// holds doc's maps, not copies: a face that decodes its own shape (AuthZEN) makes the request
// without encoding and decoding it a second time. A number is rewritten in doc at most once,
// so maps shared between the requests of one body are written only by the first.
func RequestFromDocument(doc map[string]any) (*Request, error) {
	return requestFromValue(doc)
}

// requestFromMembers checks the members of a request object that is within the bounds and
// returns the request.
func requestFromMembers(m requestMembers) (*Request, error) {
	req := &Request{Operation: OpOpenDuplexChannel}
	var err error
	if m.hasOperation {
		s, _ := m.operation.(string)
		if s != OpOpenDuplexChannel && s != OpGetRunnerIngressEndpoint {
			return nil, badRequest("operation must be %q or %q, got %s", OpOpenDuplexChannel, OpGetRunnerIngressEndpoint, describe(m.operation))
		}
		req.Operation = s
	}
	if req.Environment, err = optionalObject(m.environment, m.hasEnvironment, "environment"); err != nil {
		return nil, err
	}
	if req.Lease, err = optionalObject(m.lease, m.hasLease, "lease"); err != nil {
		return nil, err
	}
	md, hasMD := req.Lease["metadata"]
	if req.Metadata, err = optionalObject(md, hasMD, "lease.metadata"); err != nil {
		return nil, err
	}
	req.Command, req.HasCommand = m.command, m.hasCommand
	return req, nil
}

// optionalObject is the object raw of a member named name, or an empty one when the member is
// not present.
func optionalObject(raw any, present bool, name string) (map[string]any, error) {
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
	return coded.Errorf(coded.BadRequest, format, args...)
}

func describe(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return typeName(v)
}

// boundError says where a request exceeds a bound; path is built on the way out.
type boundError struct {
	path string
	msg  string
}

func (e *boundError) Error() string {
	if e.path == "" {
		return e.msg
	}
	return "field " + e.path + " " + e.msg
}

func (e *boundError) under(seg string) *boundError {
	if e.path == "" || e.path[0] == '[' {
		e.path = seg + e.path
	} else {
		e.path = seg + "." + e.path
	}
	return e
}

// boundValue checks the depth and string lengths of v, which is at nesting level depth when it
// is an object or array, and replaces out-of-range numbers by their literal strings.
func boundValue(v any, depth int) error {
	switch t := v.(type) {
	case map[string]any:
		if depth > MaxRequestDepth {
			return &boundError{msg: fmt.Sprintf("is nested deeper than the limit of %d levels of objects and arrays", MaxRequestDepth)}
		}
		for k, e := range t {
			if len(k) > MaxRequestStringBytes {
				return &boundError{msg: fmt.Sprintf("has a key of %d bytes, over the limit of %d bytes for a string", len(k), MaxRequestStringBytes)}
			}
			if n, ok := e.(json.Number); ok {
				if s, rewritten := boundNumber(n).(string); rewritten {
					t[k] = s // written only when rewritten: a request's maps may be shared (RequestFromDocument)
				}
				continue
			}
			if err := boundValue(e, depth+1); err != nil {
				return err.(*boundError).under(k) //nolint:errorlint // boundValue returns only an unwrapped *boundError
			}
		}
	case []any:
		if depth > MaxRequestDepth {
			return &boundError{msg: fmt.Sprintf("is nested deeper than the limit of %d levels of objects and arrays", MaxRequestDepth)}
		}
		for i, e := range t {
			if n, ok := e.(json.Number); ok {
				if s, rewritten := boundNumber(n).(string); rewritten {
					t[i] = s
				}
				continue
			}
			if err := boundValue(e, depth+1); err != nil {
				return err.(*boundError).under("[" + strconv.Itoa(i) + "]") //nolint:errorlint // as above
			}
		}
	case string:
		if len(t) > MaxRequestStringBytes {
			return &boundError{msg: fmt.Sprintf("is a string of %d bytes, over the limit of %d bytes", len(t), MaxRequestStringBytes)}
		}
	}
	return nil
}

// boundNumber keeps n when the policy engine can represent it, else gives its literal text.
func boundNumber(n json.Number) any {
	if _, err := ast.NumberChecked(string(n)); err != nil {
		return string(n)
	}
	return n
}

// Document is the request as the JSON document a client sends: ParseRequestBytes of its
// encoding gives back the same request.
func (r *Request) Document() map[string]any {
	d := map[string]any{"operation": r.Operation, "environment": r.Environment, "lease": r.Lease}
	if r.HasCommand {
		d["command"] = r.Command
	}
	return d
}
