package server

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pipeline"
	"github.com/authz-dev/authz/internal/snapshot"
)

// The steps of the decision pipeline (internal/pipeline) as HTTP implements them: the caller of
// a request (its reading place, body and access), the deciding places, the recorder and the
// observer (the recorder is internal/audit's). The pipeline calls them in its one order; a handler never calls them itself
// (TestHandlersDecideOnlyThroughThePipeline).

// decisionPipeline is what the faces use of the pipeline (*pipeline.Pipeline; a test puts a
// recording double in its place).
type decisionPipeline interface {
	Decide(c pipeline.Caller, face pipeline.Face, answer func(pipeline.Result))
	Body(c pipeline.Caller, serve func(body []byte), answer func(pipeline.Result))
	DecideBody(c pipeline.Caller, face pipeline.Face, parse func() (*snapshot.Request, error), batch pipeline.Batch, answer func(pipeline.Result))
	Recheck(c pipeline.Caller) error
	Redecide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error)
	Event(ctx context.Context, rec pipeline.Record, revoke bool) bool
}

var _ decisionPipeline = (*pipeline.Pipeline)(nil)

// newPipeline is the server's pipeline over its steps.
func (s *Server) newPipeline() *pipeline.Pipeline {
	return pipeline.New(s.decider, s.facts, decidingPlaces{s.admit}, s.rec, observer{s}, s.log)
}

// httpCaller is one HTTP request as the pipeline's caller.
type httpCaller struct {
	s    *Server
	w    http.ResponseWriter
	r    *http.Request
	read func(http.ResponseWriter, *http.Request) ([]byte, error)
	id   string
	hold *bodyHold
}

// caller is r's caller, its body read with read.
func (s *Server) caller(w http.ResponseWriter, r *http.Request, read func(http.ResponseWriter, *http.Request) ([]byte, error)) *httpCaller {
	return &httpCaller{s: s, w: w, r: r, read: read, id: s.callerOf(r)}
}

func (c *httpCaller) Context() context.Context  { return c.r.Context() }
func (c *httpCaller) ID() string                { return c.id }
func (c *httpCaller) ReadBody() ([]byte, error) { return c.read(c.w, c.r) }
func (c *httpCaller) BodyIn() int32             { return c.s.admit.bodyIn(c.hold) }
func (c *httpCaller) Finish()                   { c.s.admit.finish(c.r, c.hold) }
func (c *httpCaller) CheckAccess() error        { return c.s.access.check(c.r, ScopeDecide) }
func (c *httpCaller) RemoteAddr() string        { return c.r.RemoteAddr }

func (c *httpCaller) AdmitBody() bool {
	c.hold = c.s.admit.admitBody(c.w, c.r, c.id)
	return c.hold != nil
}

// decidingPlaces are the admission's deciding places (limits.maxDeciding).
type decidingPlaces struct{ a *admission }

func (p decidingPlaces) Acquire(ctx context.Context, caller string) bool {
	return p.a.acquire(ctx, p.a.deciding, caller, nil)
}
func (p decidingPlaces) Release(caller string) { p.a.deciding.release(caller) }
func (p decidingPlaces) Overloaded() error     { return p.a.overloaded() }

// logUnavailable is the recorder's answer to a required log that failed: nothing is granted
// until the log is writable again, watched grants included.
func (s *Server) logUnavailable() {
	s.watches.RevokeAll(decision.ReasonLogUnavailable, coded.DecisionLogUnavailable)
}

// requestOf is the HTTP request of a caller, nil when it has none.
func requestOf(c pipeline.Caller) *http.Request {
	if hc, ok := c.(*httpCaller); ok {
		return hc.r
	}
	return nil
}

// observer is the decisions' metrics and trace spans.
type observer struct{ s *Server }

// StartSpan opens the span of one decision (tracing.DecisionTracer.StartDecision).
func (o observer) StartSpan(c pipeline.Caller, path string, req *snapshot.Request) (context.Context, trace.Span) {
	r := requestOf(c)
	if r == nil {
		return c.Context(), nil
	}
	return o.s.startDecisionSpan(r, path, req)
}

func (o observer) EndSpan(span trace.Span, doc decision.Document, evalCode coded.Code, answered bool) {
	endDecisionSpan(span, doc, evalCode, answered)
}

func (o observer) DecisionTime(d time.Duration) { o.s.observeDecisionTime(d) }

func (o observer) Decision(op string, allow bool, code string, evalCode coded.Code, d time.Duration) {
	o.s.metrics.observeDecision(op, allow, code, evalCode, d)
}

func (o observer) LogFailed() { o.s.metrics.logFailures.Inc() }

// redecider decides the watches' requests again through the pipeline (Pipeline.Redecide).
type redecider struct{ s *Server }

func (d redecider) Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	return d.s.pipe.Redecide(ctx, req, facts)
}

// answerResult answers a result that is not a decision to send (not admitted, cut, refused,
// denied, not recorded) and reports false; for a decision it returns the document and the
// status to answer it with (500 with X-Authz-Error when it could not be evaluated: the document
// then denies).
func (s *Server) answerResult(w http.ResponseWriter, r *http.Request, res pipeline.Result) (doc decision.Document, status int, ok bool) {
	switch res.Outcome {
	case pipeline.Overloaded:
		s.answerOverloaded(w, r)
	case pipeline.CutShort:
		s.answerCut(w, r, res.Cut)
	case pipeline.Refused:
		writeError(w, res.Err)
	case pipeline.Denied:
		s.refuse(w, r, r.URL.EscapedPath(), ScopeDecide, res.Err)
	case pipeline.Unrecorded:
		w.Header().Set(headerError, string(coded.DecisionLogUnavailable))
		writeDecisionError(w, coded.Errorf(coded.DecisionLogUnavailable,
			"the decision could not be recorded in the decision log, which this service requires; nothing is granted until the log is writable again"))
	case pipeline.Decided:
		if res.EvalCode != "" {
			w.Header().Set(headerError, string(res.EvalCode))
			return res.Doc, http.StatusInternalServerError, true
		}
		return res.Doc, http.StatusOK, true
	}
	return res.Doc, 0, false
}
