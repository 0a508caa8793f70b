package server

import "net/http"

// Handler is the HTTP API without a listener, for the tests of this package.
func (s *Server) Handler() http.Handler { return s.handler }
