// Package pipeline is the one path of a decision: every face of the service (POST
// /v1/authorize, /v1/capabilities, the Data API, AuthZEN single and batch, a watch's first
// decision and its re-decisions, and so `authz run`'s gate, which serves the same faces) hands
// its request to a Pipeline, which owns the order of the steps:
//
//  1. admission: a reading place before a byte of the body is read (Caller.AdmitBody);
//  2. the body is read, and a body cut for its caller's share or its slowness decides nothing;
//  3. the access check, once the body is in (Recheck: the one function that checks access
//     again, for a body or a watch that outlives a tokens reload);
//  4. a deciding place (fair between callers), the request decoded in it;
//  5. the wait for a driver's config check, outside the deciding place, then the place again;
//  6. the decision, its fail-closed answer when it could not be evaluated, its id and reasons;
//  7. recording (a required log that fails answers nothing and revokes every watch);
//  8. metrics and the trace span.
//
// A face only translates its protocol to and from the pipeline: it names itself (Face),
// decodes the body (Face.Parse) and answers the Result.
package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
)

// Caller is the sender of one request and its transport, as the pipeline needs them. The HTTP
// face implements it over its request and response.
type Caller interface {
	Context() context.Context
	// ID names the caller for the fair shares of the admission places.
	ID() string
	// AdmitBody takes a reading place for the body, within the admission wait; false when
	// none came in time. Finish gives it back.
	AdmitBody() bool
	// ReadBody reads the body through its reading place.
	ReadBody() ([]byte, error)
	// BodyIn marks the body read: why it was cut before (Cut), 0 when it was not.
	BodyIn() int32
	Finish()
	// CheckAccess is the access check of the caller's credentials as they stand now: nil
	// when it may decide.
	CheckAccess() error
	// RemoteAddr is the address the caller sends from, for the record.
	RemoteAddr() string
}

// Decider makes decisions; *decision.Engine is one.
type Decider interface {
	Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error)
}

// Places are the deciding places, shared fairly between callers.
type Places interface {
	// Acquire takes a deciding place and, for a request decoded in it, decodeBytes of the
	// budget of bytes decoded at once (a decoded request costs many times its body: the
	// bytes bound it where the number of places does not).
	Acquire(ctx context.Context, caller string, decodeBytes int64) bool
	// Release gives back a place and the decodeBytes Acquire took with it.
	Release(caller string, decodeBytes int64)
	// Overloaded is the error of a decision not admitted in time.
	Overloaded() error
}

// Record is one decision as it is recorded.
type Record struct {
	RemoteAddr string
	DecisionID string
	Start      time.Time
	Path       string
	Operation  string
	Input      snapshot.Input
	Result     decision.Document
	Latency    time.Duration
	EvalCode   coded.Code
	WatchID    string
	// Items is how many evaluations of an AuthZEN batch the decision answers; LineCap its
	// line's share of the log's bound (0: the whole of it).
	Items, LineCap int
}

// Recorder records decisions.
type Recorder interface {
	// Record writes rec; an error when it could not be written.
	Record(ctx context.Context, rec Record) error
	// Required reports whether a decision that could not be recorded must not be used.
	Required() bool
	// Unavailable is called when a required record failed: nothing is granted until the log
	// is writable again, watched grants included.
	Unavailable()
}

// Observer is the metrics and trace span of decisions.
type Observer interface {
	// StartSpan opens the span of one decision; nil span when it is not traced.
	StartSpan(c Caller, path string, req *snapshot.Request) (context.Context, trace.Span)
	EndSpan(span trace.Span, doc decision.Document, evalCode coded.Code, answered bool)
	// DecisionTime folds the time one decision took into the observed decision time.
	DecisionTime(d time.Duration)
	Decision(op string, allow bool, code string, evalCode coded.Code, d time.Duration)
	LogFailed()
}

// Pipeline is the one path of a decision.
type Pipeline struct {
	decider  Decider
	facts    snapshot.Facts
	places   Places
	recorder Recorder
	observer Observer
	log      hclog.Logger
	// seen, when set (Observe), is told every call of the pipeline.
	seen func(call string)
}

// Observe has seen told every call of the pipeline ("Decide /v1/authorize", "Body",
// "DecideBody PATH", "Recheck", "Redecide", "Event"), before it runs: a recording double for
// the tests that every face goes through the pipeline. Set it before the pipeline is used.
func (p *Pipeline) Observe(seen func(call string)) { p.seen = seen }

func (p *Pipeline) note(call, path string) {
	if p.seen != nil {
		if path != "" {
			call += " " + path
		}
		p.seen(call)
	}
}

// New is the pipeline of the service.
func New(d Decider, facts snapshot.Facts, places Places, rec Recorder, obs Observer, log hclog.Logger) *Pipeline {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Pipeline{decider: d, facts: facts, places: places, recorder: rec, observer: obs, log: log}
}

// Face is one face of a decision as the pipeline sees it.
type Face struct {
	// Path names the face in the record, the metrics and the span.
	Path string
	// WatchID names the watch whose first decision this is.
	WatchID string
}

// Outcome is what became of a request.
type Outcome int

const (
	// Decided: Doc is the decision (EvalCode set when it could not be evaluated: it denies).
	Decided Outcome = iota
	// Overloaded: no place came in time.
	Overloaded
	// CutShort: the body was cut (Cut says why).
	CutShort
	// Refused: the body could not be read or decoded (Err).
	Refused
	// Denied: the access check refused the caller (Err).
	Denied
	// Unrecorded: the required decision log could not record the decision; it is not used.
	Unrecorded
)

// The reasons a body was cut (Caller.BodyIn).
const (
	CutShare int32 = 2 // its caller held more than its share while another caller waited
	CutSlow  int32 = 3 // it came slower than the minimum rate after the grace
)

// Result is the pipeline's answer to a face.
type Result struct {
	Outcome  Outcome
	Req      *snapshot.Request
	Doc      decision.Document
	EvalCode coded.Code
	Err      error
	Cut      int32
}

// Batch is how a decision of an AuthZEN batch is recorded: the number of the batch's
// evaluations it answers, and the cap of its line.
type Batch struct{ Items, LineCap int }

// Decide is the whole path of one request: its body read under admission, access checked,
// decoded with parse (which may be called twice: the decoded request is given up while a
// config check is waited for), decided and recorded. answer is called once with the result,
// within the deciding place when the request was decided.
func (p *Pipeline) Decide(c Caller, face Face, parse func(body []byte) (*snapshot.Request, error), answer func(Result)) {
	p.note("Decide", face.Path)
	p.withBody(c, func(body []byte) {
		p.decideIn(c, face.Path, face.WatchID, parse, body, int64(len(body)), nil, Batch{}, answer)
	}, answer)
}

// Body reads c's body holding a reading place from before its first byte until serve returns,
// and checks access again once it is in: a token revoked while the body was being sent decides
// nothing. serve gets the body; answer gets why there is none.
func (p *Pipeline) Body(c Caller, serve func(body []byte), answer func(Result)) {
	p.note("Body", "")
	p.withBody(c, serve, answer)
}

// withBody is Decide's and Body's first steps: a reading place, the body, access again.
func (p *Pipeline) withBody(c Caller, serve func(body []byte), answer func(Result)) {
	if !c.AdmitBody() {
		answer(Result{Outcome: Overloaded})
		return
	}
	defer c.Finish()
	body, refused, ok := p.readBody(c)
	if !ok {
		answer(refused)
		return
	}
	serve(body)
}

// readBody reads c's body in its reading place, then checks access again (Recheck); ok is
// false, with the refusal, when the body was cut, could not be read or access is refused.
func (p *Pipeline) readBody(c Caller) (body []byte, refused Result, ok bool) {
	body, err := c.ReadBody()
	if why := c.BodyIn(); why != 0 {
		return nil, Result{Outcome: CutShort, Cut: why}, false
	}
	if err != nil {
		return nil, Result{Outcome: Refused, Err: err}, false
	}
	if err := p.Recheck(c); err != nil {
		return nil, Result{Outcome: Denied, Err: err}, false
	}
	return body, Result{}, true
}

// Recheck is the one access check after the middleware's: for a body read in full, or a
// watch registered, after a tokens reload may have run.
func (p *Pipeline) Recheck(c Caller) error {
	p.note("Recheck", "")
	return c.CheckAccess()
}

// DecideBody decodes a request with parse and decides it (an AuthZEN batch's evaluations, from
// a body Body read), in a deciding place. It takes nothing of the budget of bytes decoded at
// once: the caller holds what parse decodes (Places.Acquire's decodeBytes).
func (p *Pipeline) DecideBody(c Caller, face Face, parse func() (*snapshot.Request, error), batch Batch, answer func(Result)) {
	p.note("DecideBody", face.Path)
	p.decideIn(c, face.Path, face.WatchID, nil, nil, 0, parse, batch, answer)
}

// decideIn decodes a request (parse, or parseBody of body when parse is nil) and decides it in
// a deciding place; answer gets the result within the place.
func (p *Pipeline) decideIn(c Caller, path, watchID string, parseBody func([]byte) (*snapshot.Request, error), body []byte,
	decodeBytes int64, parse func() (*snapshot.Request, error), batch Batch, answer func(Result)) {
	ctx, caller := c.Context(), c.ID()
	req, facts, err := p.admit(ctx, caller, parseBody, body, decodeBytes, parse, p.facts)
	switch {
	case errors.Is(err, errNotAdmitted):
		answer(Result{Outcome: Overloaded})
		return
	case err != nil:
		answer(Result{Outcome: Refused, Err: err})
		return
	}
	defer p.places.Release(caller, decodeBytes)
	answer(p.decide(c, path, watchID, req, facts, batch))
}

// Redecide decides a watch's request again, as a request of the API is decided: in a deciding
// place (the service's own caller, ""), waiting for a driver's config check outside it. One not
// admitted in time fails (a service too busy to decide again cannot vouch for a grant). It is
// recorded when its event is sent (Event).
func (p *Pipeline) Redecide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	p.note("Redecide", "")
	parse := func() (*snapshot.Request, error) { return req, nil }
	admitted, facts, err := p.admit(ctx, "", nil, nil, 0, parse, facts)
	if err != nil {
		return decision.FailedDocument(req.Operation), nil, p.places.Overloaded()
	}
	defer p.places.Release("", 0)
	return p.decider.Decide(ctx, admitted, facts)
}

// RedecideBody is Redecide of the request body holds (decoded with snapshot.ParseRequestBytes),
// decoded only once a deciding place is held: the decoded request, which costs many times the
// body, is within the bound of the deciding places like every other (a watch's re-decisions
// run on several workers at once). operation is the request's, for the fail-closed deny of one
// not admitted in time.
func (p *Pipeline) RedecideBody(ctx context.Context, operation string, body []byte, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	p.note("Redecide", "")
	admitted, facts, err := p.admit(ctx, "", snapshot.ParseRequestBytes, body, int64(len(body)), nil, facts)
	switch {
	case errors.Is(err, errNotAdmitted):
		return decision.FailedDocument(operation), nil, p.places.Overloaded()
	case err != nil:
		return decision.FailedDocument(operation), nil, err
	}
	defer p.places.Release("", int64(len(body)))
	return p.decider.Decide(ctx, admitted, facts)
}

// errNotAdmitted: no deciding place came in time.
var errNotAdmitted = errors.New("not admitted")

// admit takes a deciding place, with decodeBytes of the budget of bytes decoded at once, and
// decodes the request in it (parse, or parseBody of body); on success both are held, for the
// caller to release. A driver's config check that must
// be asked is not waited for in the place: the request gives its place and its decoded form
// up, waits (the answer then at hand in the facts returned), and is admitted and decoded again.
// So a plugin whose checks are slow holds up its own callers only.
func (p *Pipeline) admit(ctx context.Context, caller string, parseBody func([]byte) (*snapshot.Request, error), body []byte,
	decodeBytes int64, parse func() (*snapshot.Request, error), facts snapshot.Facts) (*snapshot.Request, snapshot.Facts, error) {
	decode := func() (*snapshot.Request, error) {
		if parse != nil {
			return parse()
		}
		return parseBody(body)
	}
	if !p.places.Acquire(ctx, caller, decodeBytes) {
		return nil, facts, errNotAdmitted
	}
	req, err := decode()
	if err != nil {
		p.places.Release(caller, decodeBytes)
		return nil, facts, err
	}
	wait, facts := snapshot.ConfigCheckAhead(req, facts) // an answer at hand is carried in facts: asked once
	if wait != nil {
		p.places.Release(caller, decodeBytes) // the decoded request is not used again: decoded again below
		facts = wait(ctx)
		if !p.places.Acquire(ctx, caller, decodeBytes) {
			return nil, facts, errNotAdmitted
		}
		if req, err = decode(); err != nil {
			p.places.Release(caller, decodeBytes)
			return nil, facts, err
		}
	}
	return req, facts, nil
}

// decide makes, answers fail-closed, records and observes one decision.
func (p *Pipeline) decide(c Caller, path, watchID string, req *snapshot.Request, facts snapshot.Facts, batch Batch) Result {
	start := time.Now()
	ctx, span := p.observer.StartSpan(c, path, req)
	doc, in, err := p.decider.Decide(ctx, req, facts)
	latency := time.Since(start)
	p.observer.DecisionTime(latency)
	var evalCode coded.Code
	if err != nil {
		// Whatever the decider returned alongside its error, the answer is the
		// docs/contract.md, "Precise rules" "Failures" document: it never grants.
		doc, evalCode = decision.FailClosed(req.Operation, doc, err)
		p.log.Warn("decision could not be evaluated; answered with a deny",
			"decision_id", doc.DecisionID, "operation", req.Operation, "code", string(evalCode), "error", err)
	}
	if doc.DecisionID == "" {
		doc.DecisionID = decision.NewDecisionID()
	}
	if doc.Reasons == nil {
		doc.Reasons = []string{}
	}
	p.log.Debug("decision", "decision_id", doc.DecisionID, "path", path, "operation", req.Operation,
		"allow", doc.Allow, "code", doc.Code, "reasons", doc.Reasons, "latency", latency)
	rec := Record{RemoteAddr: c.RemoteAddr(), DecisionID: doc.DecisionID, Start: start, Path: path, Operation: req.Operation,
		Input: in, Result: doc, Latency: latency, EvalCode: evalCode, WatchID: watchID, LineCap: batch.LineCap}
	if batch.Items > 1 {
		rec.Items = batch.Items
	}
	res := Result{Outcome: Decided, Req: req, Doc: doc, EvalCode: evalCode}
	if !p.record(ctx, rec, true) {
		// Counted as what the client was answered: a deny, never the decision it replaced.
		p.observer.Decision(req.Operation, false, string(coded.DecisionLogUnavailable), evalCode, latency)
		p.observer.EndSpan(span, doc, evalCode, false)
		res.Outcome = Unrecorded
		return res
	}
	p.observer.Decision(req.Operation, doc.Allow, doc.Code, evalCode, latency)
	p.observer.EndSpan(span, doc, evalCode, true)
	return res
}

// record records rec; it reports false when the log is required and rec could not be written
// (the decision must not be used). grants: rec may grant, so a required log that fails
// revokes every watch.
func (p *Pipeline) record(ctx context.Context, rec Record, grants bool) bool {
	err := p.recorder.Record(ctx, rec)
	if err == nil {
		return true
	}
	p.observer.LogFailed()
	if p.recorder.Required() {
		p.log.Error("decision log unavailable; the decision is not used", "decision_id", rec.DecisionID, "watch_id", rec.WatchID, "error", err)
		if grants {
			p.recorder.Unavailable()
		}
		return false
	}
	p.log.Error("decision log line lost", "decision_id", rec.DecisionID, "watch_id", rec.WatchID, "error", err)
	return true
}

// Event records an event of a watch that is not its first decision (an update or revoke,
// decided by Redecide): rec is named (its own decision id) and recorded with the watch's id. It
// reports false when a required log could not record it; a failed record of an event that may
// grant (not a revoke) revokes every watch.
func (p *Pipeline) Event(ctx context.Context, rec Record, revoke bool) bool {
	p.note("Event", "")
	return p.record(ctx, rec, !revoke)
}
