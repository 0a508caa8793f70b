package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// TestSystemdUnitVerifies: examples/authz.service passes `systemd-analyze verify` without a
// warning (an unknown or misspelt setting is a warning, and fails the test), with its
// executable paths pointed at an executable of this machine, and holds the settings the driver
// sandbox needs: the namespaces it creates allowed, the delegated cgroup writable, the drivers'
// /proc entries visible, the whole cgroup killed at stop. Outside CI a machine without
// systemd-analyze skips it; in CI (CI=true) it fails.
func TestSystemdUnitVerifies(t *testing.T) {
	t.Parallel()
	unit, err := os.ReadFile("../../examples/authz.service")
	require.NoError(t, err)
	settings := map[string][]string{}
	for _, line := range strings.Split(string(unit), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			settings[k] = append(settings[k], v)
		}
	}
	for k, want := range map[string]string{
		"RestrictNamespaces": "user pid mnt",
		"Delegate":           "yes",
		"KillMode":           "control-group",
		"ProtectProc":        "default",
		"NoNewPrivileges":    "yes",
		"ExecReload":         "/bin/kill -HUP $MAINPID",
	} {
		assert.Equal(t, []string{want}, settings[k], k)
	}
	for _, k := range []string{"ProtectControlGroups", "ProcSubset", "PrivateUsers", "SystemCallFilter"} {
		assert.NotContains(t, settings, k, "%s would break the driver sandbox (see the unit's comments)", k)
	}
	assert.Regexp(t, regexp.MustCompile(`^/usr/local/bin/authz check --config /etc/authz/config.yaml$`), settings["ExecStartPre"][0])

	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze is not installed: .ci/run installs it (apt-get install systemd)")
		}
		t.Skip("systemd-analyze is not installed (CI installs it and runs this test)")
	}
	// verify needs the executables to exist: point them at this test binary.
	self, err := os.Executable()
	require.NoError(t, err)
	path := testutil.WriteFile(t, t.TempDir(), "authz.service", strings.ReplaceAll(string(unit), "/usr/local/bin/authz", self))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, tool, "verify", path).CombinedOutput()
	require.NoError(t, err, "systemd-analyze verify %s:\n%s", filepath.Base(path), out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify warns")
}
