package testutil

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Process is a program a test runs as a process of its own, its stderr captured.
type Process struct {
	Cmd    *exec.Cmd
	Stderr *SyncBuffer
	// Pipe is the read end of the process's stderr; the copier reads it until it is closed.
	Pipe   *os.File
	exited chan error
}

// StartProcess runs bin with args; shell, when not empty, is a shell prefix such as
// "ulimit -n 128;" run before exec. The process is killed when the test ends (or after three
// minutes).
func StartProcess(tb testing.TB, shell, bin string, args ...string) *Process {
	tb.Helper()
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
	require.NoError(tb, err)
	cmd.Stderr = w
	require.NoError(tb, cmd.Start())
	_ = w.Close()
	p := &Process{Cmd: cmd, Stderr: &SyncBuffer{}, Pipe: r, exited: make(chan error, 1)}
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(p.Stderr, r)
		close(copied)
	}()
	go func() {
		err := cmd.Wait()
		<-copied
		p.exited <- err
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = r.Close()
		select {
		case err := <-p.exited:
			tb.Logf("the process %v ended: %v", args, err)
		case <-time.After(30 * time.Second):
			tb.Errorf("the process %v did not end", args)
		}
		cancel()
	})
	return p
}

// Signal sends sig to the process.
func (p *Process) Signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	require.NoError(tb, p.Cmd.Process.Signal(sig))
}

// Alive reports whether the process has not exited.
func (p *Process) Alive() bool {
	select {
	case err := <-p.exited:
		p.exited <- err
		return false
	default:
		return true
	}
}

// WaitExit waits for the process to end and returns its wait error; the test fails when it
// does not end within within.
func (p *Process) WaitExit(tb testing.TB, within time.Duration) error {
	tb.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(within):
		tb.Fatalf("the process did not exit within %v; stderr:\n%s", within, p.Stderr)
		return nil
	}
}

// Terminate sends SIGTERM and requires a clean exit within 30s.
func (p *Process) Terminate(tb testing.TB) {
	tb.Helper()
	p.Signal(tb, syscall.SIGTERM)
	require.NoError(tb, p.WaitExit(tb, 30*time.Second), "exit status after SIGTERM; stderr:\n%s", p.Stderr)
}

// WaitLogged waits up to timeout for re to match what log holds and returns the match's first
// group.
func WaitLogged(tb testing.TB, log fmt.Stringer, re *regexp.Regexp, timeout time.Duration) string {
	tb.Helper()
	var group string
	require.Eventually(tb, func() bool {
		m := re.FindStringSubmatch(log.String())
		if m != nil {
			group = m[1]
		}
		return m != nil
	}, timeout, 20*time.Millisecond, "nothing matched %s; log:\n%s", re, log)
	return group
}
