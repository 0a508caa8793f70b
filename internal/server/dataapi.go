package server

// The OPA-compatible face of the service: the Data API for the decision document and every
// path inside it, and OPA's default decision at POST /. What an OPA client does out of habit
// works here: a body sent without a JSON content type (curl -d), a gzip-encoded body,
// ?pretty=true. Query parameters OPA knows and this service does not implement (explain,
// metrics, provenance, …) are refused with a 400 rather than silently ignored.

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pipeline"
	"github.com/authz-dev/authz/internal/snapshot"
)

const (
	// pathDefaultDecision is OPA's default decision: the body is the input itself and the answer
	// is the decision document itself.
	pathDefaultDecision = "/"
	// labelDataSubpath is the metrics label of every path below pathDataDecision.
	labelDataSubpath = pathDataDecision + "/*"
	// pathData is the root of OPA's data tree; labelDataOther labels its paths outside the
	// decision document.
	pathData       = "/v1/data"
	labelDataOther = pathData + "/*"
)

// documentKeys are the members of the decision document, in document order.
var documentKeys = []string{"allow", "code", "message", "reasons", "capabilities", "decision_id", "revision"}

// dataRoute routes the OPA-compatible paths that are not in the exact-match table: POST /,
// every path below /v1/data/authz/decision, and every other path of the data tree, which is
// undefined. label is the metrics label ("other" when not ok). Every one of them needs the
// decide scope.
func (s *Server) dataRoute(path string) (rt route, label string, ok bool) {
	switch {
	case path == pathDefaultDecision:
		return route{http.MethodPost, s.handleData, ScopeDecide}, pathDefaultDecision, true
	case strings.HasPrefix(path, pathDataDecision+"/"):
		return route{http.MethodPost, s.handleData, ScopeDecide}, labelDataSubpath, true
	case path == pathData || strings.HasPrefix(path, pathData+"/"):
		return route{http.MethodPost, s.handleUndefinedData, ScopeDecide}, labelDataOther, true
	}
	return route{}, "other", false
}

// handleUndefinedData answers a Data API path outside the decision document (data.authz.allow,
// the package data.authz, the root of the tree, …). The service serves one document, the
// decision; every other document is OPA's undefined document: 200 with no "result". No
// decision is made and none is logged, so such an answer never carries a value a client could
// read as a grant. The body is read as on the decision's paths (bounded, admitted, gzip) and
// must be empty or a JSON object, as OPA requires.
func (s *Server) handleUndefinedData(w http.ResponseWriter, r *http.Request) {
	pretty, err := dataQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.pipe.Body(s.caller(w, r, true), func(body []byte) {
		if err := undefinedDataBody(body); err != nil {
			writeError(w, err)
			return
		}
		writeDataJSON(w, http.StatusOK, struct{}{}, pretty)
	}, func(res pipeline.Result) { s.answerResult(w, r, res) })
}

// undefinedDataBody checks the body of a query for an undefined document: empty, or one JSON
// object.
func undefinedDataBody(body []byte) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil
	}
	if trimmed[0] != '{' || !json.Valid(trimmed) {
		return coded.Errorf(coded.BadRequest, `the body must be a JSON object, {"input": <request>}: fix the JSON`)
	}
	return nil
}

// handleData answers POST /v1/data/authz/decision[/sub/path] ({"input": request} in,
// {"result": value, "decision_id": id} out) and POST / (request in, decision document out).
// Every path is answered from one decision.
func (s *Server) handleData(w http.ResponseWriter, r *http.Request) {
	var sub []string
	if r.URL.Path != pathDefaultDecision && r.URL.Path != pathDataDecision {
		var err error
		if sub, err = documentPath(strings.TrimPrefix(r.URL.Path, pathDataDecision+"/")); err != nil {
			writeError(w, err)
			return
		}
	}
	pretty, err := dataQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	parse := func(body []byte) (*snapshot.Request, error) {
		if r.URL.Path != pathDefaultDecision {
			return parseDataRequest(body)
		}
		if misdirectedDataBody(body) {
			return nil, coded.Errorf(coded.BadRequest, `POST / takes the request itself as the body, not {"input": <request>}: send the request, or POST {"input": <request>} to `+pathDataDecision)
		}
		return snapshot.ParseRequestBytes(body)
	}
	s.pipe.Decide(s.caller(w, r, true), pipeline.Face{Path: r.URL.Path}, parse, func(res pipeline.Result) {
		doc, status, ok := s.answerResult(w, r, res)
		if !ok {
			return
		}
		switch {
		case r.URL.Path == pathDefaultDecision:
			writeDataJSON(w, status, doc, pretty)
		case sub == nil:
			writeDataJSON(w, status, dataAnswer{Result: doc, DecisionID: doc.DecisionID}, pretty)
		default:
			value, defined, err := documentValue(doc, sub)
			if err != nil {
				writeError(w, coded.Errorf(coded.Internal, "the answer could not be encoded"))
				return
			}
			if !defined {
				// As OPA answers an undefined document: no "result" at all.
				writeDataJSON(w, status, map[string]string{"decision_id": doc.DecisionID}, pretty)
				return
			}
			writeDataJSON(w, status, map[string]any{"result": value, "decision_id": doc.DecisionID}, pretty)
		}
	})
}

// documentPath checks a path below the decision document ("allow", "capabilities/nativeSyncIn",
// "reasons/0") against the document's shape and returns its segments.
func documentPath(p string) ([]string, error) {
	segs := strings.Split(p, "/")
	notFound := func(why string) error {
		return coded.Errorf(coded.NotFound, "no such document %s/%s: %s", strings.TrimPrefix(pathDataDecision, "/v1/data/"), p, why)
	}
	key := segs[0]
	if !slices.Contains(documentKeys, key) {
		return nil, notFound("the decision document has " + strings.Join(documentKeys, ", "))
	}
	switch {
	case len(segs) == 1:
		return segs, nil
	case len(segs) == 2 && key == "capabilities":
		if !slices.Contains(api.CapabilityKeys[:], segs[1]) {
			return nil, notFound("the capabilities are " + strings.Join(api.CapabilityKeys[:], ", "))
		}
		return segs, nil
	case len(segs) == 2 && key == "reasons":
		if n, err := strconv.Atoi(segs[1]); err != nil || n < 0 || strconv.Itoa(n) != segs[1] {
			return nil, notFound("reasons is an array: index it with 0, 1, …")
		}
		return segs, nil
	}
	return nil, notFound(key + " has no member " + strings.Join(segs[1:], "/"))
}

// documentValue is the value at path in doc; defined is false for an index past the end of
// reasons (OPA's undefined document).
func documentValue(doc decision.Document, path []string) (value any, defined bool, err error) {
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, false, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, false, err
	}
	for _, seg := range path {
		switch t := v.(type) {
		case map[string]any:
			if v, defined = t[seg]; !defined {
				return nil, false, nil
			}
		case []any:
			i, _ := strconv.Atoi(seg)
			if i >= len(t) {
				return nil, false, nil
			}
			v = t[i]
		default:
			return nil, false, nil
		}
	}
	return v, true, nil
}

// dataQuery reads the query parameters of a Data API request: pretty is implemented; every
// other parameter is refused, so that a client never believes it got what it asked for.
func dataQuery(r *http.Request) (pretty bool, err error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return false, coded.Errorf(coded.BadRequest, "the query string is malformed: %w", err)
	}
	for name, vals := range q {
		switch name {
		case "pretty":
			for _, v := range vals {
				switch v {
				case "", "true":
					pretty = true
				case "false":
				default:
					return false, coded.Errorf(coded.BadRequest, "query parameter pretty=%q: use pretty=true or pretty=false", v)
				}
			}
		case "explain", "metrics", "instrument", "provenance", "strict-builtin-errors", "partial", "input":
			return false, coded.Errorf(coded.BadRequest, "query parameter %q is not implemented by this service: remove it (only pretty is supported; the decision log keeps the input and result of every decision)", name)
		default:
			return false, coded.Errorf(coded.BadRequest, "unknown query parameter %q: remove it (only pretty is supported)", name)
		}
	}
	return pretty, nil
}

// readDataBody reads the body as OPA does: whatever its Content-Type, and gunzipped when it is
// sent with Content-Encoding: gzip. Both the sent and the decompressed body are bounded by
// maxBodyBytes.
func (s *Server) readDataBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	r2 := r.Clone(r.Context())
	r2.Header.Del("Content-Type")
	r2.Header.Del("Content-Encoding") // decoded below
	body, err := s.readBody(w, r2)
	if err != nil {
		return nil, err
	}
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return body, nil
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, coded.Errorf(coded.BadRequest, "the body is sent with Content-Encoding: gzip but is not gzip: %v", err)
		}
		limit := s.cfg.MaxBodyBytes
		plain, err := io.ReadAll(io.LimitReader(zr, limit+1))
		if err != nil {
			return nil, coded.Errorf(coded.BadRequest, "the gzip body could not be decompressed: %v", err)
		}
		if int64(len(plain)) > limit {
			return nil, coded.Errorf(coded.RequestTooLarge, "the decompressed request body is larger than the limit of %d bytes", limit)
		}
		return plain, nil
	default:
		return nil, coded.Errorf(coded.UnsupportedMediaType, "Content-Encoding %q is not supported: send the body as is, or gzip", enc)
	}
}

// misdirectedDataBody reports whether a body that should be a request looks like an OPA Data
// API body instead: an object with "input" and none of the request's own members. Only a body
// that may name "input" is decoded for that (the request parser then decodes it again); the
// usual request is decoded once.
func misdirectedDataBody(body []byte) bool {
	return mayNameInput(body) && namesInputOnly(body)
}

// mayNameInput reports whether body may hold the key "input": a JSON string decodes to "input"
// only when it is written as those five letters between quotes or spells a letter with a \u
// escape (no other escape, and no replacement of invalid UTF-8, yields a letter).
func mayNameInput(body []byte) bool {
	return bytes.Contains(body, []byte(`"input"`)) || bytes.Contains(body, []byte(`\u`))
}

// namesInputOnly decodes body and reports whether it is an object with "input" and none of the
// request's own members.
func namesInputOnly(body []byte) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return false
	}
	if _, ok := top["input"]; !ok {
		return false
	}
	for _, k := range []string{"operation", "environment", "lease", "command"} {
		if _, ok := top[k]; ok {
			return false
		}
	}
	return true
}

// misdirectedDataBodyError is the 400 of a Data API body sent to /v1/authorize or
// /v1/capabilities, or nil when the body is not one.
func misdirectedDataBodyError(path string, body []byte) error {
	if !misdirectedDataBody(body) {
		return nil
	}
	return coded.Errorf(coded.BadRequest,
		`%s takes the request itself, not {"input": <request>}: send the request as the body, or POST {"input": <request>} to %s (the OPA Data API)`,
		path, pathDataDecision)
}

// writeDataJSON is writeJSON, indented for ?pretty=true.
func writeDataJSON(w http.ResponseWriter, status int, v any, pretty bool) {
	if !pretty {
		writeJSON(w, status, v)
		return
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		writeJSON(w, status, v) // writes the encoding failure answer
		return
	}
	writeBody(w, status, b)
}
