package server

import (
	"net/http"
	"strconv"

	"github.com/authz-dev/authz/internal/coded"
)

// resolved is the route a request's path names, handed down the middlewares with the request.
type resolved struct {
	path  string // the path as sent: r.URL.EscapedPath()
	label string // the metrics label: the route, "other" for every unknown path
	route route
	known bool
}

// routedHandler serves a request whose route is resolved; w records the status answered.
type routedHandler func(w *statusWriter, r *http.Request, to resolved)

// middleware is one concern of serving a request: it answers the request itself or hands it to
// next.
type middleware func(next routedHandler) routedHandler

// serveRoutes serves the route table through the middlewares, in the order they apply: the
// request is counted whatever answers it, a panic below the counter is answered 500, an unknown
// path is 404 without an access check, access is checked before anything of the request (its
// body included) is read, and a wrong method is 405. Only then does the route's handler run.
func (s *Server) serveRoutes(table map[string]route) http.Handler {
	serve := chain(serveRoute,
		s.countRequest,
		s.recoverPanic,
		answerNotFound,
		s.checkAccess,
		answerMethodNotAllowed,
	)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve(&statusWriter{ResponseWriter: w}, r, s.resolve(table, r))
	})
}

// chain wraps h in the middlewares, the first outermost.
func chain(h routedHandler, mws ...middleware) routedHandler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// resolve finds the route of r's path as it was sent, not of its unescaped form: in table, or
// among the Data API's paths (dataRoute). A path that needs unescaping names no endpoint:
// "/v1%2Fplugins" and "/%6detrics" are unknown, whatever they decode to.
func (s *Server) resolve(table map[string]route, r *http.Request) resolved {
	path := r.URL.EscapedPath()
	if rt, ok := table[path]; ok {
		return resolved{path: path, label: path, route: rt, known: true}
	}
	// Unknown paths share one label: the label set stays bounded.
	to := resolved{path: path, label: "other"}
	if path == r.URL.Path {
		to.route, to.label, to.known = s.dataRoute(path)
	}
	return to
}

// countRequest counts every answered request in authz_http_requests_total by route label and
// status. A request its handler aborted (http.ErrAbortHandler) was not answered and is not
// counted.
func (s *Server) countRequest(next routedHandler) routedHandler {
	return func(w *statusWriter, r *http.Request, to resolved) {
		next(w, r, to)
		s.metrics.requests.WithLabelValues(to.label, strconv.Itoa(w.statusOr200())).Inc()
	}
}

// recoverPanic logs a panic of what follows it and answers 500 INTERNAL_ERROR when nothing was
// answered yet. http.ErrAbortHandler panics on: it is how a handler asks net/http to abort the
// answer.
func (s *Server) recoverPanic(next routedHandler) routedHandler {
	return func(w *statusWriter, r *http.Request, to resolved) {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler { //nolint:errorlint // p is a recovered panic value; net/http compares it by identity too
				panic(p)
			}
			s.log.Error("handler panicked", "path", to.path, "panic", p)
			if w.status == 0 {
				writeError(w, coded.Errorf(coded.Internal, "internal error; see the service log"))
			}
		}()
		next(w, r, to)
	}
}

// answerNotFound answers 404 NOT_FOUND for a path that names no endpoint.
func answerNotFound(next routedHandler) routedHandler {
	return func(w *statusWriter, r *http.Request, to resolved) {
		if !to.known {
			writeError(w, coded.Errorf(coded.NotFound, "no such endpoint %q: paths are matched exactly as sent, without percent-decoding; see docs/service.md for the API", to.path))
			return
		}
		next(w, r, to)
	}
}

// checkAccess lets the request on only when it passes the access control (Host check,
// authentication, the route's scope). A refusal asks for a bearer token (WWW-Authenticate) when
// the service authenticates with tokens and none valid was sent, and carries "allow": false on
// the decision endpoints.
func (s *Server) checkAccess(next routedHandler) routedHandler {
	return func(w *statusWriter, r *http.Request, to resolved) {
		denied := s.access.check(r, to.route.scope)
		if denied == nil {
			next(w, r, to)
			return
		}
		s.refuse(w, r, to.path, to.route.scope, denied)
	}
}

// refuse answers a request the access control refused (denied, from access.check).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, path, scope string, denied error) {
	if coded.CodeOf(denied) == coded.Unauthorized && s.cfg.Authentication.mode() == AuthToken {
		w.Header().Set("WWW-Authenticate", `Bearer realm="authz"`)
	}
	s.log.Debug("request refused", "path", path, "code", string(coded.CodeOf(denied)), "remote", r.RemoteAddr)
	if scope == ScopeDecide {
		writeDecisionError(w, denied)
	} else {
		writeError(w, denied)
	}
}

// answerMethodNotAllowed answers 405 METHOD_NOT_ALLOWED with an Allow header to a method the
// route does not serve. A GET route serves HEAD as well.
func answerMethodNotAllowed(next routedHandler) routedHandler {
	return func(w *statusWriter, r *http.Request, to resolved) {
		want := to.route.method
		if r.Method == want || want == http.MethodGet && r.Method == http.MethodHead {
			next(w, r, to)
			return
		}
		allow := want
		if want == http.MethodGet {
			allow = "GET, HEAD"
		}
		w.Header().Set("Allow", allow)
		writeError(w, coded.Errorf(coded.MethodNotAllowed, "%s %s is not allowed; use %s", r.Method, r.URL.Path, want))
	}
}

// serveRoute hands the request to its route's handler.
func serveRoute(w *statusWriter, r *http.Request, to resolved) {
	to.route.handler(w, r)
}
