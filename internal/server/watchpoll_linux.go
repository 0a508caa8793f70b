package server

import (
	"crypto/tls"
	"net"
	"syscall"
)

// A client that closes a parked stream's connection gives its watch's place back as soon as
// the close arrives, not at the next ping that fails: one goroutine waits, in an epoll set of
// its own, for the peer's close (EPOLLRDHUP, or a reset) on every parked connection, while
// there are any. Nothing is read: a stream's client sends nothing after its request.

// pollWaitMS is how long the poller waits in one epoll_wait before it checks whether it is still
// needed.
const pollWaitMS = 200

// epollET is EPOLLET as the event mask it is (the syscall package writes it as a negative int).
const epollET = 1 << 31

// pollAddLocked watches ps's connection for its peer's close. Under p.mu.
func (p *parked) pollAddLocked(ps *parkedStream) {
	fd := connFD(ps.conn)
	if fd < 0 {
		return // not a socket of this process: the next write notices the close
	}
	if p.pollFD < 0 {
		epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		p.pollFD = epfd
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | epollET, Fd: int32(fd)}
	if err := syscall.EpollCtl(p.pollFD, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return
	}
	ps.pollFD = fd
	p.pollByFD[int32(fd)] = ps
	if !p.polling {
		p.polling = true
		p.pollWG.Add(1)
		go p.poll(p.pollFD)
	}
}

// pollRemoveLocked stops watching ps's connection, before it is closed (its descriptor may
// then be reused). Under p.mu.
func (p *parked) pollRemoveLocked(ps *parkedStream) {
	if ps.pollFD < 0 {
		return
	}
	_ = syscall.EpollCtl(p.pollFD, syscall.EPOLL_CTL_DEL, ps.pollFD, nil)
	delete(p.pollByFD, int32(ps.pollFD))
	ps.pollFD = -1
}

// poll ends the streams whose client closed its connection, while any are watched.
func (p *parked) poll(epfd int) {
	defer p.pollWG.Done()
	events := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(epfd, events, pollWaitMS)
		if err != nil && err != syscall.EINTR { //nolint:errorlint // a syscall.Errno, compared as the syscall package does
			n = 0
		}
		p.mu.Lock()
		if len(p.pollByFD) == 0 {
			p.polling = false
			p.mu.Unlock()
			return
		}
		var gone []*parkedStream
		for _, ev := range events[:max(n, 0)] {
			if ps := p.pollByFD[ev.Fd]; ps != nil && ev.Events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
				gone = append(gone, ps)
			}
		}
		p.mu.Unlock()
		for _, ps := range gone {
			p.end(ps)
		}
	}
}

// closePollLocked closes the epoll set once the poller has ended. Under p.mu.
func (p *parked) closePollLocked() {
	if p.pollFD >= 0 && !p.polling {
		_ = syscall.Close(p.pollFD)
		p.pollFD = -1
	}
}

// connFD is the descriptor of c's socket, -1 when it has none.
func connFD(c net.Conn) int {
	for {
		switch t := c.(type) {
		case *limitedConn:
			c = t.Conn
			continue
		case *tls.Conn:
			c = t.NetConn()
			continue
		}
		break
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	if err := raw.Control(func(d uintptr) { fd = int(d) }); err != nil {
		return -1
	}
	return fd
}
