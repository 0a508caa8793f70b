package pluginhost

import (
	"encoding/json"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testdrivers/hostile"
)

// TestCallsOutsideTheAllowlistAreRefused: a driver's calls that no Go driver needs, none of
// them on the filter's list of refusals before it became an allowlist (io_uring_setup,
// name_to_handle_at, memfd_create, a netlink audit socket, namespaces through clone, unshare
// and setns, another personality), and some that were (add_key, TIOCSTI), are refused with
// EPERM; clone3 with ENOSYS (so that glibc falls back to clone, whose flags the filter reads);
// and listing the network interfaces through a NETLINK_ROUTE socket still works.
//
// Sequential, as TestDriverCannotReachIntoTheHost: its driver gets a dynamic uid.
func TestCallsOutsideTheAllowlistAreRefused(t *testing.T) {
	out := filepath.Join(sharedDir(t), "calls.json")
	h, rec := startHost(t, testConfig(t, hostilePlugin(t, "calls", "calls", out)))
	waitStarted(t, h, rec)
	raw := waitFile(t, out)
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(raw, &res), "%s", raw)
	for _, a := range hostile.AttemptsOutsideTheAllowlist {
		o, ok := res[a]
		require.True(t, ok, "the driver reported no %q attempt: %s", a, raw)
		assert.False(t, o.OK, "%s: the driver succeeded: %s", a, o.Detail)
		assert.Equal(t, int(syscall.EPERM), o.Errno, "%s: want EPERM, got %s", a, o.Detail)
	}
	o := res[hostile.AttemptClone3]
	assert.Equal(t, int(syscall.ENOSYS), o.Errno, "%s: want ENOSYS, got %+v", hostile.AttemptClone3, o)
	o = res[hostile.AttemptInterfaces]
	assert.True(t, o.OK, "%s: %s", hostile.AttemptInterfaces, o.Detail)
	t.Logf("%s", raw)
}
