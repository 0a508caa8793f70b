package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pipeline"
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
// decide through the pipeline (steps.go).
func (s *Server) decisionHandler(path string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		parse := func(body []byte) (*snapshot.Request, error) {
			if err := misdirectedDataBodyError(path, body); err != nil {
				return nil, err
			}
			return snapshot.ParseRequestBytes(body)
		}
		s.pipe.Decide(s.caller(w, r, false), pipeline.Face{Path: path}, parse, func(res pipeline.Result) {
			doc, status, ok := s.answerResult(w, r, res)
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

type capabilitiesAnswer struct {
	Capabilities api.Capabilities `json:"capabilities"`
	DecisionID   string           `json:"decision_id"`
	Revision     string           `json:"revision"`
}

type dataAnswer struct {
	Result     decision.Document `json:"result"`
	DecisionID string            `json:"decision_id"`
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
		return nil, s.bodyReadError(err)
	}
	return body, nil
}

// bodyReadError is the answer to a body that could not be read: 408 when http.readTimeout
// passed before its end (the connection's or, over HTTP/2, the stream's deadline), else 400.
// Neither names the connection's addresses.
func (s *Server) bodyReadError(err error) error {
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return coded.Errorf(coded.RequestTimeout,
			"the request was not received whole within %v (http.readTimeout): send the body at once, send a smaller one, or raise http.readTimeout",
			s.cfg.HTTP.ReadTimeout)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err // without the connection's addresses
	}
	return coded.Errorf(coded.BadRequest, "could not read the request body: %v", err)
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
	Plugins []api.PluginState `json:"plugins"`
}

func (s *Server) handlePlugins(w http.ResponseWriter, _ *http.Request) {
	ps := s.facts.Plugins()
	if ps == nil {
		ps = []api.PluginState{}
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
