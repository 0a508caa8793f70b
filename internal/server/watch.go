package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pipeline"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/watch"
)

// pathWatch keeps a grant under watch (docs/service.md, "Watching a grant").
const pathWatch = "/v1/authorize/watch"

// Headers of a watch's answer.
const (
	headerWatchID      = "X-Authz-Watch-Id"
	headerPingInterval = "X-Authz-Ping-Interval" // the ping interval in milliseconds
)

// watchDoc is the data of one event: the decision document and the watch it belongs to.
type watchDoc struct {
	decision.Document
	WatchID string `json:"watch_id"`
}

// handleWatch answers POST /v1/authorize/watch: the request is admitted, decoded and decided
// as POST /v1/authorize's (the same answers before any stream: 4xx, a 500 deny, 503), then the
// answer is a stream of server-sent events: the decision first; when it allows, an update for
// every change of what it grants and, when it no longer allows, the revoke, after which the
// stream ends. The stream holds no admission slot: only the decision does.
func (s *Server) handleWatch(w http.ResponseWriter, r *http.Request) {
	res, err := s.watches.Reserve()
	if err != nil {
		s.answerNoWatch(w, r, err)
		return
	}
	defer res.Release() // a no-op once the watch took the place over
	caller := s.callerOf(r)
	if err := s.watchBudget.reserve(caller); err != nil {
		s.answerNoWatch(w, r, err)
		return
	}
	held := false // the caller's place went to the open watch
	defer func() {
		if !held {
			s.watchBudget.unreserve(caller)
		}
	}()
	charged := false // an HTTP/2 watch's cost is counted (http2WatchBytes)
	defer func() {
		if charged {
			s.watches.Uncharge(http2WatchBytes)
		}
	}()
	watchID := uuid.NewString()
	// Named on every answer, errors included: the decision log records the first decision under it.
	w.Header().Set(headerWatchID, watchID)
	var (
		decided bool
		first   decision.Document
		ww      *watch.Watch
		sent    []byte // the body, which the watch keeps to decide again
		seq     uint64 // the hub's changes seen before the decision (watch.Hub.Seq)
	)
	parse := func(body []byte) (*snapshot.Request, error) {
		if err := misdirectedDataBodyError(pathWatch, body); err != nil {
			return nil, err
		}
		sent = body
		req, err := snapshot.ParseRequestBytes(body)
		// Taken after the last decoding, the one decided, right before the decision: a change
		// after it re-decides the watch.
		seq = s.watches.Seq()
		return req, err
	}
	c := s.caller(w, r, false)
	s.pipe.Decide(c, pipeline.Face{Path: pathWatch, WatchID: watchID}, parse, func(out pipeline.Result) {
		doc, status, ok := s.answerResult(w, r, out)
		switch {
		case !ok:
			return
		case status != http.StatusOK:
			writeJSON(w, status, doc)
			return
		}
		req := out.Req
		if doc.Allow {
			// An HTTP/2 watch is served by its handler (it cannot be parked): its goroutine
			// and buffers count against watches.maxBytes, which the memory bound covers.
			// The cost counts in the caller's share too, so that one caller's HTTP/2 watches
			// cannot fill watches.maxBytes.
			var extra int64
			if r.ProtoMajor == 2 {
				extra = http2WatchBytes
			}
			h, err := s.watchBudget.hold(caller, sent, extra)
			if err != nil {
				s.answerNoWatch(w, r, err)
				return
			}
			if extra > 0 {
				if !s.watches.Charge(http2WatchBytes) {
					s.watchBudget.unhold(h)
					s.answerNoWatch(w, r, errHTTP2WatchBytes)
					return
				}
				charged = true
			}
			if ww, err = s.watches.Add(res, req, sent, doc, seq); err != nil {
				s.watchBudget.unhold(h)
				s.answerNoWatch(w, r, err)
				return
			}
			s.watchBudget.opened(ww, h)
			held = true
			// Access is checked for as long as the watch is open: Reload re-reads the tokens,
			// then revokes the watches whose token it no longer accepts. Access is checked
			// again once the watch is among them, so a Reload that ran before is seen too.
			tok, _ := bearerToken(r)
			ww.SetTag(watchCredential{token: tok})
			if denied := s.pipe.Recheck(c); denied != nil {
				s.closeWatch(ww)
				ww = nil
				s.refuse(w, r, pathWatch, ScopeDecide, denied)
				return
			}
		}
		decided, first = true, doc
	})
	if !decided {
		return
	}
	s.metrics.watchEvents.WithLabelValues(string(watch.KindDecision), firstReason(first)).Inc()
	if ww != nil && s.parked.park(w, r, watchID, first, ww) {
		return // watchstream.go serves it from here
	}
	if ww != nil {
		defer s.closeWatch(ww)
	}
	s.stream(w, r, watchID, first, ww)
}

// stream writes the watch's events until the revoke, the client leaving, or a write that
// fails, from the handler (a stream that could not be parked: HTTP/2, or a deny's one event).
func (s *Server) stream(w http.ResponseWriter, r *http.Request, watchID string, first decision.Document, ww *watch.Watch) {
	s.watchHeaders(w.Header(), watchID)
	rc := http.NewResponseController(w)
	// The stream outlives http.readTimeout: the request was read whole; the connection is
	// watched for the client leaving, not for a deadline.
	_ = rc.SetReadDeadline(time.Time{})
	w.WriteHeader(http.StatusOK)
	out := handlerStream{w: w, rc: rc, timeout: s.cfg.HTTP.WriteTimeout}
	if !out.send(encodeEvent(watch.KindDecision, first, watchID)) || ww == nil {
		return
	}
	ping := time.NewTicker(s.cfg.Watch.PingInterval)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ping.C:
			if s.sendEvents(out, r, ww, watchID, true) {
				return
			}
		case <-ww.Ready():
			if s.sendEvents(out, r, ww, watchID, false) {
				return
			}
		}
	}
}

// eventStream is where a watch's events are written: the handler's response (handlerStream)
// or a parked connection (parkedStream).
type eventStream interface {
	// send writes b within the stream's write time-out; false when it failed.
	send(b []byte) bool
}

// sendEvents is the one writer of a watch's events: it takes the events waiting on ww,
// records each (watchEvent), encodes them and sends them in one write, or a ping when ping and
// none waits. It reports whether the stream ended: the revoke was sent, or the write failed.
func (s *Server) sendEvents(out eventStream, r *http.Request, ww *watch.Watch, watchID string, ping bool) (ended bool) {
	var buf []byte
	for {
		ev, ok := ww.Take()
		if !ok {
			break
		}
		kind, doc := s.watchEvent(r, ev, watchID)
		buf = append(buf, encodeEvent(kind, doc, watchID)...)
		if kind == watch.KindRevoke {
			ended = true
			break
		}
	}
	if len(buf) == 0 && ping {
		buf = []byte(": ping\n\n")
	}
	if len(buf) > 0 && !out.send(buf) {
		ended = true
	}
	return ended
}

// handlerStream is a stream written from its handler (HTTP/2, or a deny's one event), each
// write within http.writeTimeout.
type handlerStream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (h handlerStream) send(b []byte) bool {
	_ = h.rc.SetWriteDeadline(time.Now().Add(h.timeout))
	if _, err := h.w.Write(b); err != nil {
		return false
	}
	return h.rc.Flush() == nil
}

// encodeEvent is one server-sent event: its kind and the document with the watch's id.
func encodeEvent(kind watch.Kind, doc decision.Document, watchID string) []byte {
	b, err := json.Marshal(watchDoc{Document: doc, WatchID: watchID})
	if err != nil {
		// A document of strings, booleans and a list of strings always encodes; should it not,
		// the watch ends on a deny of the same shape rather than on a broken line.
		b = []byte(`{"allow":false,"watch_id":"` + watchID + `"}`)
		kind = watch.KindRevoke
	}
	var buf bytes.Buffer
	buf.Grow(len(b) + 32)
	buf.WriteString("event: ")
	buf.WriteString(string(kind))
	buf.WriteString("\ndata: ")
	buf.Write(b)
	buf.WriteString("\n\n")
	return buf.Bytes()
}

// watchEvent records an event of the watch and returns what to send: the event, or the revoke
// when a required decision log could not record it (a decision that is not recorded is not
// used).
func (s *Server) watchEvent(r *http.Request, ev watch.Event, watchID string) (watch.Kind, decision.Document) {
	doc, recorded := s.recordWatchEvent(&httpCaller{s: s, r: r}, ev, watchID)
	kind := ev.Kind
	if !recorded && kind != watch.KindRevoke {
		doc = decision.FailedDocument(ev.Operation)
		doc.Reasons, doc.Revision, doc.DecisionID = []string{decision.ReasonLogUnavailable}, ev.Doc.Revision, decision.NewDecisionID()
		kind = watch.KindRevoke
	}
	s.metrics.watchEvents.WithLabelValues(string(kind), firstReason(doc)).Inc()
	return kind, doc
}

// recordWatchEvent names an event's decision (its own decision_id) and records it with the
// watch's id, through the pipeline (Pipeline.Event), or off the stream's writer for a revoke
// (revokelog.go). recorded is false when the log is required and the record could not be
// written.
func (s *Server) recordWatchEvent(c pipeline.Caller, ev watch.Event, watchID string) (doc decision.Document, recorded bool) {
	doc = ev.Doc
	doc.DecisionID = decision.NewDecisionID()
	rec := pipeline.Record{RemoteAddr: c.RemoteAddr(), DecisionID: doc.DecisionID, Start: time.Now(), Path: pathWatch, Operation: ev.Operation,
		Input: ev.Input, Result: doc, Latency: ev.Latency, EvalCode: ev.EvalCode, WatchID: watchID}
	revoke := ev.Kind == watch.KindRevoke
	if revoke && s.revokes.add(c.Context(), rec) {
		return doc, true
	}
	return doc, s.pipe.Event(c.Context(), rec, revoke)
}

// http2WatchBytes is what an HTTP/2 watch costs besides its body: the handler's goroutine and
// the stream's buffers (an HTTP/1.x watch is parked and costs a few hundred bytes).
const http2WatchBytes = 29 << 10

// errHTTP2WatchBytes: an HTTP/2 watch's cost would pass watches.maxBytes.
var errHTTP2WatchBytes = errors.New("the HTTP/2 watch's cost would pass watches.maxBytes")

// answerNoWatch answers a watch that could not be opened: 503 with Retry-After past
// watches.max, 503 while the service stops.
func (s *Server) answerNoWatch(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, watch.ErrLimit):
		w.Header().Set("Retry-After", "1")
		w.Header().Set(headerError, string(coded.WatchLimit))
		writeDecisionError(w, coded.Errorf(coded.WatchLimit,
			"%d watches are open, the most this service allows (watches.max, formerly limits.maxWatches, lowered to what ulimit -n leaves beside the connections); close one, retry after the time in Retry-After, or raise the limit",
			s.watches.MaxWatches()))
	case errors.Is(err, watch.ErrBytes):
		w.Header().Set("Retry-After", "1")
		w.Header().Set(headerError, string(coded.WatchLimit))
		writeDecisionError(w, coded.Errorf(coded.WatchLimit,
			"the open watches hold %d bytes of request bodies, the most watches.maxBytes (formerly limits.maxWatchBytes) allows; close a watch, retry after the time in Retry-After, send a smaller request, or raise the limit",
			s.cfg.Watch.MaxBytes))
	case errors.Is(err, errHTTP2WatchBytes):
		w.Header().Set("Retry-After", "1")
		w.Header().Set(headerError, string(coded.WatchLimit))
		writeDecisionError(w, coded.Errorf(coded.WatchLimit,
			"a watch over HTTP/2 costs about %d KiB (its own goroutine and buffers) and the open watches hold watches.maxBytes (%d bytes); open the watch over HTTP/1.1, where its stream costs a few hundred bytes, or retry after the time in Retry-After",
			http2WatchBytes>>10, s.cfg.Watch.MaxBytes))
	case errors.Is(err, errCallerWatches):
		w.Header().Set("Retry-After", "1")
		w.Header().Set(headerError, string(coded.WatchLimit))
		writeDecisionError(w, coded.Errorf(coded.WatchLimit,
			"this caller has %d watches open, its share (watches.maxPerCaller, formerly limits.maxWatchesPerCaller); close one, retry after the time in Retry-After, or raise the limit",
			s.watchBudget.maxCount))
	case errors.Is(err, errCallerBytes):
		w.Header().Set("Retry-After", "1")
		w.Header().Set(headerError, string(coded.WatchLimit))
		writeDecisionError(w, coded.Errorf(coded.WatchLimit,
			"this caller's watches hold its share of request bodies, %d bytes (watches.maxBytesPerCaller, formerly limits.maxWatchBytesPerCaller), where a watch over HTTP/2 also counts about %d KiB (its own goroutine and buffers); close a watch, retry after the time in Retry-After, send a smaller request, open the watch over HTTP/1.1, or raise the limit",
			s.watchBudget.maxBytes, http2WatchBytes>>10))
	case errors.Is(err, watch.ErrClosed):
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		w.Header().Set(headerError, string(coded.Stopping))
		writeDecisionError(w, coded.Errorf(coded.Stopping, "the service is stopping: open the watch again on a running instance"))
	default:
		writeDecisionError(w, coded.Errorf(coded.Internal, "the watch could not be opened: %v", err))
	}
}

// firstReason is the metrics label of a decision: its first reason, "" for a grant.
func firstReason(d decision.Document) string {
	switch {
	case len(d.Reasons) == 0:
		return ""
	case decision.KnownReason(d.Reasons[0]):
		return d.Reasons[0]
	}
	return "other" // a policy's own reason: the label set stays bounded
}

// watchCredential is what opened a watch, checked again when the tokens are re-read.
type watchCredential struct{ token string }

// revokeUnauthorizedWatches revokes the open watches whose token no longer has the decide
// scope (reason access_revoked).
func (s *Server) revokeUnauthorizedWatches() {
	n := s.watches.RevokeIf(func(tag any) bool {
		c, ok := tag.(watchCredential)
		return !ok || !s.access.stillDecides(c.token)
	}, decision.ReasonAccessRevoked, coded.Unauthorized)
	if n > 0 {
		s.log.Info("reload: watches opened with a token no longer accepted are revoked", "watches", n)
	}
}
