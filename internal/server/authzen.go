package server

// The AuthZEN face (OpenID AuthZEN Authorization API 1.0): an AuthZEN enforcement point asks
// the same decision as POST /v1/authorize, in the AuthZEN shape. The mapping is fixed
// (docs/contract.md, "AuthZEN"): subject = the lease, resource = the environment, action = the
// operation, context.command = the command. Each evaluation is one decision of the service:
// same admission, bounds, decision log and metrics, and the answer's context carries the
// decision document's code, message, reasons, capabilities, decision_id and revision.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pipeline"
	"github.com/authz-dev/authz/internal/snapshot"
)

const (
	pathAuthZENEvaluation    = "/access/v1/evaluation"
	pathAuthZENEvaluations   = "/access/v1/evaluations"
	pathAuthZENConfiguration = "/.well-known/authzen-configuration"

	// headerRequestID is echoed on AuthZEN answers, as the AuthZEN API asks.
	headerRequestID = "X-Request-ID"

	// maxAuthZENEvaluations bounds the evaluations of one request: each is a decision made
	// under the one admission slot the request holds.
	maxAuthZENEvaluations = 64

	subjectTypeLease        = "lease"
	resourceTypeEnvironment = "environment"
)

// The evaluation semantics of an evaluations request (options.evaluations_semantic).
const (
	semanticExecuteAll          = "execute_all"
	semanticDenyOnFirstDeny     = "deny_on_first_deny"
	semanticPermitOnFirstPermit = "permit_on_first_permit"
)

// authzenEntity is a subject or a resource: a type, an id and properties.
type authzenEntity struct {
	Type       *string        `json:"type"`
	ID         any            `json:"id"`
	Properties map[string]any `json:"properties"`
}

type authzenAction struct {
	Name       *string        `json:"name"`
	Properties map[string]any `json:"properties"`
}

// authzenEvaluation is one evaluation: the body of /access/v1/evaluation, or one element of
// an evaluations request (where a missing member is taken from the request's top level).
type authzenEvaluation struct {
	Subject  *authzenEntity `json:"subject"`
	Resource *authzenEntity `json:"resource"`
	Action   *authzenAction `json:"action"`
	Context  map[string]any `json:"context"`
}

type authzenEvaluations struct {
	authzenEvaluation
	Evaluations []authzenEvaluation `json:"evaluations"`
	Options     struct {
		Semantic string `json:"evaluations_semantic"`
	} `json:"options"`
}

// authzenAnswer is one evaluation's answer.
type authzenAnswer struct {
	Decision bool           `json:"decision"`
	Context  authzenContext `json:"context"`
}

// authzenContext is the decision document without allow (which is the answer's decision),
// and the evaluation failure's code when the decision could not be evaluated.
type authzenContext struct {
	Code         string            `json:"code"`
	Message      string            `json:"message"`
	Reasons      []string          `json:"reasons"`
	Capabilities *api.Capabilities `json:"capabilities,omitempty"`
	DecisionID   string            `json:"decision_id,omitempty"`
	Revision     string            `json:"revision,omitempty"`
	Error        string            `json:"error,omitempty"`
}

func answerOf(doc decision.Document, evalCode string) authzenAnswer {
	caps := doc.Capabilities
	return authzenAnswer{Decision: doc.Allow && evalCode == "", Context: authzenContext{
		Code: doc.Code, Message: doc.Message, Reasons: doc.Reasons, Capabilities: &caps,
		DecisionID: doc.DecisionID, Revision: doc.Revision, Error: evalCode,
	}}
}

// refusedAnswer is the answer of an evaluation of an evaluations request that is not a valid
// request: no decision was made, and it denies.
func refusedAnswer(err error) authzenAnswer {
	return authzenAnswer{Context: authzenContext{Code: string(coded.CodeOf(err)), Message: err.Error(), Reasons: []string{}}}
}

// withDefaults fills the members e lacks from the evaluations request's top level.
func (e authzenEvaluation) withDefaults(top authzenEvaluation) authzenEvaluation {
	if e.Subject == nil {
		e.Subject = top.Subject
	}
	if e.Resource == nil {
		e.Resource = top.Resource
	}
	if e.Action == nil {
		e.Action = top.Action
	}
	if e.Context == nil {
		e.Context = top.Context
	}
	return e
}

// request maps the evaluation onto the service's request (docs/contract.md, "AuthZEN") and
// checks it as /v1/authorize checks its body.
func (e authzenEvaluation) request() (*snapshot.Request, error) {
	bad := func(format string, args ...any) error {
		return coded.Errorf(coded.BadRequest, "AuthZEN "+format, args...)
	}
	switch {
	case e.Subject == nil:
		return nil, bad(`request has no subject: send {"type": "lease", "id": <lease id>, "properties": {…}}`)
	case e.Subject.Type == nil || *e.Subject.Type != subjectTypeLease:
		return nil, bad(`subject.type must be "lease"`)
	case e.Resource == nil:
		return nil, bad(`request has no resource: send {"type": "environment", "id": <environment id>, "properties": {"driver": …, "config": {…}}}`)
	case e.Resource.Type == nil || *e.Resource.Type != resourceTypeEnvironment:
		return nil, bad(`resource.type must be "environment"`)
	case e.Action == nil || e.Action.Name == nil:
		return nil, bad(`request has no action.name: send {"name": "openDuplexChannel"} or {"name": "getRunnerIngressEndpoint"}`)
	}
	lease := entityObject(e.Subject)
	env := entityObject(e.Resource)
	req := map[string]any{"operation": *e.Action.Name, "environment": env, "lease": lease}
	if cmd, ok := e.Context["command"]; ok {
		req["command"] = cmd
	}
	// The mapped request goes through the request checks of /v1/authorize, bounds included,
	// holding the decoded AuthZEN values rather than a second decoding of them.
	r, err := snapshot.RequestFromDocument(req)
	if err != nil {
		return nil, fmt.Errorf("AuthZEN request, mapped onto the service's request: %w", err)
	}
	return r, nil
}

// entityObject is the object a subject or resource stands for: its properties and its id.
func entityObject(e *authzenEntity) map[string]any {
	obj := make(map[string]any, len(e.Properties)+1)
	for k, v := range e.Properties {
		obj[k] = v
	}
	if e.ID != nil {
		obj["id"] = e.ID
	}
	return obj
}

// authzenShape is the members of an AuthZEN object whose names the specification fixes
// (members), or the shape of an array's elements (elem). A nil *authzenShape is a value of
// free form (properties, context).
type authzenShape struct {
	members map[string]*authzenShape
	elem    *authzenShape
}

var (
	authzenEntityShape     = &authzenShape{members: map[string]*authzenShape{"type": nil, "id": nil, "properties": nil}}
	authzenEvaluationShape = &authzenShape{members: map[string]*authzenShape{
		"subject": authzenEntityShape, "resource": authzenEntityShape, "context": nil,
		"action": {members: map[string]*authzenShape{"name": nil, "properties": nil}},
	}}
	authzenEvaluationsShape = &authzenShape{members: map[string]*authzenShape{
		"subject": authzenEntityShape, "resource": authzenEntityShape, "context": nil,
		"action":      authzenEvaluationShape.members["action"],
		"evaluations": {elem: authzenEvaluationShape},
		"options":     {members: map[string]*authzenShape{"evaluations_semantic": nil}},
	}}
)

// checkAuthZENMembers checks that the members the specification names are written exactly as
// it writes them (names are case-sensitive) and each at most once: encoding/json matches a
// struct's names case-insensitively and keeps the last of repeated ones, so `"SUBJECT"` or a
// second `"Type"` would be decided as a request other than the one an intermediary reads.
// Members of free form (properties, context) and other members are left as they are.
func checkAuthZENMembers(raw []byte, shape *authzenShape, path string) error {
	if shape == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil //nolint:nilerr // not JSON: the decoding that follows says so
	}
	name := func(member string) string {
		if path == "" {
			return member
		}
		return path + "." + member
	}
	switch {
	case tok == json.Delim('{') && shape.members != nil:
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil //nolint:nilerr // the decoding that follows says what is wrong
			}
			key, _ := kt.(string)
			if seen[key] {
				return coded.Errorf(coded.BadRequest, "AuthZEN request: member %q is sent more than once: send each member once", name(key))
			}
			seen[key] = true
			child, known := shape.members[key]
			if !known {
				for m := range shape.members {
					if strings.EqualFold(m, key) {
						return coded.Errorf(coded.BadRequest, "AuthZEN request: member %q is not an AuthZEN member: member names are case-sensitive, write it %q",
							name(key), name(m))
					}
				}
			}
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil //nolint:nilerr // the decoding that follows says what is wrong
			}
			if err := checkAuthZENMembers(v, child, name(key)); err != nil {
				return err
			}
		}
	case tok == json.Delim('[') && shape.elem != nil:
		for i := 0; dec.More(); i++ {
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil //nolint:nilerr // the decoding that follows says what is wrong
			}
			if err := checkAuthZENMembers(v, shape.elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// decodeAuthZEN decodes an AuthZEN body strictly: one JSON object of shape, its member names
// exact and not repeated, no trailing data.
func decodeAuthZEN(body []byte, shape *authzenShape, v any) error {
	if err := checkAuthZENMembers(body, shape, ""); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return coded.Errorf(coded.BadRequest, "AuthZEN request is not a JSON object of the AuthZEN shape: %v", err)
	}
	if dec.More() {
		return coded.Errorf(coded.BadRequest, "AuthZEN request: unexpected data after the JSON object")
	}
	return nil
}

// echoRequestID copies X-Request-ID to the answer when it is a printable ASCII string of a
// sensible length.
func echoRequestID(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(headerRequestID)
	if id == "" || len(id) > 256 {
		return
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return
		}
	}
	w.Header().Set(headerRequestID, id)
}

// handleAuthZENEvaluation answers POST /access/v1/evaluation: one decision. A request that
// would be a 4xx on /v1/authorize is the same 4xx here; an evaluation failure is 500 with
// X-Authz-Error and a denying answer, as on /v1/authorize.
func (s *Server) handleAuthZENEvaluation(w http.ResponseWriter, r *http.Request) {
	echoRequestID(w, r)
	parse := func(body []byte) (*snapshot.Request, error) {
		var e authzenEvaluation
		if err := decodeAuthZEN(body, authzenEvaluationShape, &e); err != nil {
			return nil, err
		}
		return e.request()
	}
	s.pipe.Decide(s.caller(w, r, false), pipeline.Face{Path: pathAuthZENEvaluation}, parse, func(res pipeline.Result) {
		s.answerAuthZEN(w, r, res)
	})
}

// answerAuthZEN answers one evaluation as /access/v1/evaluation does.
func (s *Server) answerAuthZEN(w http.ResponseWriter, r *http.Request, res pipeline.Result) {
	doc, status, ok := s.answerResult(w, r, res)
	if !ok {
		return
	}
	writeJSON(w, status, answerOf(doc, string(res.EvalCode)))
}

// handleAuthZENEvaluations answers POST /access/v1/evaluations: the evaluations in order, each
// one decision, with the top-level subject, resource, action and context as defaults. Without
// evaluations it is one evaluation, answered as /access/v1/evaluation answers it.
func (s *Server) handleAuthZENEvaluations(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	echoRequestID(w, r)
	c := s.caller(w, r, false)
	s.pipe.Body(c, func(body []byte) {
		// The decoded batch is held while its evaluations are decided, each mapped in turn
		// from it (sharing its values): the body's bytes of the budget of bytes decoded at
		// once, for the whole batch (its evaluations take deciding places, and nothing more of
		// the budget).
		took, ok := s.admit.acquireDecoding(r.Context(), int64(len(body)))
		if !ok {
			s.answerOverloaded(w, r)
			return
		}
		defer s.admit.releaseDecoding(took)
		var batch authzenEvaluations
		if err := decodeAuthZEN(body, authzenEvaluationsShape, &batch); err != nil {
			writeError(w, err)
			return
		}
		semantic := batch.Options.Semantic
		switch semantic {
		case "":
			semantic = semanticExecuteAll
		case semanticExecuteAll, semanticDenyOnFirstDeny, semanticPermitOnFirstPermit:
		default:
			writeError(w, coded.Errorf(coded.BadRequest, "AuthZEN options.evaluations_semantic %q is not one of %s, %s, %s",
				semantic, semanticExecuteAll, semanticDenyOnFirstDeny, semanticPermitOnFirstPermit))
			return
		}
		if len(batch.Evaluations) > maxAuthZENEvaluations {
			writeError(w, coded.Errorf(coded.BadRequest, "AuthZEN request has %d evaluations; at most %d are decided in one request: split it",
				len(batch.Evaluations), maxAuthZENEvaluations))
			return
		}
		if len(batch.Evaluations) == 0 {
			s.pipe.DecideBody(c, pipeline.Face{Path: pathAuthZENEvaluations}, batch.authzenEvaluation.request, pipeline.Batch{}, func(res pipeline.Result) {
				s.answerAuthZEN(w, r, res)
			})
			return
		}
		s.decideBatch(w, r, c, arrived, batch, semantic)
	}, func(res pipeline.Result) { s.answerResult(w, r, res) })
}

// batchItem is an evaluation of a batch with the batch's defaults applied: key is the same
// for evaluations sent alike, which are decided once.
type batchItem struct {
	eval authzenEvaluation
	key  string
}

// decideBatch decides the evaluations of an evaluations request, bounded by their work, not
// their number: identical evaluations (after the defaults) are decided and logged once; a
// batch whose distinct evaluations cannot be decided within half of http.writeTimeout at the
// observed decision time is refused up front (503, Retry-After), and one that runs late is
// answered 503, never cut by the write time-out without an answer.
func (s *Server) decideBatch(w http.ResponseWriter, r *http.Request, c pipeline.Caller, arrived time.Time, batch authzenEvaluations, semantic string) {
	items := make([]batchItem, len(batch.Evaluations))
	asked := make(map[string]int, len(items))
	for i, e := range batch.Evaluations {
		// The key is the item as sent: every item takes its missing members from the same top
		// level, so two items sent alike are alike after the defaults (the top level is not
		// encoded again for each item, which would cost a large top level 64 times over).
		key := fmt.Sprintf("#%d", i) // not encoded: decided on its own
		if b, err := json.Marshal(e); err == nil {
			key = string(b)
		}
		items[i] = batchItem{eval: e.withDefaults(batch.authzenEvaluation), key: key}
		asked[key]++
	}
	budget := s.cfg.HTTP.WriteTimeout / 2
	each := time.Duration(s.decisionNS.Load())
	if est := time.Duration(len(asked)) * each; time.Since(arrived)+est > budget {
		s.answerBatchTooLong(w, r, fmt.Sprintf("its %d distinct evaluations would take about %v at the observed decision time (%v each)",
			len(asked), est.Round(time.Millisecond), each.Round(time.Microsecond)))
		return
	}
	// The batch's lines share decisionLog.maxLineBytes, each at least the least it may be: a
	// body is not multiplied into the log.
	lineCap := max(s.cfg.DecisionLog.MaxLineBytes/len(asked), minLineBytes)
	type decided struct {
		answer  authzenAnswer
		outcome pipeline.Outcome
		err     error
	}
	done := make(map[string]decided, len(asked))
	answers := make([]authzenAnswer, 0, len(items))
	for _, it := range items {
		d, ok := done[it.key]
		if !ok {
			if late := time.Since(arrived); late+time.Duration(s.decisionNS.Load()) > budget {
				s.answerBatchTooLong(w, r, fmt.Sprintf("it ran late: %d of its %d distinct evaluations decided in %v",
					len(done), len(asked), late.Round(time.Millisecond)))
				return
			}
			s.pipe.DecideBody(c, pipeline.Face{Path: pathAuthZENEvaluations}, it.eval.request,
				pipeline.Batch{Items: asked[it.key], LineCap: lineCap}, func(res pipeline.Result) {
					d.answer, d.outcome, d.err = answerOf(res.Doc, string(res.EvalCode)), res.Outcome, res.Err
				})
			done[it.key] = d
		}
		a := d.answer
		switch d.outcome {
		case pipeline.Overloaded:
			s.answerOverloaded(w, r) // the evaluations decided so far are not answered
			return
		case pipeline.Refused:
			a = refusedAnswer(d.err)
		case pipeline.Unrecorded:
			// The required decision log could not record it: nothing of this request may be
			// used.
			w.Header().Set(headerError, string(coded.DecisionLogUnavailable))
			writeDecisionError(w, coded.Errorf(coded.DecisionLogUnavailable,
				"a decision could not be recorded in the decision log, which this service requires; nothing is granted until the log is writable again"))
			return
		}
		answers = append(answers, a)
		if (semantic == semanticDenyOnFirstDeny && !a.Decision) || (semantic == semanticPermitOnFirstPermit && a.Decision) {
			break
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"evaluations": answers})
}

// answerBatchTooLong answers 503 SERVICE_OVERLOADED with Retry-After to an evaluations request
// that cannot be decided within half of http.writeTimeout, saying why.
func (s *Server) answerBatchTooLong(w http.ResponseWriter, r *http.Request, why string) {
	w.Header().Set("Retry-After", s.admit.retryAfter())
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	w.Header().Set(headerError, string(coded.Overloaded))
	writeDecisionError(w, coded.Errorf(coded.Overloaded,
		"the AuthZEN evaluations request is not decided: %s, more than half of http.writeTimeout (%v); split it into smaller requests or retry after the time in Retry-After",
		why, s.cfg.HTTP.WriteTimeout))
}

// handleAuthZENConfiguration answers GET /.well-known/authzen-configuration: where the
// evaluation endpoints are, as absolute URLs on the address the request came to.
func (s *Server) handleAuthZENConfiguration(w http.ResponseWriter, r *http.Request) {
	echoRequestID(w, r)
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	base := scheme + "://" + r.Host
	writeJSON(w, http.StatusOK, map[string]string{
		"policy_decision_point":       base,
		"access_evaluation_endpoint":  base + pathAuthZENEvaluation,
		"access_evaluations_endpoint": base + pathAuthZENEvaluations,
	})
}
