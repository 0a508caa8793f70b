package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// watcher is one open watch (POST /v1/authorize/watch) read by a goroutine of its own.
type watcher struct {
	first map[string]any // the decision event's data; set before openWatch returns

	mu     sync.Mutex
	kind   string         // the last event's kind
	last   map[string]any // the last event's data
	at     time.Time      // when the last event arrived
	events int
	ended  chan struct{} // closed when the stream ended
}

// lastEvent is the kind and data of the last event, and when it arrived.
func (w *watcher) lastEvent() (kind string, doc map[string]any, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kind, w.last, w.at
}

// watchClient opens watches, one connection each.
var watchClient = &http.Client{Transport: &http.Transport{
	MaxIdleConnsPerHost: -1,
	DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
}}

// openWatch opens one watch of body on base and returns once its first event arrived; the
// stream is read until it ends or ctx is done.
func openWatch(ctx context.Context, base, body string) (*watcher, error) {
	w := &watcher{ended: make(chan struct{})}
	firstc := make(chan error, 1)
	go func() {
		defer close(w.ended)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/authorize/watch", strings.NewReader(body))
		if err != nil {
			firstc <- err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := watchClient.Do(req)
		if err != nil {
			firstc <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			firstc <- fmt.Errorf("status %d", resp.StatusCode)
			return
		}
		sc := bufio.NewScanner(resp.Body)
		var kind string
		got := false
		for sc.Scan() {
			line := sc.Text()
			if k, ok := strings.CutPrefix(line, "event: "); ok {
				kind = k
				continue
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			now := time.Now()
			var doc map[string]any
			err := json.Unmarshal([]byte(data), &doc)
			if !got {
				got = true
				w.first = doc
				firstc <- err
			}
			w.mu.Lock()
			w.kind, w.last, w.at = kind, doc, now
			w.events++
			w.mu.Unlock()
		}
		if !got {
			firstc <- fmt.Errorf("the stream ended before its first event: %w", sc.Err())
		}
	}()
	select {
	case err := <-firstc:
		if err != nil {
			return nil, err
		}
		return w, nil
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("no first event within 60 s")
	}
}

// openWatches opens n watches of body on base, 64 at a time (as many clients would, not all in
// the same millisecond: the service answers a burst past its admission 503), and waits for
// each one's first event.
func openWatches(ctx context.Context, t testing.TB, base, body string, n int) []*watcher {
	t.Helper()
	ws := make([]*watcher, n)
	errs := make(chan error, n)
	slots := make(chan struct{}, 64)
	for i := range ws {
		go func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			var err error
			ws[i], err = openWatch(ctx, base, body)
			errs <- err
		}()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	return ws
}

// awaitRevokes waits until every watch has ended and returns the time from since to each
// revoke, sorted.
func awaitRevokes(t testing.TB, ws []*watcher, since time.Time) []time.Duration {
	t.Helper()
	var lat []time.Duration
	for _, w := range ws {
		select {
		case <-w.ended:
		case <-time.After(30 * time.Second):
			t.Fatal("a watch was still open 30 s after its grant was lost")
		}
		kind, last, at := w.lastEvent()
		require.Equal(t, "revoke", kind, "the last event: %v", last)
		require.Equal(t, false, last["allow"])
		require.NotEqual(t, w.first["decision_id"], last["decision_id"])
		lat = append(lat, at.Sub(since))
	}
	slices.Sort(lat)
	return lat
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

// watchCount is the number of watches the fan-out tests open: AUTHZ_WATCHES, 1000 by default.
func watchCount(t testing.TB) int {
	if v := os.Getenv("AUTHZ_WATCHES"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return 1000
}

// watchConfig is a configuration file whose limits admit n watches (a parked watch does not
// count against limits.maxConnections, which stays at its default), all of them from this one
// caller.
func watchConfig(t testing.TB, n int) string {
	return testutil.WriteFile(t, t.TempDir(), "config.yaml", fmt.Sprintf("limits:\n  maxWatches: %d\n  maxWatchesPerCaller: %d\n", max(n, 10000), max(n, 10000)))
}

// TestWatchRevokedWhenTheWorkerIsKilled: under n open watches of the example driver's grant,
// the driver's worker is SIGKILLed; every watch gets its revoke and ends. It prints the time
// from the kill to the revokes (BENCHMARKS.md, "Watches"), and the service's memory and CPU
// with the watches open.
func TestWatchRevokedWhenTheWorkerIsKilled(t *testing.T) {
	n := watchCount(t)
	proc := startServeProcess(t, "", "--addr", "127.0.0.1:0", "--config", watchConfig(t, n))
	base := "http://" + proc.addr
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 60*time.Second, proc.Stderr)
	grant, err := os.ReadFile(filepath.Join("..", "..", "examples", "grant.json"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rssBefore := procStatusKB(t, proc.Cmd.Process.Pid, "VmRSS")
	start := time.Now()
	ws := openWatches(ctx, t, base, string(grant), n)
	opened := time.Since(start)
	for _, w := range ws {
		require.Equal(t, true, w.first["allow"], "%v", w.first)
	}
	rss := procStatusKB(t, proc.Cmd.Process.Pid, "VmRSS")
	runtimeFigures := goRuntimeFigures(t, c, base)
	cpu0 := procCPU(t, proc.Cmd.Process.Pid)
	idle := time.Now()
	time.Sleep(2 * time.Second) // a figure of the idle service, not a synchronisation
	idleCPU := (procCPU(t, proc.Cmd.Process.Pid) - cpu0).Seconds() / time.Since(idle).Seconds()

	worker := onlyPlugin(t, c, base).Worker
	require.NotNil(t, worker)
	killed := time.Now()
	require.NoError(t, syscall.Kill(worker.PID, syscall.SIGKILL))
	lat := awaitRevokes(t, ws, killed)
	reasons := map[string]int{}
	for _, w := range ws {
		_, last, _ := w.lastEvent()
		rs, _ := last["reasons"].([]any)
		for _, r := range rs {
			reasons[fmt.Sprint(r)]++
		}
	}
	assert.Positive(t, reasons["worker_not_running"]+reasons["plugin_not_ready"], "reasons: %v", reasons)
	t.Logf("watches: %d opened in %v; service RSS %d MiB before, %d MiB with them open (%s); idle CPU %.1f%% of one core",
		n, opened.Round(time.Millisecond), rssBefore>>10, rss>>10, runtimeFigures, idleCPU*100)
	t.Logf("worker SIGKILL -> revoke: first %v, p50 %v, p99 %v, max %v (reasons %v)",
		lat[0].Round(time.Microsecond), percentile(lat, .5).Round(time.Microsecond), percentile(lat, .99).Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond), reasons)
}

// TestWatchRevokedWhenADenyAllBundleIsActivated: under n open watches, the bundle directory
// is replaced by a policy that allows nothing and SIGHUP activates it; every watch gets its
// revoke. It prints the time from the signal to the first and the last revoke.
func TestWatchRevokedWhenADenyAllBundleIsActivated(t *testing.T) {
	n := watchCount(t)
	dir := t.TempDir()
	copyPolicy(t, dir)
	proc := startServeProcess(t, "", "--addr", "127.0.0.1:0", "--config", watchConfig(t, n), "--bundle", dir)
	base := "http://" + proc.addr
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 60*time.Second, proc.Stderr)
	grant, err := os.ReadFile(filepath.Join("..", "..", "examples", "grant.json"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws := openWatches(ctx, t, base, string(grant), n)
	for _, w := range ws {
		require.Equal(t, true, w.first["allow"], "%v", w.first)
	}

	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	testutil.WriteFile(t, dir, "deny.rego", policytest.DenyAllModule)
	hup := time.Now()
	proc.Signal(t, syscall.SIGHUP)
	lat := awaitRevokes(t, ws, hup)
	for _, w := range ws {
		_, last, _ := w.lastEvent()
		assert.Equal(t, []any{"capability_not_declared"}, last["reasons"])
	}
	t.Logf("SIGHUP (bundle compiled and activated) -> revoke of %d watches: first %v, p50 %v, p99 %v, last %v (fan-out %v)",
		n, lat[0].Round(time.Microsecond), percentile(lat, .5).Round(time.Microsecond), percentile(lat, .99).Round(time.Microsecond),
		lat[len(lat)-1].Round(time.Microsecond), (lat[len(lat)-1] - lat[0]).Round(time.Microsecond))
}

// copyPolicy copies the embedded policy's Rego (tests left out) into dir, a bundle directory.
func copyPolicy(t testing.TB, dir string) {
	t.Helper()
	src := filepath.Join("..", "..", "policies")
	require.NoError(t, filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".rego") || strings.HasSuffix(path, "_test.rego") {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755))
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	}))
}

// procCPU is the CPU time the process has used (user and system), in clock ticks of 10 ms.
func procCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, err := strconv.ParseInt(f[11], 10, 64)
	require.NoError(t, err)
	stime, err := strconv.ParseInt(f[12], 10, 64)
	require.NoError(t, err)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// goRuntimeFigures are the service's heap and stack in use and its goroutines, from /metrics.
func goRuntimeFigures(t testing.TB, c *http.Client, base string) string {
	t.Helper()
	resp, err := c.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, name := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines"} {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				require.NoError(t, err)
				if strings.HasSuffix(name, "_bytes") {
					out = append(out, fmt.Sprintf("%s %.0f MiB", strings.TrimSuffix(strings.TrimPrefix(name, "go_memstats_"), "_bytes"), f/(1<<20)))
				} else {
					out = append(out, fmt.Sprintf("%s %.0f", strings.TrimPrefix(name, "go_"), f))
				}
			}
		}
	}
	return strings.Join(out, ", ")
}
