package server

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// scriptedListener returns errs from Accept, one per call, then connections from conns.
type scriptedListener struct {
	mu     sync.Mutex
	errs   []error
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newScriptedListener(errs ...error) *scriptedListener {
	return &scriptedListener{errs: errs, conns: make(chan net.Conn, 8), closed: make(chan struct{})}
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	l.mu.Unlock()
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *scriptedListener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *scriptedListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// TestConnLimitRetriesAcceptErrorsQuietly: a run of "too many open files" is retried with
// back-off and logged at most once a second, and the connection that follows is accepted.
func TestConnLimitRetriesAcceptErrorsQuietly(t *testing.T) {
	errs := make([]error, 8)
	for i := range errs {
		errs[i] = &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	inner := newScriptedListener(errs...)
	out := &testutil.SyncBuffer{}
	l := newConnLimit(inner, 4, hclog.New(&hclog.LoggerOptions{Output: out}))
	defer l.Close()
	a, b := net.Pipe()
	defer b.Close()
	inner.conns <- a

	start := time.Now()
	c, err := l.Accept()
	require.NoError(t, err)
	defer c.Close()
	assert.Less(t, time.Since(start), 5*time.Second)
	lines := strings.Count(out.String(), "accepting a connection failed")
	assert.GreaterOrEqual(t, lines, 1, "the errors are logged")
	assert.LessOrEqual(t, lines, int(time.Since(start)/time.Second)+1, "at most once a second:\n%s", out)
	assert.Contains(t, out.String(), "too many open files")

	// A permanent error ends Accept.
	inner.errs = []error{net.ErrClosed}
	_, err = l.Accept()
	assert.ErrorIs(t, err, net.ErrClosed)
}

// TestConnLimitClosesIdleConnectionAtTheCap: with the cap reached, a keep-alive connection is
// closed to make room at once; a silent new connection only after its grace period; a busy
// one never.
func TestConnLimitClosesIdleConnectionAtTheCap(t *testing.T) {
	inner := newScriptedListener()
	l := newConnLimit(inner, 2, hclog.NewNullLogger())
	defer l.Close()
	accept := func() net.Conn {
		t.Helper()
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		inner.conns <- a
		c, err := l.Accept()
		require.NoError(t, err)
		return c
	}
	busy := accept()
	l.connState(busy, http.StateActive)
	idle := accept()
	l.connState(idle, http.StateIdle)

	third := accept() // no slot: the idle keep-alive connection is closed for it
	_, err := idle.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.ErrClosedPipe, "the idle connection was closed")
	l.connState(third, http.StateNew)

	start := time.Now()
	accept() // no slot: the new connection is closed once its grace period is over
	assert.GreaterOrEqual(t, time.Since(start), newConnGrace)
	_, err = third.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.ErrClosedPipe, "the silent new connection was closed")
	require.NoError(t, busy.SetReadDeadline(time.Now()))
	_, err = busy.Read(make([]byte, 1))
	assert.NotErrorIs(t, err, io.ErrClosedPipe, "the busy connection is left alone")
}
