package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/hoststate"
	"github.com/authz-dev/authz/internal/snapshot"
)

// headerError carries the code of a decision that could not be evaluated (EVAL_TIMEOUT, ...) or
// DECISION_LOG_UNAVAILABLE.
const headerError = "X-Authz-Error"

const (
	pathAuthorize    = "/v1/authorize"
	pathCapabilities = "/v1/capabilities"
	pathDataDecision = "/v1/data/authz/decision"

	marshalFailureBody = `{"code":"INTERNAL_ERROR","message":"the answer could not be encoded"}`
)

// apiError is every answer that is not a decision: {"code": ..., "message": ...}, the wire
// shape of a *coded.Error.
type apiError struct {
	Code    coded.Code `json:"code"`
	Message string     `json:"message"`
	// Allow is set (to false) only on answers of decision endpoints that carry no decision
	// document, so that a client reading "allow" from any answer reads false.
	Allow *bool `json:"allow,omitempty"`
}

// httpStatus is the HTTP status of each code the API answers with.
var httpStatus = map[coded.Code]int{
	coded.BadRequest:             http.StatusBadRequest,
	coded.Unauthorized:           http.StatusUnauthorized,
	coded.Forbidden:              http.StatusForbidden,
	coded.HostNotAllowed:         http.StatusForbidden,
	coded.NotFound:               http.StatusNotFound,
	coded.MethodNotAllowed:       http.StatusMethodNotAllowed,
	coded.RequestTooLarge:        http.StatusRequestEntityTooLarge,
	coded.RequestTimeout:         http.StatusRequestTimeout,
	coded.UnsupportedMediaType:   http.StatusUnsupportedMediaType,
	coded.Internal:               http.StatusInternalServerError,
	coded.Overloaded:             http.StatusServiceUnavailable,
	coded.DecisionLogUnavailable: http.StatusServiceUnavailable,
	coded.WatchLimit:             http.StatusServiceUnavailable,
	coded.Stopping:               http.StatusServiceUnavailable,
}

// statusOf is the HTTP status that answers err: its code's, and 500 for an error without one.
func statusOf(err error) int {
	if status, ok := httpStatus[coded.CodeOf(err)]; ok {
		return status
	}
	return http.StatusInternalServerError
}

type route struct {
	method  string
	handler http.HandlerFunc
	// scope is the token scope the endpoint needs; "" for the open health endpoints.
	scope string
}

// routes builds the API: the table of its paths, matched exactly as sent (no
// percent-decoding), and the Data API's paths (dataRoute), served through the middlewares of
// serveRoutes. For a known path the access control (Host check, authentication, scope) comes
// first, then a wrong method is 405 with an Allow header; an unknown path is 404; all as JSON
// errors.
func (s *Server) routes() http.Handler {
	table := map[string]route{
		pathAuthorize:    {http.MethodPost, s.decisionHandler(pathAuthorize), ScopeDecide},
		pathCapabilities: {http.MethodPost, s.decisionHandler(pathCapabilities), ScopeDecide},
		pathWatch:        {http.MethodPost, s.handleWatch, ScopeDecide}, // watch.go
		pathDataDecision: {http.MethodPost, s.handleData, ScopeDecide},
		// AuthZEN (authzen.go): the same decision in the AuthZEN shape.
		pathAuthZENEvaluation:    {http.MethodPost, s.handleAuthZENEvaluation, ScopeDecide},
		pathAuthZENEvaluations:   {http.MethodPost, s.handleAuthZENEvaluations, ScopeDecide},
		pathAuthZENConfiguration: {http.MethodGet, s.handleAuthZENConfiguration, ""},
		"/v1/plugins":            {http.MethodGet, s.handlePlugins, ScopeInspect},
		"/v1/facts":              {http.MethodGet, s.handleFacts, ScopeInspect},
		pathStatus:               {http.MethodGet, s.handleStatus, ScopeInspect}, // status.go
		"/health":                {http.MethodGet, s.handleHealth, ""},
		"/health/ready":          {http.MethodGet, s.handleReady, ""},
		"/metrics": {http.MethodGet, promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{
			ErrorHandling: promhttp.ContinueOnError,
			ErrorLog:      s.log.StandardLogger(nil),
		}).ServeHTTP, ScopeInspect},
	}
	return s.serveRoutes(table) // middleware.go
}

// decisionHandler answers POST /v1/authorize (the decision document) and POST
// /v1/capabilities (the capabilities alone). The Data API paths are handleData's; all of them
// decide through admitted and answerDecision.
func (s *Server) decisionHandler(path string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		parse := func(body []byte) (*snapshot.Request, error) {
			if err := misdirectedDataBodyError(path, body); err != nil {
				return nil, err
			}
			return snapshot.ParseRequestBytes(body)
		}
		s.admitted(w, r, s.readBody, parse, func(req *snapshot.Request, facts snapshot.Facts) {
			doc, status, ok := s.answerDecision(w, r, path, req, facts)
			if !ok {
				return
			}
			if path == pathCapabilities {
				writeJSON(w, status, capabilitiesAnswer{Capabilities: doc.Capabilities, DecisionID: doc.DecisionID, Revision: doc.Revision})
				return
			}
			writeJSON(w, status, doc)
		})
	}
}

// admitted reads the body of a decision request with read, decodes it with parse and hands
// the request to serve, holding the admission slots: the request is admitted before a byte of
// its body is read, and admitted again before it is decoded and decided, so that the bodies in
// memory and the decisions being decoded stay bounded whatever the number of clients. A
// request not admitted in time is answered 503 SERVICE_OVERLOADED; one that does not decode is
// answered with parse's error.
func (s *Server) admitted(w http.ResponseWriter, r *http.Request, read func(http.ResponseWriter, *http.Request) ([]byte, error),
	parse func(body []byte) (*snapshot.Request, error), serve func(req *snapshot.Request, facts snapshot.Facts)) {
	s.withBody(w, r, read, func(body []byte) {
		s.answerNotDecided(w, r, s.deciding(r, func() (*snapshot.Request, error) { return parse(body) }, serve))
	})
}

// withBody reads the body of a decision request with read and hands it to serve, holding a
// reading slot from before the first byte is read until serve returns. Access is checked
// again once the body is in: a token revoked (Reload) while the body was being sent decides
// nothing.
func (s *Server) withBody(w http.ResponseWriter, r *http.Request, read func(http.ResponseWriter, *http.Request) ([]byte, error), serve func(body []byte)) {
	hold := s.admit.admitBody(w, r, s.callerOf(r))
	if hold == nil {
		s.answerOverloaded(w, r)
		return
	}
	defer s.admit.finish(r, hold)
	body, err := read(w, r)
	if why := s.admit.bodyIn(hold); why != 0 {
		s.answerCut(w, r, why)
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if denied := s.access.check(r, ScopeDecide); denied != nil {
		s.refuse(w, r, r.URL.EscapedPath(), ScopeDecide, denied)
		return
	}
	serve(body)
}

// answerCut answers a request whose body was cut (admission.cutLocked): 408 when it came too
// slowly, 503 with Retry-After when its caller held more than its share of the reading places.
// The connection is closed: the rest of its body is not read.
func (s *Server) answerCut(w http.ResponseWriter, r *http.Request, why int32) {
	if why != cutSlow {
		s.answerOverloaded(w, r)
		return
	}
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	err := s.admit.cutError(why)
	w.Header().Set(headerError, string(coded.CodeOf(err)))
	writeDecisionError(w, err)
}

// callerOf is who sends r, for sharing the admission places: its bearer token when the service
// authenticates with tokens, its client certificate under TLS authentication, else its peer
// address without the port (every request over a unix socket is one caller).
func (s *Server) callerOf(r *http.Request) string {
	switch s.access.mode {
	case AuthToken:
		if tok, ok := bearerToken(r); ok {
			return tok
		}
	case AuthTLS:
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			return string(r.TLS.PeerCertificates[0].Signature)
		}
	}
	addr := r.RemoteAddr
	if i := strings.LastIndexByte(addr, ':'); i >= 0 {
		addr = addr[:i]
	}
	return addr
}

// batchShare is what a decision of an AuthZEN batch is to its log record: the number of the
// batch's evaluations it answers, and the cap of its line, a share of decisionLog.maxLineBytes
// (0: the whole of it).
type batchShare struct{ items, lineCap int }

// errNotAdmitted is deciding's error when no deciding slot was free in time.
var errNotAdmitted = errors.New("not admitted")

// deciding decodes a request with parse and decides it with serve, holding a deciding slot
// for both. It returns errNotAdmitted when no slot came in time, or parse's error.
//
// A driver's config check that must be asked is not waited for in a deciding slot: the
// request gives its slot and its decoded form up, waits for the check (which holds only the
// config), and is admitted, decoded and decided again, the answer then at hand. So a plugin
// whose checks are slow holds up its own callers only.
func (s *Server) deciding(r *http.Request, parse func() (*snapshot.Request, error), serve func(req *snapshot.Request, facts snapshot.Facts)) error {
	caller := s.callerOf(r)
	if !s.admit.acquire(r.Context(), s.admit.deciding, caller, nil) {
		return errNotAdmitted
	}
	req, err := parse()
	if err != nil {
		s.admit.deciding.release(caller)
		return err
	}
	var facts snapshot.Facts = s.facts
	if wait := snapshot.PendingConfigCheck(req, s.facts); wait != nil {
		s.admit.deciding.release(caller) // the decoded request is not used again: decoded again below
		facts = wait(r.Context())
		if !s.admit.acquire(r.Context(), s.admit.deciding, caller, nil) {
			return errNotAdmitted
		}
		if req, err = parse(); err != nil {
			s.admit.deciding.release(caller)
			return err
		}
	}
	defer s.admit.deciding.release(caller)
	serve(req, facts)
	return nil
}

// answerNotDecided answers deciding's error: 503 when no slot came in time, the error (a bad
// request) otherwise; nothing when err is nil (the decision was answered).
func (s *Server) answerNotDecided(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, errNotAdmitted):
		s.answerOverloaded(w, r)
	case err != nil:
		writeError(w, err)
	}
}

// answerDecision decides req and returns the document with the HTTP status to answer it with
// (500 with X-Authz-Error when it could not be evaluated: the document then denies). When the
// required decision log could not record it, it has answered 503 itself and ok is false.
func (s *Server) answerDecision(w http.ResponseWriter, r *http.Request, path string, req *snapshot.Request, facts snapshot.Facts) (doc decision.Document, status int, ok bool) {
	doc, evalCode, ok := s.decide(r, path, req, facts)
	if !ok {
		w.Header().Set(headerError, string(coded.DecisionLogUnavailable))
		writeDecisionError(w, coded.Errorf(coded.DecisionLogUnavailable,
			"the decision could not be recorded in the decision log, which this service requires; nothing is granted until the log is writable again"))
		return doc, 0, false
	}
	if evalCode != "" {
		w.Header().Set(headerError, string(evalCode))
		return doc, http.StatusInternalServerError, true
	}
	return doc, http.StatusOK, true
}

type capabilitiesAnswer struct {
	Capabilities decision.Capabilities `json:"capabilities"`
	DecisionID   string                `json:"decision_id"`
	Revision     string                `json:"revision"`
}

type dataAnswer struct {
	Result     decision.Document `json:"result"`
	DecisionID string            `json:"decision_id"`
}

// decide makes and records one decision. evalCode is the failure's code when the decision
// could not be evaluated (the document is then the fail-closed deny). ok is false when the
// decision log is required and its line could not be written: the decision must not be used.
func (s *Server) decide(r *http.Request, path string, req *snapshot.Request, facts snapshot.Facts) (doc decision.Document, evalCode coded.Code, ok bool) {
	return s.decideFor(r, path, req, facts, "", batchShare{})
}

// decideFor is decide for the first decision of a watch (watchID not empty), whose log record
// names the watch, or for a decision of an AuthZEN batch (batch: how many of its evaluations
// it answers, and its line's share of the log's bound).
func (s *Server) decideFor(r *http.Request, path string, req *snapshot.Request, facts snapshot.Facts, watchID string, batch batchShare) (doc decision.Document, evalCode coded.Code, ok bool) {
	start := time.Now()
	ctx, span := s.startDecisionSpan(r, path, req) // tracing.go; nil span when tracing is off
	doc, in, err := s.decider.Decide(ctx, req, facts)
	latency := time.Since(start)
	s.observeDecisionTime(latency)
	if err != nil {
		// Whatever the decider returned alongside its error, the answer is the docs/contract.md, "Precise rules"
		// "Failures" document: it never grants.
		doc, evalCode = decision.FailClosed(req.Operation, doc, err)
		s.log.Warn("decision could not be evaluated; answered with a deny",
			"decision_id", doc.DecisionID, "operation", req.Operation, "code", string(evalCode), "error", err)
	}
	if doc.DecisionID == "" {
		doc.DecisionID = decision.NewDecisionID()
	}
	if doc.Reasons == nil {
		doc.Reasons = []string{}
	}
	s.log.Debug("decision", "decision_id", doc.DecisionID, "path", path, "operation", req.Operation,
		"allow", doc.Allow, "code", doc.Code, "reasons", doc.Reasons, "latency", latency)

	entry := logEntry{
		DecisionID: doc.DecisionID,
		Time:       start.UTC().Format(time.RFC3339Nano),
		Path:       path,
		Operation:  req.Operation,
		Input:      map[string]any(in),
		Result:     doc,
		Revision:   doc.Revision,
		LatencyNS:  latency.Nanoseconds(),
		Error:      evalCode,
		WatchID:    watchID,
	}
	if batch.items > 1 {
		entry.Items = batch.items
	}
	entry.lineCap = batch.lineCap
	logErr := s.dlog.write(entry)
	s.logToOPA(ctx, r, start, entry) // status.go: OPA's decision-log plugin, when configured
	if logErr != nil {
		s.metrics.logFailures.Inc()
		if s.cfg.DecisionLog.Required {
			s.log.Error("decision log unavailable; answering 503 instead of the decision", "decision_id", doc.DecisionID, "error", logErr)
			// Nothing is granted until the log is writable again, watched grants included.
			s.watches.RevokeAll(decision.ReasonLogUnavailable, coded.DecisionLogUnavailable)
			// Counted as what the client was answered: a deny, never the decision it replaced.
			s.metrics.observeDecision(req.Operation, false, string(coded.DecisionLogUnavailable), evalCode, latency)
			endDecisionSpan(span, doc, evalCode, false)
			return doc, evalCode, false
		}
		s.log.Error("decision log line lost", "decision_id", doc.DecisionID, "error", logErr)
	}
	s.metrics.observeDecision(req.Operation, doc.Allow, doc.Code, evalCode, latency)
	endDecisionSpan(span, doc, evalCode, true)
	return doc, evalCode, true
}

// answerOverloaded answers a decision request that was not admitted in time: 503 with
// Retry-After, and the connection is closed (its unread body is not worth reading).
func (s *Server) answerOverloaded(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", s.admit.retryAfter())
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	w.Header().Set(headerError, string(coded.Overloaded))
	writeDecisionError(w, s.admit.overloaded())
}

// readBody reads a request body of an accepted media type within the size limit. It reads
// into one buffer of the announced length when there is one, so that a body costs its size
// once, not the doublings of a growing buffer.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || !isJSONMediaType(mt) {
			return nil, coded.Errorf(coded.UnsupportedMediaType, "Content-Type %q is not JSON: send application/json", ct)
		}
	}
	// The body is decided as sent: one that says it is encoded is refused, never read as if
	// it were not (an intermediary that decodes it would see another request).
	if enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc != "" && enc != "identity" {
		return nil, coded.Errorf(coded.UnsupportedMediaType, "Content-Encoding %q is not supported on this endpoint: send the body as is", r.Header.Get("Content-Encoding"))
	}
	limit := s.cfg.MaxBodyBytes
	tooLarge := coded.Errorf(coded.RequestTooLarge, "request body is larger than the limit of %d bytes", limit)
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	// MaxBytesReader tells the connection to close after a body over the limit; it needs the
	// server's own writer for that, not the status-recording wrapper.
	rw := w
	if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); ok {
		rw = u.Unwrap()
	}
	body, err := readAllSized(http.MaxBytesReader(rw, r.Body, limit), r.ContentLength)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		return nil, coded.Errorf(coded.BadRequest, "could not read the request body: %v", err)
	}
	return body, nil
}

// isJSONMediaType reports whether mt is application/json or an application/*+json type.
func isJSONMediaType(mt string) bool {
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// readAllSized reads r to its end into a buffer of size bytes when size is known (>= 0).
func readAllSized(r io.Reader, size int64) ([]byte, error) {
	if size < 0 {
		return io.ReadAll(r)
	}
	// One byte more than announced, to see the end without growing.
	buf := make([]byte, 0, size+1)
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if len(buf) == cap(buf) {
			// More than announced: net/http does not let this happen, but read on.
			rest, err := io.ReadAll(r)
			return append(buf, rest...), err
		}
	}
}

// parseDataRequest reads the OPA Data API body {"input": request}.
func parseDataRequest(body []byte) (*snapshot.Request, error) {
	var top map[string]json.RawMessage
	const shape = `body must be a JSON object {"input": <request>}`
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, coded.Errorf(coded.BadRequest, shape+": %v", err)
	}
	if top == nil {
		return nil, coded.Errorf(coded.BadRequest, shape)
	}
	raw, ok := top["input"]
	if !ok {
		return nil, coded.Errorf(coded.BadRequest, `body has no "input": the Data API body is {"input": <request>}`)
	}
	req, err := snapshot.ParseRequestBytes(raw)
	if err != nil {
		return nil, fmt.Errorf("input: %w", err) // a bad request, as ParseRequestBytes's errors are
	}
	return req, nil
}

// pluginsAnswer is GET /v1/plugins.
type pluginsAnswer struct {
	Plugins []hoststate.PluginState `json:"plugins"`
}

func (s *Server) handlePlugins(w http.ResponseWriter, _ *http.Request) {
	ps := s.facts.Plugins()
	if ps == nil {
		ps = []hoststate.PluginState{}
	}
	writeJSON(w, http.StatusOK, pluginsAnswer{Plugins: ps})
}

func (s *Server) handleFacts(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, normalizeFile(s.facts.FactsFile()))
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readiness is GET /health/ready.
type readiness struct {
	Ready          bool   `json:"ready"`
	PolicyLoaded   bool   `json:"policyLoaded"`
	PluginsStarted bool   `json:"pluginsStarted"`
	Revision       string `json:"revision"`
}

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	rev := s.decider.Revision()
	a := readiness{PolicyLoaded: rev != "", PluginsStarted: s.facts.Ready(), Revision: rev}
	a.Ready = a.PolicyLoaded && a.PluginsStarted
	status := http.StatusOK
	if !a.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, a)
}

// writeError answers err: its status, code and message.
func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, statusOf(err), errorAnswer(err))
}

// writeDecisionError answers err on a decision endpoint: as writeError, with "allow": false.
func writeDecisionError(w http.ResponseWriter, err error) {
	a := errorAnswer(err)
	deny := false
	a.Allow = &deny
	writeJSON(w, statusOf(err), a)
}

func errorAnswer(err error) apiError {
	code := coded.CodeOf(err)
	if code == "" {
		code = coded.Internal
	}
	return apiError{Code: code, Message: err.Error()}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeBody(w, http.StatusInternalServerError, []byte(marshalFailureBody))
		return
	}
	writeBody(w, status, b)
}

// writeBody answers with status and the JSON document b, and a newline.
func writeBody(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// statusWriter remembers the status code for the request counter.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) statusOr200() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}
