//go:build unix

package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/sandbox"
	"github.com/authz-dev/authz/internal/testdrivers/bounds"
	"github.com/authz-dev/authz/internal/testdrivers/faults"
	"github.com/authz-dev/authz/internal/testdrivers/identity"
	"github.com/authz-dev/authz/internal/testdrivers/liveness"
	"github.com/authz-dev/authz/internal/testutil"
)

// asDriver is the first argument that makes the test driver (driverBinary) or the test binary
// run as the driver of internal/testdrivers/faults: the example driver, misbehaving as its flags
// say. The host starts drivers without the parent's environment (SkipHostEnv), so the marker
// travels as an argument, not as an environment variable.
const asDriver = faults.Marker

// asFailingDriver (testdriver.FailingMarker) makes the test driver a driver that says on stderr why it cannot start and
// exits 3 (drivers run from a sealed copy of their bytes, so a #! script cannot serve here).
const asFailingDriver = "--as-failing-driver"

// asBoundsDriver (testdriver.BoundsMarker) makes the test driver run as the hostile driver of internal/testdrivers/bounds.
const asBoundsDriver = "--as-bounds-driver"

func TestMain(m *testing.M) {
	sandbox.Init()
	if len(os.Args) > 1 && os.Args[1] == asDriver {
		os.Exit(faults.Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == asFailingDriver {
		fmt.Fprintln(os.Stderr, "acme driver: DAYTONA_API_URL is not set")
		fmt.Fprintln(os.Stderr, "[DEBUG] chatter")
		os.Exit(3)
	}
	if len(os.Args) > 1 && os.Args[1] == asBoundsDriver {
		os.Exit(bounds.Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == identity.Marker {
		os.Exit(identity.Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == liveness.Marker {
		os.Exit(liveness.Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == asHost {
		os.Exit(runAsHost(os.Args[2:]))
	}
	// The fixture drivers read and write the tests' temporary files; the sandbox tests run
	// their hosts in child processes, without this.
	fixtureWritePaths = []string{os.TempDir()}
	goleak.VerifyTestMain(removeDriverAfter{m})
}

// removeDriverAfter removes the driver program built by driverBinary once the tests ran.
type removeDriverAfter struct{ m *testing.M }

func (r removeDriverAfter) Run() int {
	code := r.m.Run()
	// The parallel tests check their own hosts' workers; no test may leave any child process.
	deadline := time.Now().Add(10 * time.Second)
	for len(childPids()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if left := childPids(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "child processes left after the tests:\n%s", describeProcesses(left))
		code = 1
	}
	if drv.path != "" {
		_ = os.RemoveAll(filepath.Dir(drv.path))
	}
	return code
}

var drv struct {
	once sync.Once
	path string
	sum  string
	err  error
}

// driverBinary returns the absolute path of the test-driver program (every driver of
// internal/testdrivers, chosen by its first argument) and its hex SHA-256. It is built once per
// test binary, on first use.
func driverBinary(tb testing.TB) (path, sum string) {
	tb.Helper()
	drv.once.Do(func() {
		p, err := testutil.BuildTestDriver(os.TempDir())
		if err != nil {
			drv.err = err
			return
		}
		drv.sum, drv.err = FileSHA256(p)
		drv.path = p
	})
	require.NoError(tb, drv.err)
	return drv.path, drv.sum
}

// fixtureUser is the user of the test drivers below: they read and write the tests' private
// files (state directories, pid files, impostor binaries), so a root test host runs them as
// root, explicitly. The containment tests (contain_linux_test.go) run drivers as the product
// does by default.
func fixtureUser() string {
	if os.Getuid() == 0 {
		return "root"
	}
	return ""
}

// driverPlugin configures the test driver as the example driver with extra flags.
func driverPlugin(tb testing.TB, id string, flags ...string) PluginConfig {
	tb.Helper()
	path, sum := driverBinary(tb)
	return PluginConfig{ID: id, Path: path, SHA256: sum, Args: append([]string{asDriver}, flags...), User: fixtureUser()}
}

// boundsPlugin configures the test driver as the hostile driver of internal/testdrivers/bounds.
func boundsPlugin(tb testing.TB, id string, flags ...string) PluginConfig {
	tb.Helper()
	path, sum := driverBinary(tb)
	return PluginConfig{ID: id, Path: path, SHA256: sum, Args: append([]string{asBoundsDriver}, flags...), User: fixtureUser()}
}

// identityPlugin configures the test driver as a hostile identity driver (serve mode). Each
// plugin reports its own key (test.identity.<id>), since the host refuses a key another plugin
// reports; a -key among flags comes later and wins.
func identityPlugin(tb testing.TB, id string, flags ...string) PluginConfig {
	tb.Helper()
	path, sum := driverBinary(tb)
	args := append([]string{identity.Marker, "serve", "-key", "test.identity." + id}, flags...)
	return PluginConfig{ID: id, Path: path, SHA256: sum, Args: args, User: fixtureUser()}
}

// testConfig is a configuration with short back-offs for tests.
func testConfig(tb testing.TB, plugins ...PluginConfig) Config {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.Plugins = plugins
	cfg.StartTimeout = 20 * time.Second // race-instrumented test binaries start slowly on 2 cores
	cfg.ConfigCheckTimeout = 5 * time.Second
	cfg.MinBackoff = 20 * time.Millisecond
	cfg.MaxBackoff = 200 * time.Millisecond
	// A health check answered late on a loaded machine would restart a healthy worker; the
	// liveness tests set the production defaults themselves.
	cfg.Health.Timeout = 5 * time.Second
	cfg.Logger = testLogger(tb, nil)
	return cfg
}

// testLogger logs to the test log (and to extra, when given) until the test ends.
// AUTHZ_TEST_LOG_LEVEL sets the level (default info).
func testLogger(tb testing.TB, extra io.Writer) hclog.Logger {
	tb.Helper()
	w := &tbWriter{tb: tb, extra: extra}
	tb.Cleanup(w.stop) // registered first, so it runs after every later cleanup
	level := hclog.LevelFromString(os.Getenv("AUTHZ_TEST_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{Name: "pluginhost", Level: level, Output: w})
}

type tbWriter struct {
	mu      sync.Mutex
	tb      testing.TB
	extra   io.Writer
	stopped bool
}

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.extra != nil {
		_, _ = w.extra.Write(p)
	}
	if !w.stopped {
		w.tb.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *tbWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
}

// pidRecorder remembers every worker pid a test saw, to check that Close leaves none behind.
type pidRecorder struct {
	mu   sync.Mutex
	pids map[int]bool
}

func (r *pidRecorder) record(h *Host) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range h.Plugins() {
		if p.Worker != nil {
			r.pids[p.Worker.PID] = true
		}
	}
}

// parallelTests holds the names of the tests that run in parallel (runParallel).
var parallelTests sync.Map

// runParallel runs the test in parallel with the other parallel tests of the package. Only a
// test whose hosts, drivers and files are its own may: one that counts what the whole process
// holds (child processes, zombies, goroutines, descriptors, memory, sealed copies), starts
// drivers with a dynamic uid or reads the process-wide containment set-up stays sequential.
// The sequential tests run first, so their process-wide checks never see a parallel test's
// host; the parallel tests' leftovers are checked per host, and for the whole process once all
// tests ran (TestMain).
func runParallel(t *testing.T) {
	t.Helper()
	parallelTests.Store(t.Name(), true)
	t.Parallel()
}

// isParallel reports whether tb is a parallel test or a subtest of one.
func isParallel(tb testing.TB) bool {
	for name := tb.Name(); ; {
		if _, ok := parallelTests.Load(name); ok {
			return true
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return false
		}
		name = name[:i]
	}
}

// startHost starts a host and, when the test ends, closes it and checks that no worker process
// it saw is left behind; in a sequential test, also that the process has no child process and
// no goroutine left.
func startHost(tb testing.TB, cfg Config) (*Host, *pidRecorder) {
	tb.Helper()
	h, err := New(cfg)
	require.NoError(tb, err)
	rec := &pidRecorder{pids: map[int]bool{}}
	tb.Cleanup(func() {
		rec.record(h)
		start := time.Now()
		require.NoError(tb, h.Close())
		tb.Logf("Close took %s", time.Since(start))
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for pid := range rec.pids {
			require.Falsef(tb, processExists(pid), "worker pid %d still exists after Close", pid)
		}
		if isParallel(tb) {
			return
		}
		if left := childProcesses(tb); len(left) > 0 {
			require.Failf(tb, "child processes left after Close", "%s", describeProcesses(left))
		}
		goleak.VerifyNone(tb)
	})
	require.NoError(tb, h.Start(tb.Context()))
	return h, rec
}

// processExists reports whether pid exists (a zombie counts: it was not reaped).
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// describeProcesses says what each process is (its stat line and command line), for failures.
func describeProcesses(pids []int) string {
	var b strings.Builder
	for _, pid := range pids {
		stat, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		fmt.Fprintf(&b, "pid %d: %s; cmdline %q\n", pid, strings.TrimSpace(string(stat)), strings.ReplaceAll(string(cmd), "\x00", " "))
	}
	return b.String()
}

// waitFor polls cond every millisecond until it holds or timeout passes, and returns how long
// it took.
func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// waitStarted waits (bounded) until every enabled plugin was ready once.
func waitStarted(tb testing.TB, h *Host, rec *pidRecorder) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 60*time.Second)
	defer cancel()
	require.NoError(tb, h.WaitStarted(ctx))
	rec.record(h)
}

// state returns the plugin's state.
func state(tb testing.TB, h *Host, id string) api.PluginState {
	tb.Helper()
	for _, p := range h.Plugins() {
		if p.ID == id {
			return p
		}
	}
	tb.Fatalf("no plugin %q", id)
	return api.PluginState{}
}
