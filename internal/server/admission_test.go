package server_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/server"
)

// startSlowRequest sends the headers of a decision request and part of its body, and returns
// the connection and the rest of the body.
func startSlowRequest(t testing.TB, base, body string) (net.Conn, string) {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	half := len(body) / 2
	_, err = fmt.Fprintf(c, "POST /v1/authorize HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body[:half])
	require.NoError(t, err)
	return c, body[half:]
}

// TestAdmissionBoundsRequestsInProgress: requests are admitted before their body is read.
// With every slot held by clients that send their bodies slowly, the next decision request
// waits limits.queueWait and is answered 503 SERVICE_OVERLOADED with Retry-After and a deny,
// while other endpoints still answer; once the slow requests are done, decisions are
// answered again.
func TestAdmissionBoundsRequestsInProgress(t *testing.T) {
	s := newServer(t, withConfig(func(c *server.Config) {
		c.Limits.MaxReading = 2
		c.Limits.MaxDeciding = 1
		c.Limits.QueueWait = 200 * time.Millisecond
	}))
	base := startHTTP(t, s)
	body := fixture(t, nil)

	type slow struct {
		conn net.Conn
		rest string
	}
	var held []slow
	for range 2 {
		c, rest := startSlowRequest(t, base, body)
		held = append(held, slow{c, rest})
	}
	// The slow requests were admitted: the next one finds no slot.
	require.Eventually(t, func() bool {
		return post(t, base+"/v1/authorize", body).status == http.StatusServiceUnavailable
	}, 10*time.Second, 50*time.Millisecond)

	start := time.Now()
	a := post(t, base+"/v1/authorize", body)
	waited := time.Since(start)
	require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
	m := a.json(t)
	assert.Equal(t, string(coded.Overloaded), m["code"])
	assert.Equal(t, false, m["allow"])
	assert.Equal(t, "1", a.header.Get("Retry-After"))
	assert.Equal(t, string(coded.Overloaded), a.header.Get("X-Authz-Error"))
	assert.GreaterOrEqual(t, waited, 200*time.Millisecond, "it waited for a slot first")
	assert.Equal(t, http.StatusOK, get(t, base+"/health").status, "other endpoints are not held up")

	for _, h := range held {
		_, err := h.conn.Write([]byte(h.rest))
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(h.conn), nil)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "the slow request was decided")
	}
	assert.Equal(t, http.StatusOK, post(t, base+"/v1/authorize", body).status)
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*server.Config)
		want   string
	}{
		{name: "no connections", change: func(c *server.Config) { c.Limits.MaxConnections = 0 }, want: "limits.maxConnections: must be a positive number"},
		{name: "small descriptor reserve", change: func(c *server.Config) { c.Limits.FDReserve = 3 }, want: "limits.fdReserve: must be at least 16"},
		{name: "no reading slots", change: func(c *server.Config) { c.Limits.MaxReading = 0 }, want: "limits.maxReading: must be a positive number"},
		{name: "more deciding than reading", change: func(c *server.Config) { c.Limits.MaxReading, c.Limits.MaxDeciding = 32, 40 }, want: "limits.maxDeciding: must not be more than limits.maxReading (32)"},
		{name: "no queue wait", change: func(c *server.Config) { c.Limits.QueueWait = 0 }, want: "limits.queueWait: must be a positive duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := server.DefaultConfig()
			tt.change(&c)
			assert.ErrorContains(t, c.Validate(), tt.want)
		})
	}
	assert.NoError(t, server.DefaultConfig().Validate())
}

// TestMemoryBound is the bound docs/service.md states for the default limits, and the soft
// memory limit below it that leaves the collector room.
func TestMemoryBound(t *testing.T) {
	c := server.DefaultConfig()
	assert.Equal(t, int64(192), c.MemoryLimit()>>20)
	assert.Equal(t, int64(256), c.MemoryBound()>>20)
	assert.LessOrEqual(t, c.MemoryBound(), int64(256<<20), "the defaults fit a 256 MiB container")
	c.MaxBodyBytes = 64 << 10
	assert.Equal(t, int64(138), c.MemoryBound()>>20, "a smaller body limit lowers the bound")
}

// TestDecodingIsAdmittedByBytes: the bodies decoded at once are at most maxBodyBytes in all.
// Two small requests are decided at once (maxDeciding 2); of two bodies of more than half the
// limit, the second waits for the first and, while the first is still deciding after
// limits.queueWait, is answered 503 SERVICE_OVERLOADED, though a deciding slot is free.
func TestDecodingIsAdmittedByBytes(t *testing.T) {
	d := blockingDecider{Decider: testEngine(t), entered: make(chan struct{}, 4), release: make(chan struct{})}
	s := newServer(t, withDecider(d), withConfig(func(c *server.Config) {
		c.MaxBodyBytes = 64 << 10
		c.Limits.MaxReading = 4
		c.Limits.MaxDeciding = 2
		c.Limits.QueueWait = 300 * time.Millisecond
	}))
	base := startHTTP(t, s)
	small := fixture(t, nil)
	large := fixture(t, func(req map[string]any) { metadata(req)["padding"] = strings.Repeat("x", 40<<10) })
	require.Greater(t, len(large), 32<<10)
	require.Less(t, len(large), 64<<10)

	send := func(body string) chan answer {
		ch := make(chan answer, 1)
		go func() { ch <- post(t, base+"/v1/authorize", body) }()
		return ch
	}
	entered := func() bool {
		select {
		case <-d.entered:
			return true
		case <-time.After(2 * time.Second):
			return false
		}
	}

	// Two small bodies: both are being decided at once.
	a1, a2 := send(small), send(small)
	require.True(t, entered(), "the first small request is deciding")
	require.True(t, entered(), "the second small request is deciding beside it")
	d.release <- struct{}{}
	d.release <- struct{}{}
	assert.Equal(t, http.StatusOK, (<-a1).status)
	assert.Equal(t, http.StatusOK, (<-a2).status)

	// Two large bodies: the second finds no room for its bytes while the first decides.
	l1 := send(large)
	require.True(t, entered(), "the first large request is deciding")
	l2 := send(large)
	select {
	case a := <-l2:
		assert.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
		assert.Equal(t, string(coded.Overloaded), a.header.Get("X-Authz-Error"))
	case <-d.entered:
		d.release <- struct{}{}
		d.release <- struct{}{}
		<-l1
		<-l2
		t.Fatal("the second large body was decoded beside the first")
	case <-time.After(10 * time.Second):
		t.Fatal("the second large body was not answered")
	}
	d.release <- struct{}{}
	assert.Equal(t, http.StatusOK, (<-l1).status)

	// Its bytes given back, a large body is decided again.
	l3 := send(large)
	require.True(t, entered())
	d.release <- struct{}{}
	assert.Equal(t, http.StatusOK, (<-l3).status)
}
