package server

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/watch"
)

// An open watch's stream costs, served by net/http, two goroutines (the handler and the
// connection's background reader: about 18 KiB of stacks) and the connection's buffers (about
// 10 KiB): 10,000 watches held 416 MiB. So the stream of an HTTP/1.x watch is taken over from
// net/http once its first event is written (the connection is hijacked, the handler returns)
// and parked: no goroutine of its own, no buffer; a few writers write the events of every
// parked stream as the hub leaves them, and one ticker sends the pings. A client that leaves is
// noticed when its close arrives (one poller for all: watchpoll_linux.go), else at the next
// write (a ping at the latest). HTTP/2 streams cannot be taken over and are
// served by their handler (stream in watch.go).

// parkedWriters write the events of the parked streams.
const parkedWriters = 4

// parkedWriteTimeout bounds one write to a parked stream: a client whose socket buffer is full
// (it reads nothing) is cut off, so that it never holds a writer for long.
const parkedWriteTimeout = 2 * time.Second

// parked are the watches whose streams were taken over from net/http.
type parked struct {
	s *Server

	mu      sync.Mutex
	all     map[*parkedStream]struct{}
	ready   []*parkedStream // streams with something to write, in order
	wake    *sync.Cond
	started bool
	closing bool
	stopped chan struct{} // closed when the writers and the ticker have ended
	wg      sync.WaitGroup
	empty   *sync.Cond // signalled when all becomes empty

	// The poller of the parked connections' closes (watchpoll_linux.go).
	pollFD   int // the epoll set, -1 before the first stream
	pollByFD map[int32]*parkedStream
	polling  bool
	pollWG   sync.WaitGroup
}

// parkedStream is one parked watch.
type parkedStream struct {
	conn    net.Conn
	ww      *watch.Watch
	watchID string
	req     *http.Request // what the decision log records of the request (its remote address)

	// guarded by parked.mu
	pollFD  int // the connection's descriptor in the poller's set, -1 when not in it
	queued  bool
	pingDue bool
	ended   bool
}

func newParked(s *Server) *parked {
	p := &parked{s: s, all: map[*parkedStream]struct{}{}, stopped: make(chan struct{}), pollFD: -1, pollByFD: map[int32]*parkedStream{}}
	p.wake = sync.NewCond(&p.mu)
	p.empty = sync.NewCond(&p.mu)
	return p
}

// park takes over the stream of ww from net/http: it writes the answer's head and the first
// event itself and returns true; false when the connection cannot be taken over (HTTP/2), the
// answer then still to be written by the handler.
func (p *parked) park(w http.ResponseWriter, r *http.Request, watchID string, first decision.Document, ww *watch.Watch) (parkedOK bool) {
	if r.ProtoMajor != 1 {
		return false
	}
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return false // the handler answers, and the revoke follows at once
	}
	p.mu.Unlock()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	if lc, ok := conn.(*limitedConn); ok {
		lc.detach()
	}
	var head bytes.Buffer
	head.WriteString("HTTP/1.1 200 OK\r\n")
	h := w.Header().Clone()
	p.s.watchHeaders(h, watchID)
	h.Set("Connection", "close") // the stream ends with the connection
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			fmt.Fprintf(&head, "%s: %s\r\n", k, v)
		}
	}
	head.WriteString("\r\n")
	head.Write(encodeEvent(watch.KindDecision, first, watchID))
	_ = conn.SetReadDeadline(time.Time{})
	_ = conn.SetWriteDeadline(time.Now().Add(parkedWriteTimeout))
	if _, err := conn.Write(head.Bytes()); err != nil {
		conn.Close()
		p.s.closeWatch(ww)
		return true // the client is gone; nothing more to answer
	}
	ps := &parkedStream{conn: conn, ww: ww, watchID: watchID, req: &http.Request{RemoteAddr: r.RemoteAddr}, pollFD: -1}
	p.mu.Lock()
	if p.closing {
		// Closed meanwhile: the hub has left the revoke; write it and end here.
		p.mu.Unlock()
		p.write(ps, false)
		p.s.closeWatch(ps.ww)
		ps.conn.Close()
		return true
	}
	if !p.started {
		p.started = true
		p.wg.Add(parkedWriters + 1)
		for range parkedWriters {
			go p.writer()
		}
		go p.pinger()
	}
	p.all[ps] = struct{}{}
	p.pollAddLocked(ps)
	p.mu.Unlock()
	ww.OnReady(func() { p.enqueue(ps, false) })
	return true
}

// enqueue hands ps to a writer (with a ping due, when ping).
func (p *parked) enqueue(ps *parkedStream, ping bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps.ended {
		return
	}
	if ping {
		ps.pingDue = true
	}
	if !ps.queued {
		ps.queued = true
		p.ready = append(p.ready, ps)
		p.wake.Signal()
	}
}

// writer writes what the ready streams have, until the parked streams are closed.
func (p *parked) writer() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		for len(p.ready) == 0 && (!p.closing || len(p.all) > 0) {
			p.wake.Wait()
		}
		if len(p.ready) == 0 {
			p.mu.Unlock()
			return
		}
		ps := p.ready[0]
		p.ready[0] = nil
		p.ready = p.ready[1:]
		ps.queued = false
		ping := ps.pingDue
		ps.pingDue = false
		p.mu.Unlock()
		p.write(ps, ping)
	}
}

// write sends ps's waiting events (or a ping); after the revoke, or when a write fails, the
// stream ends.
func (p *parked) write(ps *parkedStream, ping bool) {
	if p.s.sendEvents(ps, ps.req, ps.ww, ps.watchID, ping) {
		p.end(ps)
	}
}

// send writes b to the parked connection within parkedWriteTimeout.
func (ps *parkedStream) send(b []byte) bool {
	_ = ps.conn.SetWriteDeadline(time.Now().Add(parkedWriteTimeout))
	_, err := ps.conn.Write(b)
	return err == nil
}

// end closes ps's connection and forgets it.
func (p *parked) end(ps *parkedStream) {
	p.mu.Lock()
	if ps.ended {
		p.mu.Unlock()
		return
	}
	ps.ended = true
	delete(p.all, ps)
	p.pollRemoveLocked(ps)
	if len(p.all) == 0 {
		p.empty.Broadcast()
		if p.closing {
			p.wake.Broadcast() // the writers end
		}
	}
	p.mu.Unlock()
	p.s.closeWatch(ps.ww)
	// Closed off the writer: a close costs about as much as the write of the revoke, and
	// the other streams' revokes come first.
	go ps.conn.Close()
}

// pinger sends a ping on every parked stream each watches.pingInterval.
func (p *parked) pinger() {
	defer p.wg.Done()
	t := time.NewTicker(p.s.cfg.Watch.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-p.stopped:
			return
		}
		p.mu.Lock()
		list := make([]*parkedStream, 0, len(p.all))
		for ps := range p.all {
			list = append(list, ps)
		}
		p.mu.Unlock()
		for _, ps := range list {
			p.enqueue(ps, true)
		}
	}
}

// close waits, until ctx is done, for every parked stream to have written its last event (the
// hub was closed: each has its revoke), then cuts the others and stops the writers.
func (p *parked) close(ctx context.Context) {
	p.mu.Lock()
	p.closing = true
	started := p.started
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.empty.Broadcast()
		p.mu.Unlock()
	})
	for len(p.all) > 0 && ctx.Err() == nil {
		p.empty.Wait()
	}
	stop()
	left := make([]*parkedStream, 0, len(p.all))
	for ps := range p.all {
		left = append(left, ps)
	}
	p.mu.Unlock()
	for _, ps := range left {
		p.end(ps)
	}
	p.pollWG.Wait()
	p.mu.Lock()
	p.closePollLocked()
	p.mu.Unlock()
	if !started {
		return
	}
	select {
	case <-p.stopped:
		return // closed before
	default:
	}
	close(p.stopped)
	p.mu.Lock()
	p.wake.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

// watchHeaders sets the headers of a watch's answer.
func (s *Server) watchHeaders(h http.Header, watchID string) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // a proxy that buffers would hold the revoke back
	h.Set(headerWatchID, watchID)
	h.Set(headerPingInterval, strconv.FormatInt(s.cfg.Watch.PingInterval.Milliseconds(), 10))
}
