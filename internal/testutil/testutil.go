// Package testutil holds the helpers that the tests of several packages share. Only test files
// import it, so nothing here reaches the shipped binary.
package testutil

import (
	"bytes"
	"sync"
)

// SyncBuffer is a buffer that one goroutine writes (a process's output, a logger, a decision
// log) while a test reads it from another.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
