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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/sandbox/tmpfs"
	"github.com/authz-dev/authz/internal/testdrivers/hostile"
)

// mountsOn lists the lines of every process's mountinfo whose mount point is dir.
func mountsOn(dir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/mountinfo")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for l := range strings.SplitSeq(string(b), "\n") {
			if fs := strings.Fields(l); len(fs) > 4 && fs[4] == dir {
				out = append(out, f+": "+l)
			}
		}
	}
	return out
}

// assertSizedTmpdir checks the tmpdir driver's report: its TMPDIR is a tmpfs of 1 MiB, a file
// of 2 MiB there was cut short by ENOSPC, and it kept a file there.
func assertSizedTmpdir(t *testing.T, raw []byte) (kept string) {
	t.Helper()
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(raw, &res), "%s", raw)
	fill := res[hostile.AttemptFillTmp]
	assert.False(t, fill.OK, "2 MiB went into a TMPDIR of 1 MiB: %s", fill.Detail)
	assert.Equal(t, int(syscall.ENOSPC), fill.Errno, "%s", fill.Detail)
	mount := res[hostile.AttemptTmpMount]
	require.True(t, mount.OK, "%+v", mount)
	assert.Contains(t, mount.Detail, " - tmpfs ", "TMPDIR is a tmpfs")
	assert.Contains(t, mount.Detail, "size=1024k", "of limits.tempDirBytes")
	assert.Contains(t, mount.Detail, "nr_inodes=1024")
	keep := res[hostile.AttemptKeepTmp]
	require.True(t, keep.OK, "%+v", keep)
	return keep.Detail
}

// TestDriverTmpdirIsASizedTmpfs: a driver's TMPDIR (where its socket is too) is a tmpfs of
// limits.tempDirBytes in a mount namespace of its own: a driver that writes past it gets ENOSPC
// and the host goes on serving it; what it keeps there never reaches the host's disk (the
// worker's directory stays empty, the host's namespace has no such mount); and the tmpfs is
// gone once the worker ended.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestDriverTmpdirIsASizedTmpfs(t *testing.T) {
	out := filepath.Join(sharedDir(t), "tmpdir.json")
	p := hostilePlugin(t, "tmpdir", "tmpdir", out, "-size", strconv.Itoa(2<<20))
	p.ResourceLimits = ResourceLimits{TempDirBytes: 1 << 20}
	cfg := testConfig(t, p)
	cfg.SocketDir = sharedDir(t)
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	kept := assertSizedTmpdir(t, waitFile(t, out))

	workers, err := filepath.Glob(filepath.Join(cfg.SocketDir, "plugin-dir*"))
	require.NoError(t, err)
	require.Len(t, workers, 1)
	worker := workers[0]
	assert.Equal(t, filepath.Join(worker, "kept"), kept, "the driver's TMPDIR is its worker's directory")
	entries, err := os.ReadDir(worker)
	require.NoError(t, err)
	assert.Empty(t, entries, "on the host's disk the worker's directory holds nothing of the driver (its file, its socket)")
	for _, l := range mountsOn(worker) {
		assert.False(t, strings.HasPrefix(l, "/proc/"+strconv.Itoa(os.Getpid())+"/"), "the host's namespace has no mount there: %s", l)
	}

	st := state(t, h, "tmpdir")
	require.NotNil(t, st.Worker)
	require.NotNil(t, st.Worker.Containment)
	assert.True(t, st.Worker.Containment.SizedTmp)
	assert.Empty(t, st.Worker.Containment.Missing)
	assert.Equal(t, "ready", st.Status, "the host serves the driver that filled its TMPDIR")
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(st.Worker.PID), "root", kept))
	require.NoError(t, err, "the kept file is in the driver's own mount namespace")
	held := false
	fds, _ := filepath.Glob("/proc/self/fd/*")
	for _, fd := range fds {
		if target, _ := os.Readlink(fd); target == worker {
			held = true
		}
	}
	assert.True(t, held, "the host holds the tmpfs's root, through which it reaches the socket")
	assert.Len(t, b, 4096)
	assert.NotEmpty(t, mountsOn(worker), "the driver's namespace has the tmpfs")
	environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(st.Worker.PID), "environ"))
	require.NoError(t, err)
	assert.Contains(t, string(environ), "TMPDIR="+worker+"\x00")
	assert.NotContains(t, string(environ), tmpfs.Env, "the launcher's spec is not the driver's")

	require.NoError(t, h.Close())
	waitFor(t, 10*time.Second, "no tmpfs on the worker's directory once the worker ended", func() bool {
		return len(mountsOn(worker)) == 0
	})
	_, err = os.Stat(worker)
	assert.True(t, os.IsNotExist(err), "the worker's directory is removed: %v", err)
	fds, _ = filepath.Glob("/proc/self/fd/*")
	for _, fd := range fds {
		target, _ := os.Readlink(fd)
		assert.NotEqual(t, worker, target, "the host let go of the tmpfs (%s): it would keep its memory", fd)
	}
}

// TestDriverTmpdirOfANonRootHostIsASizedTmpfs: a host running as an ordinary user (nobody)
// gives its driver the same sized tmpfs, in the user namespace the driver runs in.
func TestDriverTmpdirOfANonRootHostIsASizedTmpfs(t *testing.T) {
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
	out := filepath.Join(outDir, "tmpdir.json")

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	host := exec.CommandContext(ctx, exe, asContainHost, out, "tmpdir", "-size", strconv.Itoa(2<<20))
	host.Env = []string{"TMPDIR=" + dir}
	host.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	logs, err := host.CombinedOutput()
	require.NoError(t, err, "the host as nobody: %s", logs)
	raw, err := os.ReadFile(out)
	require.NoError(t, err, "%s", logs)
	kept := assertSizedTmpdir(t, raw)
	worker := filepath.Dir(kept)
	assert.True(t, strings.HasPrefix(filepath.Base(worker), "plugin-dir"), "%s", kept)
	assert.Empty(t, mountsOn(worker), "the tmpfs went with the worker")
	_, err = os.Stat(worker)
	assert.True(t, os.IsNotExist(err), "the worker's directory is removed: %v", err)
}

// TestDriverTmpdirWithoutAMountNamespace: where the kernel refuses the driver a mount namespace
// with a tmpfs, its TMPDIR is the plain directory it was (its files bounded one by one, not
// together), the start-up WARN and the worker's containment say so, and the driver serves.
//
// Sequential: it changes the process's containment set-up for its duration.
func TestDriverTmpdirWithoutAMountNamespace(t *testing.T) {
	c := containment.setUp()
	was := c.TmpfsErr
	c.TmpfsErr = errors.New("refused by the test")
	defer func() { c.TmpfsErr = was }()

	var buf strings.Builder
	c.warn(hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info}))
	assert.Contains(t, buf.String(), "[WARN]")
	assert.Contains(t, buf.String(), "sized tmpfs as TMPDIR (refused by the test)")

	out := filepath.Join(sharedDir(t), "tmpdir.json")
	p := hostilePlugin(t, "plaintmp", "tmpdir", out, "-size", strconv.Itoa(2<<20))
	p.ResourceLimits = ResourceLimits{TempDirBytes: 1 << 20}
	h, rec := startHost(t, testConfig(t, p))
	waitStarted(t, h, rec)
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(waitFile(t, out), &res))
	assert.True(t, res[hostile.AttemptFillTmp].OK, "a plain TMPDIR is bounded per file only: %+v", res[hostile.AttemptFillTmp])
	assert.False(t, res[hostile.AttemptTmpMount].OK, "no mount on TMPDIR: %+v", res[hostile.AttemptTmpMount])
	st := state(t, h, "plaintmp")
	assert.Equal(t, "ready", st.Status)
	require.NotNil(t, st.Worker)
	require.NotNil(t, st.Worker.Containment)
	assert.False(t, st.Worker.Containment.SizedTmp)
	assert.Contains(t, st.Worker.Containment.Missing, "sized tmpfs: refused by the test")
}
