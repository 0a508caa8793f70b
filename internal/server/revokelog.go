package server

import (
	"context"
	"net/http"
	"sync"
	"time"
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

// revokeRecord is one revoke to record: its line and the request it answers.
type revokeRecord struct {
	entry logEntry
	req   *http.Request
	at    time.Time
}

// revokeLogQueue bounds the lines waiting to be written (about 2 KiB each with their input).
const revokeLogQueue = 16384

func newRevokeLog(s *Server) *revokeLog {
	l := &revokeLog{s: s}
	l.idle = sync.NewCond(&l.mu)
	return l
}

// add records e later; it reports false when the queue is full (the caller records it).
func (l *revokeLog) add(r *http.Request, at time.Time, e logEntry) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) >= revokeLogQueue {
		return false
	}
	l.queue = append(l.queue, revokeRecord{entry: e, req: r, at: at})
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
		for _, rec := range batch {
			l.s.writeRevokeRecord(rec.req, rec.at, rec.entry)
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

// writeRevokeRecord writes a revoke's line to the decision log and OPA's. A line that cannot
// be written is counted and logged: the revoke it records denies already.
func (s *Server) writeRevokeRecord(r *http.Request, at time.Time, entry logEntry) {
	logErr := s.dlog.write(entry)
	s.logToOPA(context.WithoutCancel(r.Context()), r, at, entry)
	if logErr != nil {
		s.metrics.logFailures.Inc()
		s.log.Error("decision log line lost", "decision_id", entry.DecisionID, "watch_id", entry.WatchID, "error", logErr)
	}
}
