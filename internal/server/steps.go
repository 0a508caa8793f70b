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
	"github.com/authz-dev/authz/internal/watch"
)

// The steps of the decision pipeline (internal/pipeline) as HTTP implements them: the caller of
// a request (its reading place, body and access), the deciding places, the recorder and the
// observer (the recorder is internal/audit's). The pipeline calls them in its one order; a handler never calls them itself
// (TestHandlersDecideOnlyThroughThePipeline).

// newPipeline is the server's pipeline over its steps.
func (s *Server) newPipeline() *pipeline.Pipeline {
	return pipeline.New(s.decider, s.facts, decidingPlaces{s.admit}, s.rec, observer{s}, s.log)
}

// httpCaller is one HTTP request as the pipeline's caller.
type httpCaller struct {
	s    *Server
	w    http.ResponseWriter
	r    *http.Request
	data bool // the body is the Data API's (readDataBody), not readBody's
	id   string
	hold *bodyHold
}

// caller is r's caller, its body read by readBody, or by readDataBody when data. It lives in
// the request's reading place (bodyHold, from a pool): it is not used after the pipeline
// returned.
func (s *Server) caller(w http.ResponseWriter, r *http.Request, data bool) *httpCaller {
	h := newBodyHold()
	h.hc = httpCaller{s: s, w: w, r: r, data: data, id: s.callerOf(r), hold: h}
	return &h.hc
}

func (c *httpCaller) Context() context.Context { return c.r.Context() }
func (c *httpCaller) ID() string               { return c.id }
func (c *httpCaller) ReadBody() ([]byte, error) {
	if c.data {
		return c.s.readDataBody(c.w, c.r)
	}
	return c.s.readBody(c.w, c.r)
}
func (c *httpCaller) BodyIn() int32      { return c.s.admit.bodyIn(c.hold) }
func (c *httpCaller) Finish()            { c.s.admit.finish(c.r, c.hold) }
func (c *httpCaller) CheckAccess() error { return c.s.access.check(c.r, ScopeDecide) }
func (c *httpCaller) RemoteAddr() string { return c.r.RemoteAddr }

func (c *httpCaller) AdmitBody() bool {
	return c.s.admit.admitBody(c.hold, c.w, c.r, c.id)
}

// decidingPlaces are the admission's deciding places (limits.maxDeciding) and its budget of
// bytes decoded at once: the bytes are taken first, then the place.
type decidingPlaces struct{ a *admission }

func (p decidingPlaces) Acquire(ctx context.Context, caller string, decodeBytes int64) bool {
	took, ok := p.a.acquireDecoding(ctx, decodeBytes)
	if !ok {
		return false
	}
	if !p.a.acquire(ctx, p.a.deciding, caller, nil) {
		p.a.releaseDecoding(took)
		return false
	}
	return true
}

func (p decidingPlaces) Release(caller string, decodeBytes int64) {
	p.a.deciding.release(caller)
	p.a.releaseDecoding(min(decodeBytes, p.a.decodingCap))
}

func (p decidingPlaces) Overloaded() error { return p.a.overloaded() }

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

// redecider decides the watches' requests again through the pipeline (Pipeline.Redecide), and
// decodes a watched body only in its deciding place (Pipeline.RedecideBody).
type redecider struct{ s *Server }

var _ watch.BodyDecider = redecider{}

func (d redecider) DecideBody(ctx context.Context, operation string, body []byte, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	return d.s.pipe.RedecideBody(ctx, operation, body, facts)
}

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
