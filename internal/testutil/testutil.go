// Package testutil holds the helpers that the tests of several packages share. Only test files
// import it, so nothing here reaches the shipped binary.
package testutil

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

// Ptr returns a pointer to a copy of v.
func Ptr[T any](v T) *T { return &v }

// RunUntilStopped runs run in a goroutine until the returned stop is called or the test ends.
// stop cancels run's context and returns run's error, or an error naming what when run has not
// returned within grace; it may be called more than once.
func RunUntilStopped(tb testing.TB, what string, grace time.Duration, run func(ctx context.Context) error) (stop func() error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(grace):
				err = fmt.Errorf("%s did not return within %s of its context ending", what, grace)
			}
		})
		return err
	}
	tb.Cleanup(func() { _ = stop() })
	return stop
}

// PostJSON posts body to url and returns the status and the decoded JSON object of the answer.
func PostJSON(tb testing.TB, c *http.Client, url, body string) (int, map[string]any) {
	tb.Helper()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	require.NoError(tb, err)
	defer resp.Body.Close()
	var m map[string]any
	require.NoError(tb, json.NewDecoder(resp.Body).Decode(&m))
	return resp.StatusCode, m
}

// WaitReady waits up to timeout for GET base/health/ready to answer 200; log is shown when it
// does not.
func WaitReady(tb testing.TB, c *http.Client, base string, timeout time.Duration, log fmt.Stringer) {
	tb.Helper()
	require.Eventually(tb, func() bool {
		resp, err := c.Get(base + "/health/ready")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, timeout, 50*time.Millisecond, "never ready; log:\n%s", log)
}

// DecodeOneJSON reports whether b is exactly one JSON value, and decodes it into v with
// numbers kept exact (UseNumber).
func DecodeOneJSON(b []byte, v *any) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if dec.Decode(v) != nil {
		return false
	}
	_, err := dec.Token()
	return errors.Is(err, io.EOF)
}

// Repeat calls f(0), f(1), … in each of n goroutines until f returns false or the returned stop
// is called; stop waits for every goroutine to return. The end of the test stops them too.
func Repeat(tb testing.TB, n int, f func(i int) bool) (stop func()) {
	tb.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if !f(i) {
					return
				}
			}
		})
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
	tb.Cleanup(stop)
	return stop
}
