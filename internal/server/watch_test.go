package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/changes"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/policies"
)

// changingFacts are the test facts with a worker that can be killed and started again, telling
// its listeners as the plugin host does.
type changingFacts struct {
	*server.StaticFacts
	dead    atomic.Bool
	changed changes.Listeners[string]
}

func newChangingFacts(t testing.TB) *changingFacts {
	return &changingFacts{StaticFacts: staticFacts(t, "facts.json")}
}

func (f *changingFacts) Plugin(id string) (snapshot.PluginFacts, bool) {
	p, ok := f.StaticFacts.Plugin(id)
	if ok && f.dead.Load() {
		p.Worker = nil
	}
	return p, ok
}

func (f *changingFacts) OnFactsChange(fn func(string)) func() { return f.changed.Add(fn) }

// kill takes the worker of test.plugin out of the facts and says so.
func (f *changingFacts) kill() {
	f.dead.Store(true)
	f.changed.Notify("test.plugin")
}

// sseEvent is one server-sent event.
type sseEvent struct {
	kind string
	doc  map[string]any
}

// sseStream reads the events of a watch.
type sseStream struct {
	events chan sseEvent
	pings  atomic.Int32
	done   chan struct{} // closed when the stream ended
}

// watchAnswer is the answer to a watch: its status and headers, and its stream when it is
// one (else body is the whole answer).
type watchAnswer struct {
	StatusCode int
	Header     http.Header
	body       []byte
}

// openWatch posts body to the watch endpoint; the stream, when the answer is one, is read
// until it ends or the test ends.
func openWatch(t testing.TB, url, body string) (watchAnswer, *sseStream) {
	t.Helper()
	return openWatchWith(t, url, body, nil)
}

// openWatchWith is openWatch with these request headers.
func openWatchWith(t testing.TB, url, body string, header map[string]string) (watchAnswer, *sseStream) {
	t.Helper()
	// Every watch of these tests ends well within this; a service that never answers fails the
	// test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/authorize/watch", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req) //nolint:bodyclose // closed below, or by the goroutine that reads the stream
	require.NoError(t, err)
	a := watchAnswer{StatusCode: resp.StatusCode, Header: resp.Header}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		a.body, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		return a, nil
	}
	s := &sseStream{events: make(chan sseEvent, 16), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var kind string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == ": ping":
				s.pings.Add(1)
			case strings.HasPrefix(line, "event: "):
				kind = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				var doc map[string]any
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &doc) != nil {
					doc = map[string]any{"malformed": line}
				}
				select {
				case s.events <- sseEvent{kind, doc}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return a, s
}

// next waits for the next event.
func (s *sseStream) next(t testing.TB) sseEvent {
	t.Helper()
	select {
	case ev := <-s.events:
		return ev
	case <-s.done:
		select {
		case ev := <-s.events:
			return ev
		default:
		}
		t.Fatal("the stream ended without a further event")
	case <-time.After(15 * time.Second):
		t.Fatal("no event within 15 s")
	}
	return sseEvent{}
}

// requireEnded waits for the stream to end with no further event.
func (s *sseStream) requireEnded(t testing.TB) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the stream did not end within 15 s")
	}
	select {
	case ev := <-s.events:
		t.Fatalf("an event after the end: %v", ev)
	default:
	}
}

func TestWatchRevokesWhenTheWorkerDies(t *testing.T) {
	facts := newChangingFacts(t)
	var dlog syncBuffer
	url := startHTTP(t, newServer(t, withFacts(facts), withDecisionLog(&dlog)))
	resp, s := openWatch(t, url, fixture(t, nil))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	watchID := resp.Header.Get("X-Authz-Watch-Id")
	require.NotEmpty(t, watchID)
	require.Equal(t, "15000", resp.Header.Get("X-Authz-Ping-Interval"))

	first := s.next(t)
	require.Equal(t, "decision", first.kind)
	requireDocument(t, first.doc)
	require.Equal(t, true, first.doc["allow"])
	require.Equal(t, watchID, first.doc["watch_id"])

	facts.kill()
	rev := s.next(t)
	require.Equal(t, "revoke", rev.kind)
	requireDocument(t, rev.doc)
	require.Equal(t, false, rev.doc["allow"])
	require.Equal(t, "DUPLEX_CHANNEL_CAPABILITY_DENIED", rev.doc["code"])
	require.Equal(t, "Sandbox lease does not grant the duplex command stream capability.", rev.doc["message"])
	require.Contains(t, rev.doc["reasons"], "worker_not_running")
	require.NotEqual(t, first.doc["decision_id"], rev.doc["decision_id"])
	s.requireEnded(t)

	// Both events are decision-log records of the watch, each with its own decision id. The
	// revoke's is written off the stream's writer (revokelog.go): it may follow the revoke.
	var lines []map[string]any
	require.Eventually(t, func() bool { lines = dlog.lines(t); return len(lines) == 2 }, 10*time.Second, 5*time.Millisecond)
	require.Len(t, lines, 2)
	for i, ev := range []sseEvent{first, rev} {
		assert.Equal(t, watchID, lines[i]["watch_id"])
		assert.Equal(t, ev.doc["decision_id"], lines[i]["decision_id"])
		assert.Equal(t, "/v1/authorize/watch", lines[i]["path"])
		assert.NotNil(t, lines[i]["input"], "the input of the re-decision is recorded")
	}
}

func TestWatchOfADenyEndsAfterTheDecision(t *testing.T) {
	url := startHTTP(t, newServer(t, withFacts(newChangingFacts(t))))
	resp, s := openWatch(t, url, fixture(t, func(req map[string]any) { metadata(req)["pluginId"] = "no.such.plugin" }))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := s.next(t)
	require.Equal(t, "decision", ev.kind)
	require.Equal(t, false, ev.doc["allow"])
	s.requireEnded(t)
}

func TestWatchAnswersBadRequestsLikeAuthorize(t *testing.T) {
	url := startHTTP(t, newServer(t))
	for name, body := range map[string]string{
		"not JSON":       "{",
		"not an object":  "[]",
		"unknown op":     fixture(t, func(req map[string]any) { req["operation"] = "dance" }),
		"OPA input body": `{"input": ` + fixture(t, nil) + `}`,
	} {
		t.Run(name, func(t *testing.T) {
			want := post(t, url+"/v1/authorize", body)
			resp, s := openWatch(t, url, body)
			require.Nil(t, s, "no stream for a bad request")
			got := resp.body
			require.Equal(t, want.status, resp.StatusCode)
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var a, b map[string]any
			require.NoError(t, json.Unmarshal(want.body, &a))
			require.NoError(t, json.Unmarshal(got, &b))
			require.Equal(t, a["code"], b["code"])
		})
	}
}

func TestWatchLimit(t *testing.T) {
	facts := newChangingFacts(t)
	url := startHTTP(t, newServer(t, withFacts(facts), withConfig(func(c *server.Config) { c.Limits.MaxWatches = 1 })))
	resp, s := openWatch(t, url, fixture(t, nil))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "decision", s.next(t).kind)

	over, _ := openWatch(t, url, fixture(t, nil))
	require.Equal(t, http.StatusServiceUnavailable, over.StatusCode)
	require.Equal(t, "WATCH_LIMIT", over.Header.Get("X-Authz-Error"))
	require.NotEmpty(t, over.Header.Get("Retry-After"))

	// A revoked watch gives its place back.
	facts.kill()
	require.Equal(t, "revoke", s.next(t).kind)
	s.requireEnded(t)
	require.Eventually(t, func() bool {
		resp, s := openWatch(t, url, fixture(t, func(req map[string]any) { metadata(req)["pluginId"] = "no.such.plugin" }))
		if resp.StatusCode != http.StatusOK {
			return false
		}
		return s.next(t).kind == "decision"
	}, 10*time.Second, 10*time.Millisecond)
}

// switchableEngine is the embedded policy's engine with a second, deny-all, policy at hand.
func newEngine(t testing.TB) *decision.Engine {
	t.Helper()
	e := decisiontest.EmbeddedEngine(t, decision.Options{EvalTimeout: 5 * time.Second})
	return e
}

// activate compiles modules and makes them e's policy.
func activate(t testing.TB, e *decision.Engine, modules map[string]string, revision string) {
	t.Helper()
	parsed := map[string]*ast.Module{}
	for name, src := range modules {
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{ProcessAnnotation: true})
		require.NoError(t, err)
		parsed[name] = m
	}
	p, err := decision.CompileModules(parsed, nil, revision)
	require.NoError(t, err)
	require.NoError(t, e.Activate(context.Background(), p))
}

func TestWatchFollowsPolicyActivations(t *testing.T) {
	e := newEngine(t)
	url := startHTTP(t, newServer(t, withDecider(e), withFacts(newChangingFacts(t))))
	_, s := openWatch(t, url, fixture(t, nil))
	first := s.next(t)
	require.Equal(t, true, first.doc["allow"])

	// The same policy under a new revision: still a grant, on another revision.
	mods, err := policies.Modules()
	require.NoError(t, err)
	activate(t, e, mods, "second")
	upd := s.next(t)
	require.Equal(t, "update", upd.kind)
	require.Equal(t, true, upd.doc["allow"])
	require.Equal(t, "second", upd.doc["revision"])
	require.Equal(t, first.doc["capabilities"], upd.doc["capabilities"])

	// A policy that allows nothing revokes the grant.
	activate(t, e, map[string]string{"deny.rego": policytest.DenyAllModule}, "deny-all")
	rev := s.next(t)
	require.Equal(t, "revoke", rev.kind)
	require.Equal(t, false, rev.doc["allow"])
	require.Equal(t, "deny-all", rev.doc["revision"])
	s.requireEnded(t)
}

func TestWatchPings(t *testing.T) {
	url := startHTTP(t, newServer(t, withFacts(newChangingFacts(t)), withConfig(func(c *server.Config) {
		c.Watch.PingInterval = 20 * time.Millisecond
	})))
	resp, s := openWatch(t, url, fixture(t, nil))
	require.Equal(t, "20", resp.Header.Get("X-Authz-Ping-Interval"))
	require.Equal(t, "decision", s.next(t).kind)
	require.Eventually(t, func() bool { return s.pings.Load() >= 3 }, 10*time.Second, 5*time.Millisecond)
}

// TestWatchOutlivesTheReadTimeout: the stream is not ended by http.readTimeout (the request
// was read whole) nor by http.writeTimeout (each write has its own deadline).
func TestWatchOutlivesTheReadTimeout(t *testing.T) {
	facts := newChangingFacts(t)
	cfg := testConfig()
	cfg.HTTP.ReadTimeout = 100 * time.Millisecond
	cfg.HTTP.WriteTimeout = 100 * time.Millisecond
	cfg.Watch.PingInterval = 20 * time.Millisecond
	srv, err := server.New(cfg, testEngine(t), facts, server.Options{})
	require.NoError(t, err)
	url, stop := serve(t, srv)
	defer stop()
	_, s := openWatch(t, url, fixture(t, nil))
	require.Equal(t, "decision", s.next(t).kind)
	// Ten ping intervals past both time-outs, the stream is still open and pinging.
	deadline := time.Now().Add(300 * time.Millisecond)
	require.Eventually(t, func() bool { return time.Now().After(deadline) && s.pings.Load() >= 10 }, 10*time.Second, 5*time.Millisecond)
	select {
	case <-s.done:
		t.Fatal("the stream ended")
	default:
	}
	facts.kill()
	require.Equal(t, "revoke", s.next(t).kind)
}

// serve runs srv.Serve on a loopback listener; stop cancels it and waits for Serve to return.
func serve(t testing.TB, srv *server.Server) (url string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-served:
				assert.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Error("Serve did not return within 20 s")
			}
			assert.NoError(t, srv.Close())
		})
	}
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}

func TestWatchRevokedWhenTheServiceStops(t *testing.T) {
	srv, err := server.New(testConfig(), testEngine(t), newChangingFacts(t), server.Options{})
	require.NoError(t, err)
	url, stop := serve(t, srv)
	_, s := openWatch(t, url, fixture(t, nil))
	require.Equal(t, "decision", s.next(t).kind)
	go stop()
	rev := s.next(t)
	require.Equal(t, "revoke", rev.kind)
	require.Equal(t, false, rev.doc["allow"])
	require.Equal(t, []any{"service_stopping"}, rev.doc["reasons"])
	s.requireEnded(t)
}

// syncBuffer is a decision log the test reads while the server writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines(t testing.TB) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		out = append(out, m)
	}
	return out
}

// TestWatchOverHTTP2: an HTTP/2 stream cannot be parked; its handler serves it, with the same
// events.
func TestWatchOverHTTP2(t *testing.T) {
	facts := newChangingFacts(t)
	srv := newServer(t, withFacts(facts))
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/authorize/watch", strings.NewReader(fixture(t, nil)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 2, resp.ProtoMajor)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	var kinds []string
	for sc.Scan() {
		if k, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			kinds = append(kinds, k)
			if k == "decision" {
				facts.kill()
			}
		}
	}
	require.Equal(t, []string{"decision", "revoke"}, kinds)
}

// failingLog is a decision log whose writes fail once broken is set.
type failingLog struct{ broken atomic.Bool }

func (l *failingLog) Write(p []byte) (int, error) {
	if l.broken.Load() {
		return 0, io.ErrShortWrite
	}
	return len(p), nil
}

// TestWatchRevokedWhenTheRequiredLogFails: with decisionLog.required, a decision whose record
// cannot be written revokes every open watch (decision_log_unavailable): nothing is granted
// until the log is writable again, watched grants included.
func TestWatchRevokedWhenTheRequiredLogFails(t *testing.T) {
	dlog := &failingLog{}
	url := startHTTP(t, newServer(t, withFacts(newChangingFacts(t)), withDecisionLog(dlog), withConfig(func(c *server.Config) {
		c.DecisionLog.Path = "-"
		c.DecisionLog.Required = true
	})))
	_, s := openWatch(t, url, fixture(t, nil))
	require.Equal(t, "decision", s.next(t).kind)
	dlog.broken.Store(true)
	require.Equal(t, http.StatusServiceUnavailable, post(t, url+"/v1/authorize", fixture(t, nil)).status)
	rev := s.next(t)
	require.Equal(t, "revoke", rev.kind)
	require.Equal(t, false, rev.doc["allow"])
	require.Equal(t, []any{"decision_log_unavailable"}, rev.doc["reasons"])
	s.requireEnded(t)
}

// TestWatchesDoNotTakeTheConnections: parked watches give their connection slot back, so
// more watches than limits.maxConnections leave the service reachable; authz_watches_open
// counts them and returns to zero when they end.
func TestWatchesDoNotTakeTheConnections(t *testing.T) {
	facts := newChangingFacts(t)
	cfg := testConfig()
	cfg.Limits.MaxConnections = 4
	srv, err := server.New(cfg, testEngine(t), facts, server.Options{})
	require.NoError(t, err)
	url, _ := serve(t, srv)
	var streams []*sseStream
	for range 8 {
		resp, s := openWatch(t, url, fixture(t, nil))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "decision", s.next(t).kind)
		streams = append(streams, s)
	}
	metrics := func() string {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(url + "/metrics")
		require.NoError(t, err, "the service answers beside 8 watches and a cap of 4 connections")
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	require.Contains(t, metrics(), "authz_watches_open 8\n")
	facts.kill()
	for _, s := range streams {
		require.Equal(t, "revoke", s.next(t).kind)
		s.requireEnded(t)
	}
	require.Eventually(t, func() bool { return strings.Contains(metrics(), "authz_watches_open 0\n") }, 10*time.Second, 10*time.Millisecond)
}

// TestWatchRevokedWhenItsTokenIsRevoked: a watch keeps the access it was opened with no longer
// than its token: the tokens file re-read without the token (SIGHUP: Reload) revokes the
// watch (access_revoked); a watch whose token stays keeps its grant.
func TestWatchRevokedWhenItsTokenIsRevoked(t *testing.T) {
	path := writeTokens(t, decideToken+" decide\n"+bothToken+" decide,inspect\n")
	s := newServer(t, withFacts(newChangingFacts(t)), withConfig(func(c *server.Config) {
		c.Authentication.Mode = server.AuthToken
		c.Authentication.TokensFile = path
		c.Watch.PingInterval = 20 * time.Millisecond
	}))
	url := startHTTP(t, s)
	_, revoked := openWatchWith(t, url, fixture(t, nil), bearer(decideToken))
	require.Equal(t, "decision", revoked.next(t).kind)
	_, kept := openWatchWith(t, url, fixture(t, nil), bearer(bothToken))
	require.Equal(t, "decision", kept.next(t).kind)

	require.NoError(t, os.WriteFile(path, []byte(bothToken+" decide,inspect\n"), 0o600))
	require.NoError(t, s.Reload())
	rev := revoked.next(t)
	require.Equal(t, "revoke", rev.kind)
	require.Equal(t, false, rev.doc["allow"])
	require.Equal(t, []any{"access_revoked"}, rev.doc["reasons"])
	revoked.requireEnded(t)

	pings := kept.pings.Load()
	require.Eventually(t, func() bool { return kept.pings.Load() > pings+2 }, 10*time.Second, 5*time.Millisecond, "the other watch stays open")
	select {
	case ev := <-kept.events:
		t.Fatalf("the watch whose token stays got %v", ev)
	default:
	}
}
