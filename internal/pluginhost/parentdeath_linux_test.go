//go:build linux

package pluginhost

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
)

// asHost is the first argument that makes the test binary run as a host process with one driver.
const asHost = "--as-plugin-host"

// runAsHost starts a host with one driver (this binary again), prints the driver's pid and then
// waits to be killed; it never closes the host, so only the parent-death signal can end the driver.
func runAsHost() int {
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
	cfg.Plugins = []PluginConfig{{ID: "child", Path: path, SHA256: sum, Args: []string{asDriver}}}
	cfg.StartTimeout = 30 * time.Second
	cfg.Logger = hclog.NewNullLogger()
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
