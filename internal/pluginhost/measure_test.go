//go:build unix

package pluginhost

import (
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
)

// BenchmarkPluginStart measures one plugin's start: pin check, process start, go-plugin
// handshake with AutoMTLS, Describe and SupportedMethods; and the Close that follows. The driver
// is this test binary (race-instrumented under -race, which slows its start and its exit).
func BenchmarkPluginStart(b *testing.B) {
	cfg := testConfig(b, driverPlugin(b, "bench"))
	cfg.Logger = hclog.NewNullLogger()
	b.ReportAllocs()
	for b.Loop() {
		h, err := New(cfg)
		require.NoError(b, err)
		require.NoError(b, h.Start(b.Context()))
		ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
		err = h.WaitStarted(ctx)
		cancel()
		require.NoError(b, err)
		require.NoError(b, h.Close())
	}
}

// TestMeasureFigures prints the figures of a real (not race-instrumented) example driver:
// start time, SIGKILL to Worker() false, SIGKILL to a restored worker, Close time, and the
// resident memory of host and driver. It builds the driver with the go command, so it runs only
// when asked:
//
//	AUTHZ_PLUGIN_MEASURE=1 go test -run TestMeasureFigures -v ./internal/pluginhost/
func TestMeasureFigures(t *testing.T) {
	if os.Getenv("AUTHZ_PLUGIN_MEASURE") != "1" {
		t.Skip("set AUTHZ_PLUGIN_MEASURE=1 to measure")
	}
	bin := filepath.Join(t.TempDir(), "example-driver")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/authz-dev/authz/examples/exampledriver/cmd/example-driver")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	sum, err := fileSHA256(bin)
	require.NoError(t, err)

	const runs = 5
	var start, gone, restored, closing []time.Duration
	var hostRSS, driverRSS []int
	for range runs {
		cfg := DefaultConfig() // MinBackoff 100ms: the restore figure includes it
		cfg.Plugins = []PluginConfig{{ID: "example", Path: bin, SHA256: hex.EncodeToString(sum)}}
		cfg.Logger = hclog.NewNullLogger()
		h, err := New(cfg)
		require.NoError(t, err)

		t0 := time.Now()
		require.NoError(t, h.Start(t.Context()))
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		require.NoError(t, h.WaitStarted(ctx))
		cancel()
		start = append(start, time.Since(t0))

		w := state(t, h, "example").Worker
		require.NotNil(t, w)
		hostRSS = append(hostRSS, rssKiB(t, "self"))
		driverRSS = append(driverRSS, rssKiB(t, strconv.Itoa(w.PID)))

		require.NoError(t, syscall.Kill(w.PID, syscall.SIGKILL))
		t1 := time.Now()
		gone = append(gone, waitFor(t, 5*time.Second, "Worker() false", func() bool {
			_, ok := h.Worker("example")
			return !ok
		}))
		waitFor(t, 30*time.Second, "a restored worker", func() bool {
			_, ok := h.Worker("example")
			return ok
		})
		restored = append(restored, time.Since(t1))

		t2 := time.Now()
		require.NoError(t, h.Close())
		closing = append(closing, time.Since(t2))
		require.Empty(t, childProcesses(t))
	}
	t.Logf("runs: %d (medians; MinBackoff %s is part of the restore figure)", runs, DefaultMinBackoff)
	t.Logf("plugin start (Start to WaitStarted):  %s  all %v", median(start), start)
	t.Logf("SIGKILL to Worker() false:            %s  all %v", median(gone), gone)
	t.Logf("SIGKILL to restored worker:           %s  all %v", median(restored), restored)
	t.Logf("Close (graceful stop of one worker):  %s  all %v", median(closing), closing)
	t.Logf("host RSS (test binary, one plugin):   %d KiB  all %v", median(hostRSS), hostRSS)
	t.Logf("driver RSS (example-driver):          %d KiB  all %v", median(driverRSS), driverRSS)
}

func median[T int | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// rssKiB reads VmRSS of /proc/<pid>/status.
func rssKiB(tb testing.TB, pid string) int {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	require.NoError(tb, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			require.NoError(tb, err)
			return n
		}
	}
	tb.Fatalf("no VmRSS in /proc/%s/status", pid)
	return 0
}
