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

// serveProcess is `authz serve` running as a process of its own.
type serveProcess struct {
	cmd    *exec.Cmd
	stderr *testutil.SyncBuffer
	// pipe is the read end of the process's stderr; the copier reads it until it is closed.
	pipe   *os.File
	exited chan error
	addr   string
}

// startServeProcess runs the built binary with `serve args...`; shell, when not empty, is a
// shell prefix such as "ulimit -n 128;" run before exec. The process is killed when the test
// ends.
func startServeProcess(t *testing.T, shell string, args ...string) *serveProcess {
	t.Helper()
	bin := authzBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var cmd *exec.Cmd
	if shell != "" {
		quoted := make([]string, len(args))
		for i, a := range args {
			quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		cmd = exec.CommandContext(ctx, "/bin/sh", "-c", shell+" exec '"+bin+"' serve "+strings.Join(quoted, " "))
	} else {
		cmd = exec.CommandContext(ctx, bin, append([]string{"serve"}, args...)...)
	}
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stderr = w
	require.NoError(t, cmd.Start())
	w.Close()
	p := &serveProcess{cmd: cmd, stderr: &testutil.SyncBuffer{}, pipe: r, exited: make(chan error, 1)}
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
			t.Logf("the service process ended: %v", err)
		case <-time.After(30 * time.Second):
			t.Errorf("the service process did not end")
		}
		cancel()
	})
	p.addr = waitListening(t, p.stderr)
	return p
}

// signal sends sig to the process.
func (p *serveProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// alive reports whether the process has not exited (it does not reap it).
func (p *serveProcess) alive() bool {
	select {
	case err := <-p.exited:
		p.exited <- err
		return false
	default:
		return true
	}
}

// waitExit waits for the process to end and returns its wait error.
func (p *serveProcess) waitExit(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(within):
		t.Fatalf("the service did not exit within %v; stderr:\n%s", within, p.stderr)
		return nil
	}
}

// peakRSS is the peak resident set size (VmHWM) of the process, in bytes.
func (p *serveProcess) peakRSS(t *testing.T) int64 {
	t.Helper()
	return procStatusKB(t, p.cmd.Process.Pid, "VmHWM") << 10
}

func procStatusKB(t *testing.T, pid int, field string) int64 {
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
