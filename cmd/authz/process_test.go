package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// process is an authz subcommand running as a process of its own.
type process struct {
	cmd    *exec.Cmd
	stderr *testutil.SyncBuffer
	// pipe is the read end of the process's stderr; the copier reads it until it is closed.
	pipe   *os.File
	exited chan error
	// addr is the address `authz serve` listens on (startServeProcess).
	addr string
}

// serveProcess is `authz serve` running as a process of its own.
type serveProcess = process

// startServeProcess runs the built binary with `serve args...` (see startProcess) and waits for
// its listening address.
func startServeProcess(t testing.TB, shell string, args ...string) *serveProcess {
	t.Helper()
	p := startProcess(t, shell, append([]string{"serve"}, args...)...)
	p.addr = waitListening(t, p.stderr)
	return p
}

// startProcess runs the built binary with args; shell, when not empty, is a shell prefix such
// as "ulimit -n 128;" run before exec. The process is killed when the test ends.
func startProcess(t testing.TB, shell string, args ...string) *process {
	t.Helper()
	bin := authzBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var cmd *exec.Cmd
	if shell != "" {
		quoted := make([]string, len(args))
		for i, a := range args {
			quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		cmd = exec.CommandContext(ctx, "/bin/sh", "-c", shell+" exec '"+bin+"' "+strings.Join(quoted, " "))
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stderr = w
	require.NoError(t, cmd.Start())
	w.Close()
	p := &process{cmd: cmd, stderr: &testutil.SyncBuffer{}, pipe: r, exited: make(chan error, 1)}
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(p.stderr, r)
		close(copied)
	}()
	go func() {
		err := cmd.Wait()
		<-copied
		p.exited <- err
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = r.Close()
		select {
		case err := <-p.exited:
			t.Logf("the process %v ended: %v", args[0], err)
		case <-time.After(30 * time.Second):
			t.Errorf("the process %v did not end", args[0])
		}
		cancel()
	})
	return p
}

// terminate sends SIGTERM and requires a clean exit within 30s.
func (p *process) terminate(t testing.TB) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	require.NoError(t, p.waitExit(t, 30*time.Second), "exit status after SIGTERM; stderr:\n%s", p.stderr)
}

// signal sends sig to the process.
func (p *process) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// alive reports whether the process has not exited (it does not reap it).
func (p *process) alive() bool {
	select {
	case err := <-p.exited:
		p.exited <- err
		return false
	default:
		return true
	}
}

// waitExit waits for the process to end and returns its wait error.
func (p *process) waitExit(t testing.TB, within time.Duration) error {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(within):
		t.Fatalf("the process did not exit within %v; stderr:\n%s", within, p.stderr)
		return nil
	}
}

// peakRSS is the peak resident set size (VmHWM) of the process, in bytes.
func (p *process) peakRSS(t testing.TB) int64 {
	t.Helper()
	return procStatusKB(t, p.cmd.Process.Pid, "VmHWM") << 10
}

func procStatusKB(t testing.TB, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			require.NoError(t, err)
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
