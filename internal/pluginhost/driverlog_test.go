//go:build unix

package pluginhost

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// countingWriter counts the bytes written to it and keeps the first keep bytes.
type countingWriter struct {
	n    atomic.Int64
	mu   sync.Mutex
	head strings.Builder
	keep int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.keep - w.head.Len(); room > 0 {
		w.head.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (w *countingWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.head.String()
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestStderrFloodIsBounded: a driver writing to stderr as fast as it can costs the host a
// bounded number of log bytes per second; the dropped lines are counted in the log.
//
// Sequential: the CPU figure it prints is the whole process's.
func TestStderrFloodIsBounded(t *testing.T) {
	out := &countingWriter{keep: 1 << 20}
	cfg := testConfig(t, boundsPlugin(t, "flood", "-stderr-flood"))
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "pluginhost", Level: hclog.Info, Output: out})
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)

	const window = 3 * time.Second
	bytes0, cpu0, start := out.n.Load(), cpuTime(t), time.Now()
	time.Sleep(window)
	elapsed := time.Since(start)
	bytesPerSec := float64(out.n.Load()-bytes0) / elapsed.Seconds()
	cpu := float64(cpuTime(t)-cpu0) / float64(elapsed)
	t.Logf("host log under a stderr flood: %.0f bytes/s; host CPU %.0f%% of one core (the test process)", bytesPerSec, 100*cpu)

	// Over the window at most LogBurst + LogLinesPerSecond·window lines, each at most
	// LogLineBytes plus hclog's prefix and fields.
	maxBytes := float64(defaultLogBurst+defaultLogLinesPerSecond*int(window/time.Second)) * (defaultLogLineBytes + 256)
	assert.LessOrEqual(t, bytesPerSec, maxBytes/window.Seconds())
	logged := out.String()
	// Short messages: the log is large.
	assert.True(t, strings.Contains(logged, "driver output over the rate limit was dropped"), "drops are reported")
	assert.True(t, strings.Contains(logged, "flooding the host log"), "lines within the rate are relayed")
	assert.True(t, strings.Contains(logged, "more bytes cut"), "the 200,000-byte line is cut")
	longest := 0
	for _, line := range strings.Split(logged, "\n") {
		longest = max(longest, len(line))
	}
	assert.LessOrEqual(t, longest, defaultLogLineBytes+512)
}

// TestDriverLogCannotForgeHostLines: control characters in a driver's log lines (carriage
// return, newline, ANSI escapes, bidirectional overrides) reach the host log escaped.
func TestDriverLogCannotForgeHostLines(t *testing.T) {
	runParallel(t)
	var logged testutil.SyncBuffer
	cfg := testConfig(t, boundsPlugin(t, "ctl", "-control-chars"))
	cfg.Logger = testLogger(t, &logged)
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	waitFor(t, 10*time.Second, "the driver's lines in the host log", func() bool {
		s := logged.String()
		return strings.Contains(s, "FORGED HOST LINE") && strings.Contains(s, "FORGED PLAIN LINE") && strings.Contains(s, "forged")
	})
	s := logged.String()
	for _, bad := range []string{"\r", "\x1b", "\x07", "\u202e"} {
		assert.NotContains(t, s, bad)
	}
	assert.Contains(t, s, `forged\r2026-01-01T00:00:00.000Z [ERROR] host: \x1b[31mFORGED HOST LINE\x1b[0m`)
	assert.Contains(t, s, `plain\rFORGED PLAIN LINE \x1b]0;title\x07 \u202eevil`)
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, "FORGED") {
			assert.Contains(t, line, "pluginhost.ctl", "a driver's text stays on its own, attributed line")
		}
	}
	assert.NotContains(t, s, "v\x1b[2Kforged\nsecond")
	assert.Contains(t, s, `v\x1b[2Kforged\nsecond`)
}

// TestDriverLogUnit covers the relay without a process: cutting, rate, levels, JSON lines.
func TestDriverLogUnit(t *testing.T) {
	var out testutil.SyncBuffer
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: &out})
	now := time.Unix(1000, 0)
	d := newDriverLog(log, Limits{LogLinesPerSecond: 2, LogBurst: 2, LogLineBytes: 20}.withDefaults())
	d.now = func() time.Time { return now }
	w := d.writer("stderr")

	_, _ = w.Write([]byte("[WARN] 0123456789abcdef\n[INFO] sec"))
	_, _ = w.Write([]byte("ond\nthird\n"))
	_, _ = w.Write([]byte("fourth\n"))
	now = now.Add(time.Second)
	_, _ = w.Write([]byte("[ERROR] fifth\r\n"))
	d.flush()
	s := out.String()
	assert.Contains(t, s, "[WARN]  [WARN] 0123456789abc … (3 more bytes cut): stream=stderr")
	assert.Contains(t, s, "[INFO]  [INFO] second: stream=stderr")
	assert.NotContains(t, s, "third")
	assert.NotContains(t, s, "fourth")
	assert.Contains(t, s, "driver output over the rate limit was dropped: lines=1")
	assert.Equal(t, 2, strings.Count(s, "rate limit was dropped"), "at the first drop, then with the next line")
	assert.Contains(t, s, "[ERROR] [ERROR] fifth: stream=stderr")

	out = testutil.SyncBuffer{}
	d = newDriverLog(log, Limits{}.withDefaults())
	w = d.writer("stdout")
	_, _ = w.Write([]byte(`{"@level":"error","@message":"json\rline","@module":"m","k":"v\u001b","n":3}` + "\n"))
	_, _ = w.Write([]byte(`{"@level":"debug","@message":"quiet"}` + "\n"))
	_, _ = w.Write([]byte(`{"@level":"info","@message":"m","decision_id":"FORGED","result":"{\"allow\":true}"}` + "\n"))
	_, _ = w.Write([]byte(`{"not":"hclog"}` + "\n"))
	s = out.String()
	assert.Contains(t, s, `[ERROR] json\rline: stream=stdout driver_module=m driver.k=v\x1b driver.n=3`)
	assert.Contains(t, s, "[DEBUG] quiet: stream=stdout")
	assert.Contains(t, s, `driver.decision_id=FORGED`, "a driver's field cannot stand where the host's decision_id is read")
	assert.NotContains(t, s, ` decision_id=FORGED`)
	assert.Contains(t, s, `[INFO]  {"not":"hclog"}: stream=stdout`, "a plain line (not hclog JSON) at Info")
}

// TestDriverLogFieldNames: a driver's field name keeps only [A-Za-z0-9_.-] in both log formats,
// so a name like "x decision_id" cannot read as a bare decision_id field of the text log.
func TestDriverLogFieldNames(t *testing.T) {
	line := `{"@level":"info","@message":"m","x decision_id":"FORGED","a=b":1,"ok_k.e-y":2,"":3,"é\u001b":4}` + "\n"
	for _, jsonFormat := range []bool{false, true} {
		var out testutil.SyncBuffer
		log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: &out, JSONFormat: jsonFormat})
		_, _ = newDriverLog(log, Limits{}.withDefaults()).writer("stdout").Write([]byte(line))
		s := out.String()
		if jsonFormat {
			var entry map[string]any
			require.NoError(t, json.Unmarshal([]byte(s), &entry), s)
			keys := slices.Sorted(maps.Keys(entry))
			assert.Equal(t, []string{"@level", "@message", "@timestamp", "driver._", "driver.__", "driver.a_b", "driver.ok_k.e-y", "driver.x_decision_id", "stream"}, keys)
			continue
		}
		assert.Contains(t, s, `driver.x_decision_id=FORGED`)
		assert.NotContains(t, s, ` decision_id=`, "no bare decision_id field")
		assert.Contains(t, s, `driver.a_b=1`)
		assert.Contains(t, s, `driver.ok_k.e-y=2`)
		assert.Contains(t, s, `driver._=3`)
		assert.Contains(t, s, `driver.__=4`)
	}
}

func TestEscapeControlAndCapText(t *testing.T) {
	tests := []struct {
		name, in, want string
		max            int
	}{
		{name: "clean", in: "plain text\twith tab", want: "plain text\twith tab", max: 100},
		{name: "carriage return", in: "a\rb", want: `a\rb`, max: 100},
		{name: "newlines become separators", in: "a\nb", want: "a; b", max: 100},
		{name: "ansi", in: "\x1b[31mred", want: `\x1b[31mred`, max: 100},
		{name: "c1 and bidi", in: "\u009b\u202e", want: `\u009b\u202e`, max: 100},
		{name: "invalid utf-8", in: "a\xffb", want: `a\xffb`, max: 100},
		{name: "replacement character kept", in: "a\uFFFDb", want: "a\uFFFDb", max: 100},
		{name: "cut on a rune boundary", in: "ééé", want: "é… (4 more bytes cut)", max: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, capText(tt.in, tt.max))
		})
	}
}

// BenchmarkDriverLogFlood is the host's cost per line of a driver's stderr flood once the rate
// limit drops it.
func BenchmarkDriverLogFlood(b *testing.B) {
	d := newDriverLog(hclog.NewNullLogger(), Limits{}.withDefaults())
	w := d.writer("stderr")
	line := []byte(`{"@level":"error","@message":"flooding the host log","i":1,"padding":"` + strings.Repeat("z", 200) + `"}` + "\n")
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		_, _ = w.Write(line)
	}
}
