package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// connLimit caps the connections a listener hands out. At the cap it closes an idle
// connection (no request in progress: a keep-alive connection first, else one that has sent
// nothing for newConnGrace) to make room; when none is idle, Accept waits, and new
// connections wait in the kernel's accept queue, where they hold no descriptor of this
// process.
//
// Accept errors that pass (too many open files, an aborted connection) are retried with
// back-off and logged at most once a second, with the number of errors in between.
type connLimit struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	log   hclog.Logger

	mu   sync.Mutex
	idle map[net.Conn]idleConn // connections without a request in progress

	closeOnce  sync.Once
	lastLogged time.Time
	suppressed int
}

func newConnLimit(ln net.Listener, max int, log hclog.Logger) *connLimit {
	return &connLimit{
		Listener: ln,
		slots:    make(chan struct{}, max),
		done:     make(chan struct{}),
		log:      log,
		idle:     map[net.Conn]idleConn{},
	}
}

func (l *connLimit) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		if err := l.acquire(); err != nil {
			return nil, err
		}
		c, err := l.Listener.Accept()
		if err == nil {
			return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
		}
		<-l.slots
		if !retryableAcceptError(err) {
			return nil, err
		}
		backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
		l.logAcceptError(err, backoff)
		select {
		case <-time.After(backoff):
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

// acquire takes a connection slot. When there is none, it closes the oldest idle keep-alive
// connection, or else the oldest connection that has sent nothing for newConnGrace, and
// waits for the slot that frees.
func (l *connLimit) acquire() error {
	for {
		select {
		case l.slots <- struct{}{}:
			return nil
		default:
		}
		l.evictOldestIdle()
		t := time.NewTimer(newConnGrace / 4)
		select {
		case l.slots <- struct{}{}:
			t.Stop()
			return nil
		case <-l.done:
			t.Stop()
			return net.ErrClosed
		case <-t.C:
		}
	}
}

// newConnGrace is how long a new connection may stay silent before it can be closed to make
// room: a client sends its request right after connecting, and its bytes may not have been
// read yet.
const newConnGrace = 250 * time.Millisecond

type idleConn struct {
	since time.Time
	fresh bool // has not sent a request yet
}

func (l *connLimit) evictOldestIdle() {
	now := time.Now()
	l.mu.Lock()
	var victim net.Conn
	var vi idleConn
	for c, i := range l.idle {
		if i.fresh && now.Sub(i.since) < newConnGrace {
			continue
		}
		// Keep-alive connections go first, then the oldest.
		if victim == nil || (vi.fresh && !i.fresh) || (vi.fresh == i.fresh && i.since.Before(vi.since)) {
			victim, vi = c, i
		}
	}
	delete(l.idle, victim)
	l.mu.Unlock()
	if victim != nil {
		l.log.Debug("connection limit reached: closing an idle connection", "remote", victim.RemoteAddr(), "idle", now.Sub(vi.since))
		_ = victim.Close()
	}
}

// connState is the http.Server's ConnState hook: it tracks which connections are idle.
func (l *connLimit) connState(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateNew:
		l.idle[c] = idleConn{since: time.Now(), fresh: true}
	case http.StateIdle:
		l.idle[c] = idleConn{since: time.Now()}
	default:
		delete(l.idle, c)
	}
}

func (l *connLimit) logAcceptError(err error, retry time.Duration) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.lastLogged) < time.Second {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.lastLogged, l.suppressed = now, 0
	l.mu.Unlock()
	l.log.Warn("accepting a connection failed; retrying", "error", err, "retry_in", retry, "errors_not_logged", n)
}

func (l *connLimit) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// retryableAcceptError reports whether an Accept error passes: descriptors or memory run
// out for a while, or a client gave up before it was accepted.
func retryableAcceptError(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// limitedConn gives its slot back when closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// detach gives the connection's slot back while the connection stays open: a watch's stream
// taken over from net/http is counted by watches.max, not limits.maxConnections, so that
// watches never take the connections other requests need.
func (c *limitedConn) detach() { c.once.Do(c.release) }

// connectionCap is the connection cap for this process: the configured maximum, lowered so
// that reserve descriptors stay free under the process's descriptor limit (RLIMIT_NOFILE)
// besides those already open. It is an error when not even one connection fits.
func connectionCap(configured, reserve int) (int, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return configured, nil //nolint:nilerr // no limit to read: the configured maximum stands
	}
	open := openDescriptors()
	avail := int64(rl.Cur) - int64(open) - int64(reserve)
	if avail < 1 {
		return 0, fmt.Errorf("limits.fdReserve: the descriptor limit (RLIMIT_NOFILE %d, %d open) leaves no room for connections "+
			"besides the %d reserved: raise it (ulimit -n) or lower limits.fdReserve", rl.Cur, open, reserve)
	}
	return int(min(int64(configured), avail)), nil
}

// openDescriptors counts this process's open file descriptors (0 where /proc is not there).
func openDescriptors() int {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0
	}
	return len(names)
}
