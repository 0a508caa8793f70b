package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// Two callers of the decide scope, told apart by their tokens.
const (
	attackerToken = "attacker-token-0123456789"
	honestToken   = "honest-token-0123456789"
)

// withTwoCallers authenticates with the two tokens above.
func withTwoCallers(t testing.TB) option {
	t.Helper()
	dir := t.TempDir()
	tokens := testutil.WriteFile(t, dir, "tokens", attackerToken+" decide\n"+honestToken+" decide\n")
	require.NoError(t, os.Chmod(tokens, 0o600))
	return withConfig(func(c *server.Config) {
		c.Authentication.Mode = server.AuthToken
		c.Authentication.TokensFile = tokens
	})
}

// postAs posts body to url with token.
func postAs(t testing.TB, url, token, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := testClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	return answer{status: resp.StatusCode, header: resp.Header, body: []byte(b.String())}
}

// slowBody opens a decision request as token whose body of 1,000 bytes comes one byte a
// second, until the test ends or the server answers.
func slowBody(t testing.TB, base, token string, wg *sync.WaitGroup) net.Conn {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = fmt.Fprintf(c, "POST /v1/authorize HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", addr, token)
	require.NoError(t, err)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for range tick.C {
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	return c
}

// TestSlowBodiesOfOneCallerCannotShutOutAnother: 32 bodies sent one byte a second by one
// caller hold every reading place (limits.maxReading); another caller's requests are all
// answered 200: the greedy caller's newest body is cut (answered 503) to make room, and no
// honest request waits limits.queueWait for a 503 of its own.
func TestSlowBodiesOfOneCallerCannotShutOutAnother(t *testing.T) {
	t.Parallel()
	s := newServer(t, withTwoCallers(t), withConfig(func(c *server.Config) {
		c.Limits.QueueWait = time.Second
		c.Limits.MinBodyRate = 0 // the share alone is under test
		c.Limits.MaxReading = 32
	}))
	base := startHTTP(t, s)
	var wg sync.WaitGroup
	var conns []net.Conn
	for range 32 {
		conns = append(conns, slowBody(t, base, attackerToken, &wg))
	}
	require.Eventually(t, func() bool { return s.ReadingHeld() == 32 }, 10*time.Second, 10*time.Millisecond, "the slow bodies hold every place")

	body := fixture(t, nil)
	for i := range 14 {
		a := postAs(t, base+"/v1/authorize", honestToken, body)
		require.Equal(t, http.StatusOK, a.status, "honest request %d: %s", i, a.body)
	}
	// The greedy caller's bodies that were cut were answered 503, and the connections closed.
	var mu sync.Mutex
	cut := 0
	var readers sync.WaitGroup
	for _, c := range conns {
		readers.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return
			}
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode == http.StatusServiceUnavailable {
				cut++
			}
		})
	}
	readers.Wait()
	// One cut makes room for the honest caller, whose place is free again once answered.
	assert.GreaterOrEqual(t, cut, 1, "a body of the caller over its share was cut")
	assert.LessOrEqual(t, cut, 14, "no more bodies were cut than the honest caller needed places")
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
}

// TestSingleCallerKeepsEveryReadingPlace: a service with one caller (a sidecar behind a
// proxy) keeps its full capacity: none of its bodies is cut to make room for itself.
func TestSingleCallerKeepsEveryReadingPlace(t *testing.T) {
	t.Parallel()
	s := newServer(t, withConfig(func(c *server.Config) {
		c.Limits.MaxReading = 4
		c.Limits.MaxDeciding = 1
		c.Limits.QueueWait = 200 * time.Millisecond
		c.Limits.MinBodyRate = 0
	}))
	base := startHTTP(t, s)
	body := fixture(t, nil)
	var held []net.Conn
	var rests []string
	for range 4 {
		c, rest := startSlowRequest(t, base, body)
		held, rests = append(held, c), append(rests, rest)
	}
	require.Eventually(t, func() bool { return s.ReadingHeld() == 4 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, http.StatusServiceUnavailable, post(t, base+"/v1/authorize", body).status, "the one caller waits for its own places")
	for i, c := range held {
		_, err := c.Write([]byte(rests[i]))
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "none of its bodies was cut")
	}
}

// TestSlowBodyIsAnswered408: a body that comes slower than limits.minBodyRate once
// limits.bodyGrace has passed is cut and answered 408 REQUEST_TIMEOUT, its place given back,
// long before http.readTimeout.
func TestSlowBodyIsAnswered408(t *testing.T) {
	t.Parallel()
	s := newServer(t, withConfig(func(c *server.Config) {
		c.Limits.MinBodyRate = 1 << 10
		c.Limits.BodyGrace = 300 * time.Millisecond
	}))
	base := startHTTP(t, s)
	var wg sync.WaitGroup
	c := slowBody(t, base, "unused", &wg)
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode, string(b))
	assert.Equal(t, "REQUEST_TIMEOUT", resp.Header.Get("X-Authz-Error"))
	assert.Less(t, time.Since(start), 3*time.Second)
	require.Eventually(t, func() bool { return s.ReadingHeld() == 0 }, 5*time.Second, 10*time.Millisecond, "its place was given back")
	c.Close()
	wg.Wait()
	// An honest body is not concerned.
	assert.Equal(t, http.StatusOK, post(t, base+"/v1/authorize", fixture(t, nil)).status)
}

// slowDecider takes delay (nanoseconds, changed by the test) before each decision.
type slowDecider struct {
	server.Decider
	delay *atomic.Int64
}

func (d slowDecider) Decide(ctx context.Context, req *snapshot.Request, f snapshot.Facts) (decision.Document, snapshot.Input, error) {
	time.Sleep(time.Duration(d.delay.Load()))
	return d.Decider.Decide(ctx, req, f)
}

// authzenBatch is an evaluations request whose top level is the grant's, with items.
func authzenBatch(t testing.TB, items []any) string {
	t.Helper()
	reqJSON, _ := specexamples.NewFixture().JSON()
	grant := toAuthZEN(t, reqJSON)
	grant["evaluations"] = items
	return mustJSON(t, grant)
}

// distinctItems are n evaluations of n leases: n distinct decisions.
func distinctItems(n int) []any {
	items := make([]any, n)
	for i := range items {
		items[i] = map[string]any{"subject": map[string]any{"type": "lease", "id": fmt.Sprintf("lease-%d", i),
			"properties": map[string]any{"metadata": map[string]any{"driver": "local"}}}}
	}
	return items
}

// TestAuthZENBatchDecidesIdenticalEvaluationsOnce: 64 empty evaluations under the same
// top-level defaults are one decision, logged once with the number of items it answered; a
// batch of distinct and repeated items is as many decisions as distinct items.
func TestAuthZENBatchDecidesIdenticalEvaluationsOnce(t *testing.T) {
	t.Parallel()
	log := &lockedBuffer{}
	base := startHTTP(t, newServer(t, withDecisionLog(log)))
	items := make([]any, 64)
	for i := range items {
		items[i] = map[string]any{}
	}
	a := post(t, base+"/access/v1/evaluations", authzenBatch(t, items))
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	answers := a.json(t)["evaluations"].([]any)
	require.Len(t, answers, 64)
	first := answers[0].(map[string]any)["context"].(map[string]any)["decision_id"]
	for _, e := range answers {
		assert.Equal(t, true, e.(map[string]any)["decision"])
		assert.Equal(t, first, e.(map[string]any)["context"].(map[string]any)["decision_id"], "one decision answered every item")
	}
	lines := log.lines(t)
	require.Len(t, lines, 1, "decided and logged once")
	assert.Equal(t, first, lines[0]["decision_id"])
	assert.InDelta(t, 64, lines[0]["items"], 0, "the record says how many items it answered")

	// Three distinct evaluations, each asked twice: three decisions.
	mixed := append(distinctItems(3), distinctItems(3)...)
	a = post(t, base+"/access/v1/evaluations", authzenBatch(t, mixed))
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Len(t, a.json(t)["evaluations"].([]any), 6)
	lines = log.lines(t)
	require.Len(t, lines, 4)
	for _, l := range lines[1:] {
		assert.InDelta(t, 2, l["items"], 0)
	}
}

// TestAuthZENBatchTooLongIsRefusedUpFront: a batch whose distinct evaluations cannot be
// decided within half of http.writeTimeout at the observed decision time is answered 503 with
// Retry-After before any of them is decided; one that runs late (decisions slower than
// observed) is answered 503 as soon as it is late, never cut by the write time-out.
func TestAuthZENBatchTooLongIsRefusedUpFront(t *testing.T) {
	t.Parallel()
	var delay atomic.Int64
	log := &lockedBuffer{}
	s := newServer(t, withDecisionLog(log), withDecider(slowDecider{testEngine(t), &delay}), withConfig(func(c *server.Config) {
		c.HTTP.WriteTimeout = time.Second // half of it, 500 ms, is a batch's budget
	}))
	base := startHTTP(t, s)

	// Decisions observed at 100 ms: 20 distinct evaluations would take 2 s.
	delay.Store(int64(100 * time.Millisecond))
	require.Equal(t, http.StatusOK, post(t, base+"/v1/authorize", fixture(t, nil)).status)
	start := time.Now()
	a := post(t, base+"/access/v1/evaluations", authzenBatch(t, distinctItems(20)))
	assert.Less(t, time.Since(start), 500*time.Millisecond, "refused up front")
	require.Equal(t, http.StatusServiceUnavailable, a.status, string(a.body))
	assert.Equal(t, "SERVICE_OVERLOADED", a.json(t)["code"])
	assert.Contains(t, a.json(t)["message"], "20 distinct evaluations")
	assert.NotEmpty(t, a.header.Get("Retry-After"))
	assert.Len(t, log.lines(t), 1, "none of its evaluations was decided")

	// The same evaluation 20 times is one decision: within the budget.
	same := make([]any, 20)
	for i := range same {
		same[i] = map[string]any{}
	}
	require.Equal(t, http.StatusOK, post(t, base+"/access/v1/evaluations", authzenBatch(t, same)).status)

	// Observed fast, then slow: the batch is answered 503 once it is late, not at 10 × 150 ms.
	delay.Store(0)
	for range 40 {
		require.Equal(t, http.StatusOK, post(t, base+"/v1/authorize", fixture(t, nil)).status)
	}
	delay.Store(int64(150 * time.Millisecond))
	start = time.Now()
	a = post(t, base+"/access/v1/evaluations", authzenBatch(t, distinctItems(10)))
	require.Equal(t, http.StatusServiceUnavailable, a.status, string(a.body))
	assert.Contains(t, a.json(t)["message"], "ran late")
	assert.Less(t, time.Since(start), time.Second, "answered once late, within the write time-out")
}

// TestDecisionLogLineIsCapped: a decision's log line stays within decisionLog.maxLineBytes:
// the input's large members the contract does not define are cut first (named in "cut" and
// counted in authz_decision_log_cut_members_total) and the defined ones kept; the lines of an
// AuthZEN batch share the bound, so 16 distinct evaluations of one large body do not write it
// 16 times (each line alone may hold 64 KiB: 1 MiB unshared, for a body of ~600 KiB).
func TestDecisionLogLineIsCapped(t *testing.T) {
	t.Parallel()
	log := &lockedBuffer{}
	base := startHTTP(t, newServer(t, withDecisionLog(log)))
	junk := make([]any, 10)
	for i := range junk {
		junk[i] = strings.Repeat("x", 60<<10)
	}
	body := fixture(t, func(req map[string]any) { req["lease"].(map[string]any)["junk"] = junk })
	require.Greater(t, len(body), 600<<10)
	a := post(t, base+"/v1/authorize", body)
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	assert.Equal(t, true, a.json(t)["allow"], "the decision is the same")
	raw := log.String()
	assert.LessOrEqual(t, len(raw), 64<<10, "one line within decisionLog.maxLineBytes")
	lines := log.lines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, []any{"/input/lease/junk"}, lines[0]["cut"])
	lease := lines[0]["input"].(map[string]any)["lease"].(map[string]any)
	assert.Equal(t, "lease-1", lease["id"], "the defined members are kept")
	assert.NotNil(t, lease["metadata"])
	assert.Contains(t, string(get(t, base+"/metrics").body), "authz_decision_log_cut_members_total 1\n")

	// A batch: 16 distinct evaluations under top-level defaults carrying ~600 KiB (16, not more:
	// each is a full decision of that body, slow under the race detector on a loaded machine).
	reqJSON, _ := specexamples.NewFixture().JSON()
	grant := toAuthZEN(t, reqJSON)
	grant["resource"].(map[string]any)["properties"].(map[string]any)["junk"] = junk
	grant["evaluations"] = distinctItems(16)
	batch := mustJSON(t, grant)
	before := len(log.String())
	a = post(t, base+"/access/v1/evaluations", batch)
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Len(t, a.json(t)["evaluations"].([]any), 16)
	written := len(log.String()) - before
	assert.Less(t, written, len(batch)/2, "the batch's %d lines share the bound: %d bytes logged for a body of %d", 16, written, len(batch))
}

// grantWith is examples/grant.json with change applied.
func grantWith(t testing.TB, change func(req map[string]any)) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "grant.json"))
	require.NoError(t, err)
	if change == nil {
		return string(b)
	}
	var req map[string]any
	require.NoError(t, json.Unmarshal(b, &req))
	change(req)
	return mustJSON(t, req)
}

// TestOneCallerCannotLockOthersOutOfWatches: one caller's granted watches of ~1 MB bodies stop
// at its share of limits.maxWatchBytes (503 WATCH_LIMIT naming limits.maxWatchBytesPerCaller)
// instead of filling it: another caller's examples/grant.json watch still opens.
func TestOneCallerCannotLockOthersOutOfWatches(t *testing.T) {
	t.Parallel()
	// watches.maxBytes as it was by default (16 MiB): a caller's share holds four ~1 MB bodies.
	bytes16MiB := withConfig(func(c *server.Config) { c.Watch.MaxBytes = 16 << 20 })
	url := startHTTP(t, newServer(t, withTwoCallers(t), bytes16MiB, withFacts(staticFacts(t, "example-facts.json"))))
	attacker := map[string]string{"Authorization": "Bearer " + attackerToken}
	opened := 0
	var refusal watchAnswer
	for i := range 20 {
		body := grantWith(t, func(req map[string]any) {
			junk := make([]any, 15)
			for j := range junk {
				junk[j] = fmt.Sprintf("%d-%s", i, strings.Repeat("x", 60<<10))
			}
			req["lease"].(map[string]any)["junk"] = junk
		})
		require.Greater(t, len(body), 900<<10)
		a, s := openWatchWith(t, url, body, attacker)
		if a.StatusCode != http.StatusOK {
			refusal = a
			break
		}
		require.Equal(t, "decision", s.next(t).kind)
		opened++
	}
	require.Equal(t, http.StatusServiceUnavailable, refusal.StatusCode, "the caller's watches stop at its share")
	assert.Equal(t, "WATCH_LIMIT", refusal.Header.Get("X-Authz-Error"))
	assert.Contains(t, string(refusal.body), "limits.maxWatchBytesPerCaller")
	assert.Equal(t, 4, opened, "a quarter of limits.maxWatchBytes (16 MiB) holds four bodies of ~1 MB")

	a, s := openWatchWith(t, url, grantWith(t, nil), map[string]string{"Authorization": "Bearer " + honestToken})
	require.Equal(t, http.StatusOK, a.StatusCode, "another caller's watch opens: %s", a.body)
	ev := s.next(t)
	require.Equal(t, "decision", ev.kind)
	assert.Equal(t, true, ev.doc["allow"])
}

// TestClosedWatchesFreeTheirPlacesAtOnce: 2,000 watches opened and closed by their clients, 100
// at a time under limits.maxWatches of 100: each close gives the place back when it arrives
// (the parked connection's peer close), not at the next ping (a minute away here), so every
// round opens all of its watches.
func TestClosedWatchesFreeTheirPlacesAtOnce(t *testing.T) {
	t.Parallel()
	srv, err := server.New(func() server.Config {
		c := testConfig()
		c.Limits.MaxWatches = 100
		c.Limits.MaxWatchesPerCaller = 100
		c.Watch.PingInterval = time.Minute
		return c
	}(), testEngine(t), staticFacts(t, "example-facts.json"), server.Options{})
	require.NoError(t, err)
	url, _ := serve(t, srv)
	body := grantWith(t, nil)
	addr := strings.TrimPrefix(url, "http://")
	request := fmt.Sprintf("POST /v1/authorize/watch HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body)
	for round := range 20 {
		conns := make([]net.Conn, 0, 100)
		for i := range 100 {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
			_, err = io.WriteString(c, request)
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil) //nolint:bodyclose // the stream is the connection, closed below
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "round %d, watch %d: %s", round, i, resp.Header.Get("X-Authz-Error"))
			conns = append(conns, c)
		}
		for _, c := range conns {
			c.Close()
		}
		require.Eventually(t, func() bool { return srv.WatchesOpen() == 0 }, 5*time.Second, 5*time.Millisecond,
			"round %d: the closed watches' places are given back", round)
	}
}

// TestSlowBodyIsAnswered408OverHTTP2: the minimum body rate holds per stream: on one HTTP/2
// connection, a stream whose body stalls is answered 408 after limits.bodyGrace while another
// stream of the same connection is decided.
func TestSlowBodyIsAnswered408OverHTTP2(t *testing.T) {
	t.Parallel()
	srv := newServer(t, withConfig(func(c *server.Config) {
		c.Limits.MinBodyRate = 1 << 10
		c.Limits.BodyGrace = 300 * time.Millisecond
	}))
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	client := ts.Client()

	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	go func() { _, _ = pw.Write([]byte("{")) }() // then nothing
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/authorize", pr)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	type result struct {
		resp *http.Response
		err  error
	}
	slow := make(chan result, 1)
	start := time.Now()
	go func() {
		resp, err := client.Do(req) //nolint:bodyclose // closed below
		slow <- result{resp, err}
	}()

	honest, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/authorize", strings.NewReader(fixture(t, nil)))
	require.NoError(t, err)
	honest.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(honest)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 2, resp.ProtoMajor)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the other stream is decided")

	r := <-slow
	require.NoError(t, r.err)
	defer r.resp.Body.Close()
	assert.Equal(t, 2, r.resp.ProtoMajor)
	assert.Equal(t, http.StatusRequestTimeout, r.resp.StatusCode)
	assert.Less(t, time.Since(start), 3*time.Second)
}

// gatedLog is a decision log whose writes wait while it is held.
type gatedLog struct {
	syncBuffer
	mu sync.RWMutex
}

func (l *gatedLog) Write(p []byte) (int, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.syncBuffer.Write(p)
}

// TestRevokeDoesNotWaitOnTheLog: a watch's revoke reaches its client while the decision log
// cannot be written (a revoke denies: it is recorded off the stream's writer), and its line is
// written once the log can be.
func TestRevokeDoesNotWaitOnTheLog(t *testing.T) {
	t.Parallel()
	facts := newChangingFacts(t)
	log := &gatedLog{}
	url := startHTTP(t, newServer(t, withFacts(facts), withDecisionLog(log)))
	resp, s := openWatch(t, url, fixture(t, nil))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "decision", s.next(t).kind)

	log.mu.Lock() // the log's writes wait from here
	held := true
	defer func() {
		if held {
			log.mu.Unlock()
		}
	}()
	facts.kill()
	require.Equal(t, "revoke", s.next(t).kind, "the revoke arrives while the log waits")
	s.requireEnded(t)
	assert.Len(t, log.lines(t), 1, "its line is not written yet")
	log.mu.Unlock()
	held = false
	require.Eventually(t, func() bool { return len(log.lines(t)) == 2 }, 10*time.Second, 5*time.Millisecond, "then it is")
	assert.Equal(t, resp.Header.Get("X-Authz-Watch-Id"), log.lines(t)[1]["watch_id"])
}

// TestHTTP2WatchesCountAtTheirCost: an HTTP/2 watch, served by its own handler, counts its
// goroutine and buffers (29 KiB) against limits.maxWatchBytes, which the memory bound covers;
// past it a new HTTP/2 watch is 503 WATCH_LIMIT naming HTTP/1.1, while HTTP/1.1 watches of the
// same request still open; a closed HTTP/2 watch gives its cost back.
func TestHTTP2WatchesCountAtTheirCost(t *testing.T) {
	t.Parallel()
	srv := newServer(t, withConfig(func(c *server.Config) {
		c.Limits.MaxWatchBytes = 64 << 10
		c.Limits.MaxWatchBytesPerCaller = 64 << 10 // one caller here: the service's limit is tested
	}))
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	body := fixture(t, nil)
	open := func(client *http.Client) (*http.Response, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/authorize/watch", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close(); cancel() })
		return resp, cancel
	}
	h2 := ts.Client()
	var cancels []context.CancelFunc
	for range 2 { // 2 × 29 KiB and the body: within 64 KiB
		resp, cancel := open(h2) //nolint:bodyclose // open closes it when the test ends
		require.Equal(t, 2, resp.ProtoMajor)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		cancels = append(cancels, cancel)
	}
	over, _ := open(h2) //nolint:bodyclose // open closes it when the test ends
	require.Equal(t, http.StatusServiceUnavailable, over.StatusCode)
	assert.Equal(t, "WATCH_LIMIT", over.Header.Get("X-Authz-Error"))
	b, err := io.ReadAll(over.Body)
	require.NoError(t, err)
	assert.Contains(t, string(b), "HTTP/1.1")

	// HTTP/1.1 watches of the same request cost its body, counted once.
	tlsConf := ts.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	tlsConf.NextProtos = []string{"http/1.1"}
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}}
	t.Cleanup(h1.CloseIdleConnections)
	for range 3 {
		resp, _ := open(h1) //nolint:bodyclose // open closes it when the test ends
		require.Equal(t, 1, resp.ProtoMajor)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}

	// A closed HTTP/2 watch gives its cost back.
	cancels[0]()
	require.Eventually(t, func() bool {
		resp, _ := open(h2) //nolint:bodyclose // open closes it when the test ends
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
}

// TestHTTP2WatchesCountInTheCallersShare: an HTTP/2 watch's cost (29 KiB) counts in its
// caller's share of watches.maxBytes too: one caller's HTTP/2 watches stop at its share (503
// WATCH_LIMIT naming watches.maxBytesPerCaller) instead of filling watches.maxBytes, and
// another caller's HTTP/2 watch still opens.
func TestHTTP2WatchesCountInTheCallersShare(t *testing.T) {
	t.Parallel()
	srv := newServer(t, withTwoCallers(t), withConfig(func(c *server.Config) {
		c.Limits.MaxWatchBytes = 128 << 10 // a caller's share: 32 KiB, one HTTP/2 watch
	}))
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	body := fixture(t, nil)
	open := func(token string) *http.Response {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/authorize/watch", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := ts.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close(); cancel() })
		require.Equal(t, 2, resp.ProtoMajor)
		return resp
	}
	opened := 0
	var over *http.Response
	for range 8 {
		resp := open(attackerToken) //nolint:bodyclose // open closes it when the test ends
		if resp.StatusCode != http.StatusOK {
			over = resp
			break
		}
		opened++
	}
	require.NotNil(t, over, "the caller's HTTP/2 watches stop at its share")
	assert.Equal(t, 1, opened, "a quarter of 128 KiB holds one HTTP/2 watch")
	assert.Equal(t, http.StatusServiceUnavailable, over.StatusCode)
	assert.Equal(t, "WATCH_LIMIT", over.Header.Get("X-Authz-Error"))
	b, err := io.ReadAll(over.Body)
	require.NoError(t, err)
	assert.Contains(t, string(b), "watches.maxBytesPerCaller")

	resp := open(honestToken) //nolint:bodyclose // open closes it when the test ends
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another caller's HTTP/2 watch opens")
}

// TestBodyUnfinishedAtTheReadTimeoutIs408: a body that comes faster than limits.minBodyRate but
// is not whole when http.readTimeout passes is answered 408 REQUEST_TIMEOUT naming the limit,
// not 400 with the connection's addresses.
func TestBodyUnfinishedAtTheReadTimeoutIs408(t *testing.T) {
	t.Parallel()
	srv, err := server.New(func() server.Config {
		c := testConfig()
		c.HTTP.ReadTimeout = time.Second
		return c
	}(), testEngine(t), staticFacts(t, "example-facts.json"), server.Options{})
	require.NoError(t, err)
	url, _ := serve(t, srv)
	addr := strings.TrimPrefix(url, "http://")
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = fmt.Fprintf(c, "POST /v1/authorize HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{", addr)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // 20 KB a second, five times limits.minBodyRate: 50 s for the whole body
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		chunk := []byte(strings.Repeat(" ", 1000))
		for range tick.C {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.Close()
	wg.Wait()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode, string(b))
	assert.Contains(t, string(b), "REQUEST_TIMEOUT")
	assert.Contains(t, string(b), "http.readTimeout")
	assert.NotContains(t, string(b), "127.0.0.1")
}

// costlyDecider takes slow before each decision of the lease costlyLease: a decision as costly
// as a 1 MiB body's (about a second measured).
type costlyDecider struct {
	server.Decider
	slow time.Duration
}

const costlyLease = "costly-lease"

func (d costlyDecider) Decide(ctx context.Context, req *snapshot.Request, f snapshot.Facts) (decision.Document, snapshot.Input, error) {
	if req.Lease["id"] == costlyLease {
		time.Sleep(d.slow)
	}
	return d.Decider.Decide(ctx, req, f)
}

// TestSlowDecisionsOfOneCallerCannotShutOutAnother: one caller keeps two costly decisions (800
// ms each) in flight under limits.maxDeciding 2 and a queueWait of 400 ms; it never holds both
// deciding places while another caller decides, so none of the other caller's requests waits
// behind them for a 503.
func TestSlowDecisionsOfOneCallerCannotShutOutAnother(t *testing.T) {
	t.Parallel()
	url := startHTTP(t, newServer(t, withTwoCallers(t), withDecider(costlyDecider{testEngine(t), 800 * time.Millisecond}),
		withConfig(func(c *server.Config) {
			c.Limits.MaxDeciding = 2
			c.Limits.QueueWait = 400 * time.Millisecond
		})))
	costly := grantWith(t, func(req map[string]any) { req["lease"].(map[string]any)["id"] = costlyLease })
	honest := grantWith(t, nil)
	require.Equal(t, http.StatusOK, postAs(t, url+"/v1/authorize", honestToken, honest).status)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var costlyDecided atomic.Int64
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/authorize", strings.NewReader(costly))
				if err != nil {
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+attackerToken)
				resp, err := testClient.Do(req)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					costlyDecided.Add(1)
				}
			}
		}()
	}
	statuses := map[int]int{}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		statuses[postAs(t, url+"/v1/authorize", honestToken, honest).status]++
	}
	close(stop)
	wg.Wait()
	assert.GreaterOrEqual(t, costlyDecided.Load(), int64(3), "the costly decisions were made")
	assert.Equal(t, 0, statuses[http.StatusServiceUnavailable], "the other caller's answers: %v", statuses)
	assert.Positive(t, statuses[http.StatusOK])
}
