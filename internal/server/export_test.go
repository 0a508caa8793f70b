package server

import "net/http"

// Handler is the HTTP API without a listener, for the tests of this package.
func (s *Server) Handler() http.Handler { return s.handler }

// ReadingHeld is the number of reading places held.
func (s *Server) ReadingHeld() int {
	s.admit.reading.mu.Lock()
	defer s.admit.reading.mu.Unlock()
	return s.admit.reading.held
}

// WatchesOpen is the number of open watches.
func (s *Server) WatchesOpen() int { return s.watches.Open() }

// RecordFaces has a recording double see every call of s's pipeline: what it returns lists the
// calls the pipeline was asked, "Decide /v1/authorize", "Redecide", ..., in order.
func (s *Server) RecordFaces() func() []string {
	d := &facesDouble{}
	s.pipe.Observe(d.note)
	return d.calls
}
