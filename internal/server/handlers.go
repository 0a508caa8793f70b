package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
)

// Error codes of the HTTP API (besides the decision codes of SPEC section 7).
const (
	CodeBadRequest             = "BAD_REQUEST"
	CodeRequestTooLarge        = "REQUEST_TOO_LARGE"
	CodeMethodNotAllowed       = "METHOD_NOT_ALLOWED"
	CodeNotFound               = "NOT_FOUND"
	CodeUnsupportedMediaType   = "UNSUPPORTED_MEDIA_TYPE"
	CodeDecisionLogUnavailable = "DECISION_LOG_UNAVAILABLE"
	CodeInternal               = "INTERNAL_ERROR"
)

// HeaderError carries the code of a decision that could not be evaluated (EVAL_TIMEOUT, ...) or
// DECISION_LOG_UNAVAILABLE.
const HeaderError = "X-Authz-Error"

const (
	pathAuthorize    = "/v1/authorize"
	pathCapabilities = "/v1/capabilities"
	pathDataDecision = "/v1/data/authz/decision"

	marshalFailureBody = `{"code":"INTERNAL_ERROR","message":"the answer could not be encoded"}` + "\n"
)

// apiError is every answer that is not a decision: {"code": ..., "message": ...}.
type apiError struct {
	status  int
	Code    string `json:"code"`
	Message string `json:"message"`
	// Allow is set (to false) only on answers of decision endpoints that carry no decision
	// document, so that a client reading "allow" from any answer reads false.
	Allow *bool `json:"allow,omitempty"`
}

type route struct {
	method  string
	handler http.HandlerFunc
}

// routes builds the API. Paths match exactly; a known path with another method is 405 with an
// Allow header, an unknown path 404, both as JSON errors.
func (s *Server) routes() http.Handler {
	table := map[string]route{
		pathAuthorize:    {http.MethodPost, s.decisionHandler(pathAuthorize)},
		pathCapabilities: {http.MethodPost, s.decisionHandler(pathCapabilities)},
		pathDataDecision: {http.MethodPost, s.handleData},
		"/v1/plugins":    {http.MethodGet, s.handlePlugins},
		"/v1/facts":      {http.MethodGet, s.handleFacts},
		"/health":        {http.MethodGet, s.handleHealth},
		"/health/ready":  {http.MethodGet, s.handleReady},
		"/metrics": {http.MethodGet, promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{
			ErrorHandling: promhttp.ContinueOnError,
			ErrorLog:      s.log.StandardLogger(nil),
		}).ServeHTTP},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		rt, known := table[r.URL.Path]
		label := r.URL.Path
		if !known {
			rt, label, known = s.dataRoute(r.URL.Path)
		}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.Error("handler panicked", "path", r.URL.Path, "panic", p)
				if sw.status == 0 {
					writeError(sw, apiError{status: http.StatusInternalServerError, Code: CodeInternal, Message: "internal error; see the service log"})
				}
			}
			s.metrics.requests.WithLabelValues(label, strconv.Itoa(sw.statusOr200())).Inc()
		}()
		switch {
		case !known:
			writeError(sw, apiError{status: http.StatusNotFound, Code: CodeNotFound,
				Message: fmt.Sprintf("no such endpoint %q: see docs/service.md for the API", r.URL.Path)})
		case r.Method == rt.method, rt.method == http.MethodGet && r.Method == http.MethodHead:
			rt.handler(sw, r)
		default:
			allow := rt.method
			if rt.method == http.MethodGet {
				allow = "GET, HEAD"
			}
			sw.Header().Set("Allow", allow)
			writeError(sw, apiError{status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed,
				Message: fmt.Sprintf("%s %s is not allowed; use %s", r.Method, r.URL.Path, rt.method)})
		}
	})
}

// decisionHandler answers the three decision endpoints: they read the same request and differ
// only in the envelope of the answer.
func (s *Server) decisionHandler(path string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, aerr := s.readBody(w, r)
		if aerr != nil {
			writeError(w, *aerr)
			return
		}
		if aerr := misdirectedDataBodyError(path, body); aerr != nil {
			writeError(w, *aerr)
			return
		}
		var req *snapshot.Request
		var err error
		if path == pathDataDecision {
			req, err = parseDataRequest(body)
		} else {
			req, err = snapshot.ParseRequest(bytes.NewReader(body))
		}
		if err != nil {
			writeError(w, apiError{status: http.StatusBadRequest, Code: CodeBadRequest, Message: err.Error()})
			return
		}

		doc, evalCode, ok := s.decide(r, path, req)
		if !ok {
			w.Header().Set(HeaderError, CodeDecisionLogUnavailable)
			deny := false
			writeError(w, apiError{status: http.StatusServiceUnavailable, Code: CodeDecisionLogUnavailable, Allow: &deny,
				Message: "the decision could not be recorded in the decision log, which this service requires; nothing is granted until the log is writable again"})
			return
		}
		status := http.StatusOK
		if evalCode != "" {
			status = http.StatusInternalServerError
			w.Header().Set(HeaderError, evalCode)
		}
		switch path {
		case pathCapabilities:
			writeJSON(w, status, capabilitiesAnswer{Capabilities: doc.Capabilities, DecisionID: doc.DecisionID, Revision: doc.Revision})
		case pathDataDecision:
			writeJSON(w, status, dataAnswer{Result: doc, DecisionID: doc.DecisionID})
		default:
			writeJSON(w, status, doc)
		}
	}
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
func (s *Server) decide(r *http.Request, path string, req *snapshot.Request) (doc decision.Document, evalCode string, ok bool) {
	start := time.Now()
	doc, in, err := s.decider.Decide(r.Context(), req, s.facts)
	latency := time.Since(start)
	if err != nil {
		// Whatever the decider returned alongside its error, the answer is the SPEC 11
		// "Failures" document: it never grants.
		evalCode = decision.ErrorCode(err)
		if evalCode == "" {
			evalCode = decision.CodeEvalError
		}
		failed := decision.FailedDocument(req.Operation)
		failed.DecisionID, failed.Revision = doc.DecisionID, doc.Revision
		doc = failed
		s.log.Warn("decision could not be evaluated; answered with a deny",
			"decision_id", doc.DecisionID, "operation", req.Operation, "code", evalCode, "error", err)
	}
	if doc.DecisionID == "" {
		doc.DecisionID = uuid.NewString()
	}
	if doc.Reasons == nil {
		doc.Reasons = []string{}
	}
	s.metrics.observeDecision(req.Operation, doc.Allow, doc.Code, evalCode, latency)
	s.log.Debug("decision", "decision_id", doc.DecisionID, "path", path, "operation", req.Operation,
		"allow", doc.Allow, "code", doc.Code, "reasons", doc.Reasons, "latency", latency)

	logErr := s.dlog.write(logEntry{
		DecisionID: doc.DecisionID,
		Time:       start.UTC().Format(time.RFC3339Nano),
		Path:       path,
		Operation:  req.Operation,
		Input:      map[string]any(in),
		Result:     doc,
		Revision:   doc.Revision,
		LatencyNS:  latency.Nanoseconds(),
		Error:      evalCode,
	})
	if logErr != nil {
		s.metrics.logFailures.Inc()
		if s.cfg.DecisionLog.Required {
			s.log.Error("decision log unavailable; answering 503 instead of the decision", "decision_id", doc.DecisionID, "error", logErr)
			return doc, evalCode, false
		}
		s.log.Error("decision log line lost", "decision_id", doc.DecisionID, "error", logErr)
	}
	return doc, evalCode, true
}

// readBody reads a request body of an accepted media type within the size limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, &apiError{status: http.StatusUnsupportedMediaType, Code: CodeUnsupportedMediaType,
				Message: fmt.Sprintf("Content-Type %q is not JSON: send application/json", ct)}
		}
	}
	limit := s.cfg.MaxBodyBytes
	tooLarge := &apiError{status: http.StatusRequestEntityTooLarge, Code: CodeRequestTooLarge,
		Message: fmt.Sprintf("request body is larger than the limit of %d bytes", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	// MaxBytesReader tells the connection to close after a body over the limit; it needs the
	// server's own writer for that, not the status-recording wrapper.
	rw := w
	if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); ok {
		rw = u.Unwrap()
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		return nil, &apiError{status: http.StatusBadRequest, Code: CodeBadRequest,
			Message: fmt.Sprintf("could not read the request body: %v", err)}
	}
	return body, nil
}

// parseDataRequest reads the OPA Data API body {"input": request}.
func parseDataRequest(body []byte) (*snapshot.Request, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		msg := "body must be a JSON object {\"input\": <request>}"
		if err != nil {
			msg += ": " + err.Error()
		}
		return nil, errors.New(msg)
	}
	raw, ok := top["input"]
	if !ok {
		return nil, errors.New(`body has no "input": the Data API body is {"input": <request>}`)
	}
	req, err := snapshot.ParseRequest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	return req, nil
}

// pluginsAnswer is GET /v1/plugins.
type pluginsAnswer struct {
	Plugins []PluginInfo `json:"plugins"`
}

func (s *Server) handlePlugins(w http.ResponseWriter, _ *http.Request) {
	ps := s.facts.Plugins()
	if ps == nil {
		ps = []PluginInfo{}
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

func writeError(w http.ResponseWriter, e apiError) { writeJSON(w, e.status, e) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	b, err := json.Marshal(v)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, marshalFailureBody)
		return
	}
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
