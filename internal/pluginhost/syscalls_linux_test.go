package pluginhost

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
)

// threadReads is the number of read system calls (read, pread, readv, …) the calling OS thread
// has made: syscr of /proc/thread-self/io, whose own read is counted by the next call. The
// caller holds its OS thread (runtime.LockOSThread).
func threadReads(tb testing.TB) uint64 {
	tb.Helper()
	fd, err := unix.Open("/proc/thread-self/io", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(tb, err)
	var buf [512]byte
	n, err := unix.Read(fd, buf[:])
	_ = unix.Close(fd)
	require.NoError(tb, err)
	_, rest, ok := bytes.Cut(buf[:n], []byte("syscr: "))
	require.True(tb, ok, "no syscr in %q", buf[:n])
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	v, err := strconv.ParseUint(string(line), 10, 64)
	require.NoError(tb, err)
	return v
}

// readsDuring returns how many read system calls f made on the calling goroutine's thread.
func readsDuring(tb testing.TB, f func()) uint64 {
	tb.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	base := threadReads(tb)
	calibrate := threadReads(tb) - base // the reads of threadReads itself
	before := threadReads(tb)
	f()
	return threadReads(tb) - before - calibrate
}

// TestLivenessReadsNoKernel: what a decision reads of a worker's liveness before its last look
// (Host.Plugin, the worker's answering, the config check's kept answer) comes from the events
// the host received, kept in atomics: not one read of the process table, not one allocation.
// The host used to read /proc/PID/stat (and wait on a pidfd) on each of them.
//
// Sequential: testing.AllocsPerRun counts the allocations of the whole process.
func TestLivenessReadsNoKernel(t *testing.T) {
	h, rec := startHost(t, testConfig(t, driverPlugin(t, "events")))
	waitStarted(t, h, rec)
	w := h.current().byID["events"].state.Load().worker
	require.NotNil(t, w)
	// One check asks the driver and keeps its answer; the rounds below read the kept answer.
	_, err := h.ConfigValid(t.Context(), "events", w.facts, "example", map[string]any{"provider": "example"})
	require.NoError(t, err)

	const rounds = 1000
	reads := readsDuring(t, func() {
		for range rounds {
			pf, ok := h.Plugin("events")
			if !ok || pf.Worker == nil || !w.answering() || !w.alive() {
				t.Error("the worker is not answering")
				return
			}
			c, valid, err := h.prepareCheck("events", pf.Worker, "example", map[string]any{"provider": "example"})
			if c != nil || !valid || err != nil {
				t.Errorf("no kept answer: %v %v %v", c, valid, err)
				return
			}
		}
	})
	assert.Zero(t, reads, "read system calls in %d rounds of Plugin, answering and a kept config check answer", rounds)
	allocs := testing.AllocsPerRun(rounds, func() {
		if pf, ok := h.Plugin("events"); !ok || pf.Worker == nil || !w.answering() {
			t.Error("the worker is not answering")
		}
	})
	assert.Zero(t, allocs, "allocations of Plugin and answering")
}

// TestCachedDecisionReadsTheProcessTableOnce: a cached grant through the engine reads the
// kernel once, its last look at the worker (proc.running: one pread of /proc/PID/stat held
// open), where it used to read /proc/PID/stat five times (Host.Plugin, prepareCheck,
// ConfigValid, the last look), each an openat, a read, a close and a waitid or poll.
func TestCachedDecisionReadsTheProcessTableOnce(t *testing.T) {
	runParallel(t)
	h, rec := startHost(t, testConfig(t, driverPlugin(t, "cached")))
	waitStarted(t, h, rec)
	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 5 * time.Second})
	grant := leaseOn(t, "cached", "example", `{"provider": "example"}`)
	doc, _, err := eng.Decide(t.Context(), grant, h) // the miss: evaluates and asks the driver
	require.NoError(t, err)
	require.True(t, doc.Allow)
	hits := eng.CacheStats().Hits

	const decisions = 200
	reads := readsDuring(t, func() {
		for range decisions {
			doc, _, err := eng.Decide(t.Context(), grant, h)
			if err != nil || !doc.Allow {
				t.Errorf("a cached grant was not granted: %v %v", doc.Reasons, err)
				return
			}
		}
	})
	require.Equal(t, hits+decisions, eng.CacheStats().Hits, "every decision was a cache hit")
	t.Logf("%d read system calls in %d cached decisions", reads, decisions)
	assert.LessOrEqual(t, reads, uint64(decisions), "at most one read of the process table per cached decision")
}

// BenchmarkCachedDecisionLiveness is what a cached decision reads of a worker's liveness: the
// plugin and its worker (Host.Plugin, events only) and the last look (Worker.Alive: one pread).
func BenchmarkCachedDecisionLiveness(b *testing.B) {
	h, err := New(testConfig(b, driverPlugin(b, "bench")))
	require.NoError(b, err)
	require.NoError(b, h.Start(b.Context()))
	defer func() { require.NoError(b, h.Close()) }()
	ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
	defer cancel()
	require.NoError(b, h.WaitStarted(ctx))
	b.ReportAllocs()
	for b.Loop() {
		pf, ok := h.Plugin("bench")
		if !ok || !pf.Worker.Alive() {
			b.Fatal("the worker is not answering")
		}
	}
}
