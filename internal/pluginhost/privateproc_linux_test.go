//go:build linux

package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testdrivers/hostile"
)

// assertPrivateProc checks the proc driver's report: /proc lists its namespace's init (1) and
// itself only, the host's command line is not there, and it reads its own /proc files.
func assertPrivateProc(t *testing.T, raw []byte, host int) {
	t.Helper()
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(raw, &res), "%s", raw)
	list, own := res[hostile.AttemptListProc], res[hostile.AttemptOwnPID]
	require.True(t, list.OK, "%+v", list)
	require.True(t, own.OK, "%+v", own)
	pids := strings.Split(list.Detail, ",")
	slices.Sort(pids)
	want := []string{"1", own.Detail}
	slices.Sort(want)
	assert.Equal(t, want, pids, "the driver's /proc shows its pid namespace's init and itself, no process of the machine")
	cmdline := res[hostile.AttemptHostCmdline]
	assert.False(t, cmdline.OK, "the driver read the host's command line (pid %d): %q", host, cmdline.Detail)
	assert.Equal(t, int(syscall.ENOENT), cmdline.Errno, "%+v", cmdline)
	status := res[hostile.AttemptSelfStatus]
	assert.True(t, status.OK, "the driver reads its own /proc files: %+v", status)
	mount := res[hostile.AttemptProcMount]
	require.True(t, mount.OK, "%+v", mount)
	assert.Contains(t, mount.Detail, " - proc ", "/proc is a procfs")
	assert.Contains(t, mount.Detail, "nosuid,nodev,noexec")
}

// TestDriverSeesOnlyItsOwnProcesses: a driver's /proc is a procfs of its own pid namespace,
// mounted by the driver stage in its mount namespace before its Landlock rules: it lists the
// namespace's init and the driver only, not the host's or any other process of the machine
// (their command lines, status, mounts and descriptors), and still reads its own /proc/self.
func TestDriverSeesOnlyItsOwnProcesses(t *testing.T) {
	out := filepath.Join(sharedDir(t), "proc.json")
	p := hostilePlugin(t, "ownproc", "proc", out)
	h, rec := startHost(t, testConfig(t, p))
	waitStarted(t, h, rec)
	assertPrivateProc(t, waitFile(t, out), os.Getpid())
	st := state(t, h, "ownproc")
	require.NotNil(t, st.Worker)
	require.NotNil(t, st.Worker.Containment)
	assert.True(t, st.Worker.Containment.PrivateProc)
	assert.Empty(t, st.Worker.Containment.Missing)
	assert.Equal(t, "ready", st.Status)
}

// TestDriverOfANonRootHostSeesOnlyItsOwnProcesses: a host running as an ordinary user
// (nobody) gives its driver the same /proc of its own, in the user namespace the driver runs in.
func TestDriverOfANonRootHostSeesOnlyItsOwnProcesses(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("starting a host as nobody needs root: run it as root (CI does)")
	}
	nobody, err := user.Lookup("nobody")
	require.NoError(t, err, "CI has a user nobody")
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	dir := sharedDir(t)
	exe := copyTestBinary(t, dir)
	outDir := filepath.Join(dir, "out")
	require.NoError(t, os.Mkdir(outDir, 0o700))
	require.NoError(t, os.Chown(outDir, uid, gid))
	out := filepath.Join(outDir, "proc.json")

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	host := exec.CommandContext(ctx, exe, asContainHost, out, "proc")
	host.Env = []string{"TMPDIR=" + dir}
	host.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	logs, err := host.CombinedOutput()
	require.NoError(t, err, "the host as nobody: %s", logs)
	raw, err := os.ReadFile(out)
	require.NoError(t, err, "%s", logs)
	assertPrivateProc(t, raw, host.Process.Pid)
	assert.NotContains(t, string(logs), "a /proc of the driver's pid namespace", "the start-up WARN does not say the driver lacks a /proc of its own")
}

// TestDriverProcWhereTheKernelRefusesIt: where the kernel refuses the driver a procfs of its
// own (a container runtime's masked /proc), the driver sees the machine's /proc as before, and
// the start-up WARN and the worker's containment say so; the driver serves.
//
// Sequential: it changes the process's containment set-up for its duration.
func TestDriverProcWhereTheKernelRefusesIt(t *testing.T) {
	c := containment.setUp()
	was := c.ProcErr
	c.ProcErr = errors.New("refused by the test")
	defer func() { c.ProcErr = was }()

	var buf strings.Builder
	c.warn(hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info}))
	assert.Contains(t, buf.String(), "[WARN]")
	assert.Contains(t, buf.String(), "a /proc of the driver's pid namespace (refused by the test): a driver reads the machine's /proc")

	out := filepath.Join(sharedDir(t), "proc.json")
	p := hostilePlugin(t, "hostproc", "proc", out)
	h, rec := startHost(t, testConfig(t, p))
	waitStarted(t, h, rec)
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(waitFile(t, out), &res))
	assert.Contains(t, strings.Split(res[hostile.AttemptListProc].Detail, ","), strconv.Itoa(os.Getpid()),
		"the machine's /proc lists the host: %+v", res[hostile.AttemptListProc])
	st := state(t, h, "hostproc")
	assert.Equal(t, "ready", st.Status)
	require.NotNil(t, st.Worker)
	require.NotNil(t, st.Worker.Containment)
	assert.False(t, st.Worker.Containment.PrivateProc)
	assert.True(t, st.Worker.Containment.SizedTmp, "the tmpfs does not depend on the /proc")
	assert.Contains(t, st.Worker.Containment.Missing, "private /proc: refused by the test")
}
