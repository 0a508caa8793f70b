package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// serveProcess is `authz serve` running as a process of its own.
type serveProcess struct {
	*testutil.Process
	addr string // the address it listens on
}

// startServeProcess runs the built binary with `serve args...` (shell as in
// testutil.StartProcess) and waits for its listening address.
func startServeProcess(t testing.TB, shell string, args ...string) *serveProcess {
	t.Helper()
	p := &serveProcess{Process: testutil.StartProcess(t, shell, authzBinary(t), append([]string{"serve"}, args...)...)}
	p.addr = waitListening(t, p.Stderr)
	return p
}

// peakRSS is the peak resident set size (VmHWM) of the process, in bytes.
func (p *serveProcess) peakRSS(t testing.TB) int64 {
	t.Helper()
	return procStatusKB(t, p.Cmd.Process.Pid, "VmHWM") << 10
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
