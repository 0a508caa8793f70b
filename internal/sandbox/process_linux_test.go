package sandbox

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	Init()
	os.Exit(m.Run())
}

// TestStopsAndExitOfAChildAreEvents: for a driver that is the host's own child (no init of its
// own namespace), its stop, continue and exit reach the atomics a decision reads through the
// host's own wait (WNOWAIT: the exit is left to the process's wait, which still reaps it) and
// its pidfd in Go's poller.
func TestStopsAndExitOfAChildAreEvents(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill() }()
	p := &Process{log: hclog.NewNullLogger(), pid: cmd.Process.Pid, pidfd: -1, exited: make(chan struct{})}
	fd, err := unix.PidfdOpen(p.pid, 0)
	require.NoError(t, err)
	p.pidfd = fd
	p.watchExit()
	p.watchStops()
	defer p.Release()
	require.True(t, p.Answering())

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	waitFor(t, 10*time.Second, "the stop reported", func() bool { return !p.Answering() })
	assert.True(t, p.Alive(), "a stopped process is alive")
	assert.False(t, p.Running(), "the last look finds it stopped too")
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	waitFor(t, 10*time.Second, "the continue reported", p.Answering)
	assert.True(t, p.Running())

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	waitFor(t, 10*time.Second, "the exit reported", func() bool { return !p.Alive() })
	err = cmd.Wait()
	assert.EqualError(t, err, "signal: killed", "the process's own wait reaps it")
	assert.False(t, p.Running())
}

// TestUnregisteredLauncherIsMissing: in a program that did not call sandbox.Init, the host has
// no launcher, and says so (drivers would run without seccomp, namespaces and Landlock).
//
// Sequential: it changes the process's registration for its duration.
func TestUnregisteredLauncherIsMissing(t *testing.T) {
	launcherRegistered.Store(false)
	defer launcherRegistered.Store(true)
	var c Containment
	c.setUp()
	assert.Empty(t, c.Launcher)
	assert.Contains(t, strings.Join(c.Missing(), "; "), "sandbox.Init")
}

// sharedDir returns a directory any user may write, removed when the test ends.
func sharedDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "authz-contain-")
	require.NoError(tb, err)
	require.NoError(tb, os.Chmod(dir, os.ModeSticky|0o777))
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// copyTestBinary copies the test binary into dir/bin, where another user may execute it.
func copyTestBinary(t *testing.T, dir string) string {
	t.Helper()
	path, err := os.Executable()
	require.NoError(t, err)
	binDir := filepath.Join(dir, "bin")
	require.NoError(t, os.Mkdir(binDir, 0o755))
	exe := filepath.Join(binDir, "host.test")
	src, err := os.Open(path)
	require.NoError(t, err)
	dst, err := os.OpenFile(exe, os.O_CREATE|os.O_WRONLY, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, errors.Join(src.Close(), dst.Close()))
	return exe
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}
