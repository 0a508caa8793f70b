// Package testutil holds the helpers that the tests of several packages share. Only test files
// import it, so nothing here reaches the shipped binary.
package testutil

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
	return decodeAnswer(tb, resp)
}

// GetJSON gets url and returns the status and the decoded JSON object of the answer.
func GetJSON(tb testing.TB, c *http.Client, url string) (int, map[string]any) {
	tb.Helper()
	resp, err := c.Get(url)
	require.NoError(tb, err)
	return decodeAnswer(tb, resp)
}

func decodeAnswer(tb testing.TB, resp *http.Response) (int, map[string]any) {
	tb.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	var m map[string]any
	require.NoError(tb, json.Unmarshal(body, &m), "status %d, body %s", resp.StatusCode, body)
	return resp.StatusCode, m
}

// WaitReady waits up to timeout for GET base/health/ready to answer 200; log is shown when it
// does not.
func WaitReady(tb testing.TB, c *http.Client, base string, timeout time.Duration, log fmt.Stringer) {
	tb.Helper()
	WaitOK(tb, c, base+"/health/ready", timeout, log)
}

// WaitOK waits up to timeout for GET url to answer 200; log is shown when it does not.
func WaitOK(tb testing.TB, c *http.Client, url string, timeout time.Duration, log fmt.Stringer) {
	tb.Helper()
	require.Eventually(tb, func() bool {
		resp, err := c.Get(url)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, timeout, 50*time.Millisecond, "%s never answered 200; log:\n%s", url, log)
}

// AssertLogOrder checks that each message appears in log, in this order.
func AssertLogOrder(tb testing.TB, log string, messages ...string) {
	tb.Helper()
	at := 0
	for _, m := range messages {
		i := strings.Index(log[at:], m)
		if !assert.GreaterOrEqual(tb, i, 0, "%q should come after the messages before it; log:\n%s", m, log) {
			return
		}
		at += i + len(m)
	}
}

// WriteFile writes content to dir/name (name may hold directories, made as needed) and returns
// its path.
func WriteFile(tb testing.TB, dir, name, content string) string {
	tb.Helper()
	p := filepath.Join(dir, name)
	require.NoError(tb, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(tb, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// CopyWithTrailer copies the program src to dir/name with trailer appended: the same program
// under another pin. It returns the copy's path and hex SHA-256.
func CopyWithTrailer(tb testing.TB, src, dir, name, trailer string) (path, sum string) {
	tb.Helper()
	b, err := os.ReadFile(src)
	require.NoError(tb, err)
	b = append(b, trailer...)
	path = filepath.Join(dir, name)
	require.NoError(tb, os.WriteFile(path, b, 0o700))
	h := sha256.Sum256(b)
	return path, hex.EncodeToString(h[:])
}

// JSONObject is v as encoding/json writes and reads it back: plain maps, slices, strings,
// float64 numbers and booleans.
func JSONObject(tb testing.TB, v any) map[string]any {
	tb.Helper()
	b, err := json.Marshal(v)
	require.NoError(tb, err)
	var m map[string]any
	require.NoError(tb, json.Unmarshal(b, &m))
	return m
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

// SkipUnlessCI skips a test whose machine lacks what it needs (root, a user to run a host as, a
// writable cgroup hierarchy), and fails it under CI=true: CI provides every mechanism the
// containment tests need, so a skip there would hide a containment the service no longer gets.
func SkipUnlessCI(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true, where this test must run: "+format, args...)
	}
	t.Skipf(format, args...)
}
