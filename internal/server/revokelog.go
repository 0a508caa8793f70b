package server

import (
	"context"
	"sync"

	"github.com/authz-dev/authz/internal/pipeline"
)

// revokeLog records the watches' revokes in the decision log off the streams' writers: a
// revoke denies, so it may reach its client before its line is written (an update or a first
// decision, which may grant, is still recorded before it is sent, and a required log that
// fails still revokes every watch). So the fan-out of a revoke to many watches does not wait
// on the log file, one line at a time. The lines are written in order by one goroutine, while
// there are any; past revokeLogQueue waiting lines, a writer records its line itself.
type revokeLog struct {
	s *Server

	mu      sync.Mutex
	queue   []revokeRecord
	running bool
	idle    *sync.Cond // signalled when the queue is empty and the goroutine has ended
}

// revokeRecord is one revoke to record, with the context of the request it answers.
type revokeRecord struct {
	ctx context.Context //nolint:containedctx // the request's, kept (without its cancel) for the record written later
	rec pipeline.Record
}

// revokeLogQueue bounds the lines waiting to be written (about 2 KiB each with their input).
const revokeLogQueue = 16384

func newRevokeLog(s *Server) *revokeLog {
	l := &revokeLog{s: s}
	l.idle = sync.NewCond(&l.mu)
	return l
}

// add records rec later; it reports false when the queue is full (the caller records it).
func (l *revokeLog) add(ctx context.Context, rec pipeline.Record) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) >= revokeLogQueue {
		return false
	}
	l.queue = append(l.queue, revokeRecord{ctx: context.WithoutCancel(ctx), rec: rec})
	if !l.running {
		l.running = true
		go l.drain()
	}
	return true
}

func (l *revokeLog) drain() {
	for {
		l.mu.Lock()
		batch := l.queue
		l.queue = nil
		if len(batch) == 0 {
			l.running = false
			l.idle.Broadcast()
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		for _, r := range batch {
			// A line that cannot be written is counted and logged: the revoke it records
			// denies already.
			l.s.pipe.Event(r.ctx, r.rec, true)
		}
	}
}

// flush waits for the queued lines to be written.
func (l *revokeLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.running {
		l.idle.Wait()
	}
}
