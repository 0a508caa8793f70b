//go:build linux

package pluginhost

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testdrivers/hostile"
)

// asHost is the first argument that makes the test binary run as a host process with one driver.
const asHost = "--as-plugin-host"

// runAsHost starts a host with one driver (this binary again, with args, by default the example
// driver), prints the driver's pid and then waits to be killed; it never closes the host, so
// only the parent-death signal can end the driver.
func runAsHost(args []string) int {
	path, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sum, err := FileSHA256(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg := DefaultConfig()
	if len(args) == 0 {
		args = []string{asDriver}
	}
	// The driver writes into the test's directory, this process's TMPDIR.
	cfg.Plugins = []PluginConfig{{ID: "child", Path: path, SHA256: sum, Args: args, Sandbox: SandboxConfig{WritePaths: []string{os.TempDir()}}}}
	cfg.StartTimeout = 30 * time.Second
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn})
	h, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := h.WaitStarted(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(h.Plugins()[0].Worker.PID)
	<-ctx.Done() // the test kills this process long before
	return 0
}

// TestDriversDieWithTheHost: a host killed with SIGKILL (so it cannot run Close) leaves no
// driver behind: the kernel's parent-death signal ends it.
func TestDriversDieWithTheHost(t *testing.T) {
	self, err := filepath.Abs(os.Args[0])
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	host := exec.CommandContext(ctx, self, asHost)
	out, err := host.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, host.Start())
	t.Cleanup(func() { _ = host.Process.Kill(); _ = host.Wait() })

	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
	}()
	var pid int
	select {
	case l, ok := <-line:
		require.True(t, ok, "the host process printed no driver pid")
		pid, err = strconv.Atoi(strings.TrimSpace(l))
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the host process did not start its driver in time")
	}
	require.True(t, running(pid), "driver %d should run while its host does", pid)
	launchers := descendantsOf(host.Process.Pid)

	require.NoError(t, host.Process.Signal(syscall.SIGKILL))
	_ = host.Wait()
	took := waitFor(t, 10*time.Second, "the driver to die with its host", func() bool { return !running(pid) })
	t.Logf("driver %d ended %s after its host was killed", pid, took)

	// When an earlier test made this process a child subreaper (Host.Start does), the orphaned
	// driver was handed to it: reap it, so that later tests do not find it among their children.
	waitFor(t, 10*time.Second, "the dead driver to be reaped", func() bool {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil) // ECHILD when init reaps it instead
		_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
		return os.IsNotExist(err)
	})
	reapGone(t, launchers) // the driver's launcher, orphaned the same way
}

// reapGone waits (bounded) until each of pids is gone, reaping those handed to this process.
func reapGone(t *testing.T, pids []int) {
	t.Helper()
	waitFor(t, 10*time.Second, "the dead processes to be reaped", func() bool {
		for _, pid := range pids {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
				return false
			}
		}
		return true
	})
}

// TestDriversThatClearTheirParentDeathSignalDieWithTheHost: a driver clears its parent-death
// signal and starts a child (in a session of its own) that clears its own; the host is killed
// with SIGKILL: neither is left, nor the worker's private directory, for a root host and for a
// host running as nobody.
func TestDriversThatClearTheirParentDeathSignalDieWithTheHost(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test runs a host as root and as nobody: run it as root (CI does)")
	}
	nobody, err := user.Lookup("nobody")
	require.NoError(t, err, "CI has a user nobody")
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	for _, c := range []struct {
		name string
		cred *syscall.Credential
	}{
		{"root", nil},
		{"nobody", &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := sharedDir(t)
			exe := copyTestBinary(t, dir)
			out := filepath.Join(dir, "outlive.txt")
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			host := exec.CommandContext(ctx, exe, asHost, hostile.Marker, "outlive", "-out", out)
			host.Env = []string{"TMPDIR=" + dir}
			host.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
			var logs strings.Builder
			host.Stdout, host.Stderr = &logs, &logs
			require.NoError(t, host.Start())
			t.Cleanup(func() {
				_ = host.Process.Kill()
				_ = host.Wait()
				if t.Failed() {
					t.Logf("the host's output:\n%s", logs.String())
				}
			})
			var pids []int
			waitFor(t, 60*time.Second, "the driver and its child to run", func() bool {
				b, err := os.ReadFile(out)
				if err != nil {
					return false
				}
				for f := range strings.FieldsSeq(string(b)) {
					pids = append(pids, hostPID(t, f))
				}
				return true
			})
			require.Len(t, pids, 2)
			for _, pid := range pids {
				require.True(t, running(pid), "pid %d runs while the host does", pid)
			}
			launchers := descendantsOf(host.Process.Pid)

			require.NoError(t, host.Process.Signal(syscall.SIGKILL))
			_ = host.Wait()
			took := waitFor(t, 10*time.Second, "the driver and its child to die with the host", func() bool {
				return !running(pids[0]) && !running(pids[1])
			})
			t.Logf("driver %d and its child %d ended %s after the host was killed", pids[0], pids[1], took)
			reapGone(t, append(launchers, pids...))
			// Nor is the worker's private directory (its socket, its TMPDIR).
			waitFor(t, 10*time.Second, "the worker's directory to be removed", func() bool {
				m, err := filepath.Glob(filepath.Join(dir, "plugin-dir*"))
				require.NoError(t, err)
				return len(m) == 0
			})
		})
	}
}

// copyTestBinary copies the test binary into dir/bin, where any user may execute it (the build
// directory is private), and returns its path.
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

// running reports whether pid is a live process (neither gone nor a zombie awaiting its reaper).
func running(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X'
}
