package server

import "sync"

// facesDouble records the calls of a pipeline (pipeline.Pipeline.Observe).
type facesDouble struct {
	mu   sync.Mutex
	seen []string
}

func (d *facesDouble) note(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen = append(d.seen, s)
}

func (d *facesDouble) calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.seen...)
}
