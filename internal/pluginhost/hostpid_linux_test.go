//go:build linux

package pluginhost

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testdrivers/hostpid"
)

// gonePid stands for a process a test driver reported that ended before the test looked it up:
// above the kernel's pid limit (PID_MAX_LIMIT, 4194304), so no process has it and
// processExists and running say it is gone.
const gonePid = 1 << 30

// hostPID turns a pid a test driver reported (a hostpid.Ref: its pid in its own pid namespace
// where its /proc is that namespace's) into the pid the test sees it by; gonePid when the
// process already ended. A report that is not a pid fails the test.
func hostPID(tb testing.TB, ref string) int {
	tb.Helper()
	pid, err := hostpid.Resolve(ref)
	if errors.Is(err, hostpid.ErrGone) {
		return gonePid
	}
	require.NoError(tb, err)
	return pid
}
