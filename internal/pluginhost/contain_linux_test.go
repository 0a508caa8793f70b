package pluginhost

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/sandbox"
	"github.com/authz-dev/authz/internal/testdrivers/hostile"
	"github.com/authz-dev/authz/internal/testutil"
)

// asContainHost makes the test binary a host of one steal driver (see runContainHost).
const asContainHost = "--as-contained-host"

func init() {
	if len(os.Args) > 1 && os.Args[1] == hostile.Marker {
		os.Exit(hostile.Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == asContainHost {
		os.Exit(runContainHost(os.Args[2:]))
	}
}

// hostilePlugin configures the test driver as the hostile driver in mode, reporting a key of
// its own, writing what it did to out.
func hostilePlugin(tb testing.TB, id, mode, out string, flags ...string) PluginConfig {
	tb.Helper()
	path, sum := driverBinary(tb)
	args := append([]string{hostile.Marker, mode, "-key", "test.hostile." + id, "-out", out, "-target", strconv.Itoa(os.Getpid())}, flags...)
	return PluginConfig{ID: id, Path: path, SHA256: sum, Args: args}
}

// sharedDir returns a directory any driver user may write, removed when the test ends.
func sharedDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "authz-contain-")
	require.NoError(tb, err)
	require.NoError(tb, os.Chmod(dir, os.ModeSticky|0o777))
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// waitFile waits (bounded) until the driver wrote path, and returns its content.
func waitFile(tb testing.TB, path string) []byte {
	tb.Helper()
	var b []byte
	waitFor(tb, 120*time.Second, "the driver to write "+filepath.Base(path), func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil
	})
	return b
}

// loopbackListener is a listening socket of the host for a driver to try to steal; it
// accepts nothing and closes when the test ends.
func loopbackListener(tb testing.TB) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = ln.Close() })
}

// assertRefused checks that each attempt of the steal driver failed with EPERM or EACCES (or
// ESRCH: the host is not even in the driver's pid namespace).
func assertRefused(t *testing.T, raw []byte, attempts ...string) {
	t.Helper()
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(raw, &res), "%s", raw)
	// A driver's /proc is one of its own pid namespace, where the host's pid is not: opening
	// /proc/HOST/... fails with ENOENT. That is a refusal only for the attempts through
	// /proc/HOST, and only when /proc/HOST/mem, which every process has, was not found: the
	// host is not visible at all. Any other ENOENT fails as before.
	hostInvisible := res[hostile.AttemptMem].Errno == int(syscall.ENOENT)
	throughProc := []string{hostile.AttemptListFDs, hostile.AttemptMem, hostile.AttemptStderr}
	succeeded := 0
	for _, a := range attempts {
		o, ok := res[a]
		require.True(t, ok, "the driver reported no %q attempt: %s", a, raw)
		if o.OK {
			succeeded++
			t.Errorf("%s: the driver succeeded: %s", a, o.Detail)
			continue
		}
		if hostInvisible && slices.Contains(throughProc, a) && o.Errno == int(syscall.ENOENT) {
			t.Logf("%s: refused, the host's pid is not in the driver's /proc (%s)", a, o.Detail)
			continue
		}
		assert.Contains(t, []int{int(syscall.EPERM), int(syscall.EACCES), int(syscall.ESRCH)}, o.Errno, "%s: want EPERM, EACCES or ESRCH, got %s", a, o.Detail)
		t.Logf("%s: refused (%s)", a, o.Detail)
	}
	t.Logf("%d of %d reach-in attempts succeeded", succeeded, len(attempts))
}

// hostAttempts are the steal driver's attempts on its host.
var hostAttempts = []string{hostile.AttemptListFDs, hostile.AttemptPidfdGetfd, hostile.AttemptMem, hostile.AttemptStderr, hostile.AttemptVMRead}

// TestDriverCannotReachIntoTheHost: a driver of a host with no `user:` cannot copy the host's
// descriptors (its listener), open its memory, write into its stderr or read its memory; and
// the calls only the seccomp filter refuses are refused.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestDriverCannotReachIntoTheHost(t *testing.T) {
	loopbackListener(t)
	dir := sharedDir(t)
	out := filepath.Join(dir, "steal.json")
	h, rec := startHost(t, testConfig(t, hostilePlugin(t, "steal", "steal", out)))
	waitStarted(t, h, rec)
	raw := waitFile(t, out)
	assertRefused(t, raw, append(hostAttempts, hostile.AttemptSelfGetfd, hostile.AttemptSelfVMRead)...)

	dumpable, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 0, dumpable, "a host of drivers is not dumpable")

	w := state(t, h, "steal").Worker
	require.NotNil(t, w)
	status := procFile(t, w.PID, "status")
	assert.Contains(t, status, "Seccomp:\t2", "the driver runs under a seccomp filter")
	assert.Contains(t, status, "NoNewPrivs:\t1")
	c := w.Containment
	require.NotNil(t, c)
	assert.True(t, c.Seccomp)
	assert.True(t, c.HostNonDumpable)
	// This kernel has every mechanism (CI runs here): none may go missing unnoticed.
	assert.True(t, c.PidNamespace, "the driver runs in a pid namespace of its own")
	assert.True(t, c.Landlock, "the driver runs under Landlock")
	assert.Empty(t, c.Missing)
	if os.Getuid() == 0 {
		assert.NotZero(t, c.UID, "a root host runs a driver without `user:` as another user")
		assert.Contains(t, status, fmt.Sprintf("Uid:\t%d\t", c.UID))
	}
	if containment.setUp().cgroups != nil {
		assert.True(t, c.Cgroup, "the worker runs in a cgroup of its own")
	}
	t.Logf("containment: %+v", *c)
}

// TestDriverOfANonRootHostCannotReachIntoIt: a host running as an ordinary user, with a driver
// of the same user (no `user:`): the host is not dumpable, so the driver cannot open its
// /proc files, and the seccomp filter refuses the rest.
func TestDriverOfANonRootHostCannotReachIntoIt(t *testing.T) {
	if os.Getuid() != 0 {
		testutil.SkipUnlessCI(t, "starting a host as another user needs root; as an ordinary user, TestDriverCannotReachIntoTheHost is this test")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		testutil.SkipUnlessCI(t, "no user nobody to run a host as")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)

	// A copy of the test binary that nobody may execute (the build directory is private).
	dir := sharedDir(t)
	exe := copyTestBinary(t, dir)

	out := filepath.Join(dir, "steal.json")
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	host := exec.CommandContext(ctx, exe, asContainHost, out)
	host.Env = []string{"TMPDIR=" + dir}
	host.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	logs, err := host.CombinedOutput()
	require.NoError(t, err, "the host as nobody: %s", logs)
	raw, err := os.ReadFile(out)
	require.NoError(t, err, "%s", logs)
	assertRefused(t, raw, append(hostAttempts, hostile.AttemptSelfGetfd, hostile.AttemptSelfVMRead)...)
	assert.NotContains(t, string(logs), hostile.ForgedLine)
}

// TestDriverHasNoTerminal: a host started from a terminal (its controlling terminal, its
// stdin): its driver cannot open /dev/tty, push input into the terminal (TIOCSTI: the operator's
// shell would run it once the service stops), not even into a terminal of its own (the seccomp
// filter), nor send SIGCONT to the host.
func TestDriverHasNoTerminal(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test starts a host with a controlling terminal and a driver of another user: run it as root (CI does)")
	}
	master, slave, err := hostile.OpenPTY()
	require.NoError(t, err)
	defer func() { _ = master.Close() }()
	go func() { _, _ = io.Copy(io.Discard, master) }() // the terminal's output, never read back

	self, err := os.Executable()
	require.NoError(t, err)
	out := filepath.Join(sharedDir(t), "tty.json")
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	host := exec.CommandContext(ctx, self, asContainHost, out, "tty")
	host.Stdin = slave
	host.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	logs, err := host.CombinedOutput()
	_ = slave.Close()
	require.NoError(t, err, "the host on a terminal: %s", logs)
	raw, err := os.ReadFile(out)
	require.NoError(t, err, "%s", logs)
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(raw, &res), "%s", raw)
	for _, a := range []string{hostile.AttemptOpenTTY, hostile.AttemptTTYInject, hostile.AttemptStdinInject, hostile.AttemptOwnInject, hostile.AttemptSIGCONT} {
		o, ok := res[a]
		require.True(t, ok, "the driver reported no %q attempt: %s", a, raw)
		if o.OK {
			t.Errorf("%s: the driver succeeded: %s", a, o.Detail)
			continue
		}
		assert.NotZero(t, o.Errno, "%s: want a refusal by the kernel, got %s", a, o.Detail)
		t.Logf("%s: refused (%s)", a, o.Detail)
	}
}

// victimKey is the plugin key of the driver the files mode attacks.
const victimKey = "test.victim"

// TestDriverOfANonRootHostIsSandboxed: a host running as an ordinary user (nobody), so its
// drivers run as that user too: a driver cannot read the host's tokens, configuration or
// decision log, nor append to the decision log, nor open another driver's memory, nor signal
// the host, nor connect to a TCP port its configuration does not allow. Its attempt to bind a
// TCP port is logged, not checked: this kernel's Landlock refuses an IPv6 bind and let an IPv4
// one through (docs/drivers.md).
func TestDriverOfANonRootHostIsSandboxed(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("starting a host as nobody needs root: run it as root (CI does)")
	}
	nobody, err := user.Lookup("nobody")
	require.NoError(t, err, "CI has a user nobody")
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	dir := sharedDir(t)
	exe := copyTestBinary(t, dir)
	private := func(name string) string {
		d := filepath.Join(dir, name)
		require.NoError(t, os.Mkdir(d, 0o700))
		require.NoError(t, os.Chown(d, uid, gid))
		return d
	}
	secrets, outDir := private("service"), private("out")
	var files []string
	for _, name := range []string{"tokens", "config.yaml", "decisions.log"} {
		path := filepath.Join(secrets, name)
		require.NoError(t, os.WriteFile(path, []byte(name+" of the service\n"), 0o600))
		require.NoError(t, os.Chown(path, uid, gid))
		files = append(files, path)
	}
	decisionLog := files[2]
	out := filepath.Join(outDir, "files.json")

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	host := exec.CommandContext(ctx, exe, asContainHost, out, "files",
		"-read", strings.Join(files, ","), "-append", decisionLog, "-victim", victimKey)
	host.Env = []string{"TMPDIR=" + dir}
	host.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	logs, err := host.CombinedOutput()
	require.NoError(t, err, "the host as nobody: %s", logs)
	raw, err := os.ReadFile(out)
	require.NoError(t, err, "%s", logs)
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(raw, &res), "%s", raw)
	// The bind that went through before was Go's default Multipath TCP listener, which
	// Landlock's TCP rules do not see; seccomp refuses its sockets, and Go's fallback to TCP
	// meets Landlock.
	attempts := []string{hostile.AppendAttempt(decisionLog), hostile.AttemptVictimMem, hostile.AttemptSIGCONT, hostile.AttemptConnectTCP, hostile.AttemptBindTCP}
	for _, f := range files {
		attempts = append(attempts, hostile.ReadAttempt(f))
	}
	for _, a := range attempts {
		o, ok := res[a]
		require.True(t, ok, "the driver reported no %q attempt: %s", a, raw)
		if o.OK {
			t.Errorf("%s: the driver succeeded: %s", a, o.Detail)
			continue
		}
		assert.NotZero(t, o.Errno, "%s: want a refusal by the kernel, got %s", a, o.Detail)
		t.Logf("%s: refused (%s)", a, o.Detail)
	}
	// The other driver runs (the host said so before the driver looked) and is not in the
	// driver's /proc, one of its own pid namespace: it cannot name its /proc/PID/mem at all.
	victim := res[hostile.AttemptVictimMem]
	assert.Equal(t, int(syscall.ENOENT), victim.Errno, "the other driver is invisible to the driver: %+v", victim)
	b, err := os.ReadFile(decisionLog)
	require.NoError(t, err)
	assert.Equal(t, "decisions.log of the service\n", string(b), "the decision log is as the service wrote it")
}

// runContainHost runs a host (of whatever user this process is) with one hostile driver, in
// mode args[1] (default steal), writing to args[0], until the driver has written it.
func runContainHost(args []string) int {
	sandbox.Init() // dispatched from init, before TestMain registers the launcher
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	sum, err := FileSHA256(self)
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // for the driver to try to steal
	if err != nil {
		return fail(err)
	}
	defer func() { _ = ln.Close() }()
	cfg := DefaultConfig()
	mode := "steal"
	if len(args) > 1 {
		mode = args[1]
	}
	driverArgs := []string{hostile.Marker, mode, "-out", args[0], "-target", strconv.Itoa(os.Getpid()),
		"-connect", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)}
	if len(args) > 2 {
		driverArgs = append(driverArgs, args[2:]...)
	}
	cfg.Plugins = []PluginConfig{{ID: mode, Path: self, SHA256: sum, Args: driverArgs,
		Sandbox: SandboxConfig{WritePaths: []string{filepath.Dir(args[0])}}}}
	if mode == "tmpdir" {
		cfg.Plugins[0].ResourceLimits.TempDirBytes = 1 << 20
	}
	if mode == "files" { // another plugin's driver, for the first to attack
		cfg.Plugins = append(cfg.Plugins, PluginConfig{ID: "victim", Path: self, SHA256: sum, Args: []string{asDriver, "-plugin-key", victimKey}})
	}
	cfg.StartTimeout = 30 * time.Second
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn})
	h, err := New(cfg)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = h.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		return fail(err)
	}
	victimRuns := mode != "files"
	for ctx.Err() == nil {
		if _, err := os.Stat(args[0]); err == nil {
			return 0
		}
		if !victimRuns {
			// The files mode's driver looks for the victim driver until the host saw it run.
			if _, ok := h.Worker("victim"); ok {
				if err := os.WriteFile(hostile.VictimRuns(args[0]), nil, 0o600); err != nil {
					return fail(err)
				}
				victimRuns = true
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fail(errors.New("the driver wrote nothing in time"))
}

// hostZombies counts this process's zombie children.
func hostZombies() int {
	n := 0
	for _, p := range processTable() {
		if p.ppid == os.Getpid() && p.zombie {
			n++
		}
	}
	return n
}

// orphanPids reads the pids the hostile driver wrote.
func orphanPids(tb testing.TB, raw []byte) []int {
	tb.Helper()
	var pids []int
	s := bufio.NewScanner(strings.NewReader(string(raw)))
	for s.Scan() {
		pids = append(pids, hostPID(tb, s.Text()))
	}
	return pids
}

// TestEscapedOrphanZombiesAreReaped: 40 orphans of any shape (double fork, setsid, no
// environment, so no marker) that end on their own are reaped, not left as zombies.
//
// Sequential: it counts the zombie children of the whole process.
func TestEscapedOrphanZombiesAreReaped(t *testing.T) {
	dir := sharedDir(t)
	out := filepath.Join(dir, "orphans")
	h, rec := startHost(t, testConfig(t, hostilePlugin(t, "zombify", "zombify", out, "-n", "40")))
	waitStarted(t, h, rec)
	pids := orphanPids(t, waitFile(t, out))
	require.Len(t, pids, 40)
	deadline := time.Now().Add(15 * time.Second)
	left := pids
	for len(left) > 0 && time.Now().Before(deadline) {
		left = left[:0:0]
		for _, pid := range pids {
			if processExists(pid) {
				left = append(left, pid)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d of %d orphans left (%d zombie children of the host)", len(left), len(pids), hostZombies())
	assert.Empty(t, left, "orphans left as zombies: %s", describeProcesses(left))
}

// TestEscapeesEndWithTheWorker: an escapee (double fork, setsid, no environment, re-executed
// /proc/self/exe) ends when its worker is stopped, and when the host closes; nothing is left.
//
// Sequential: it checks the child processes of the whole test process.
func TestEscapeesEndWithTheWorker(t *testing.T) {
	t.Run("worker stop", func(t *testing.T) {
		dir := sharedDir(t)
		out := filepath.Join(dir, "escapee")
		h, rec := startHost(t, testConfig(t, hostilePlugin(t, "escape", "fork-escape", out)))
		waitStarted(t, h, rec)
		pids := orphanPids(t, waitFile(t, out))
		require.Len(t, pids, 1)
		require.True(t, processExists(pids[0]), "the escapee runs")
		_, err := h.Reconfigure(t.Context(), nil) // the worker stops
		require.NoError(t, err)
		assertGone(t, pids)
	})
	t.Run("host close", func(t *testing.T) {
		dir := sharedDir(t)
		out := filepath.Join(dir, "escapee")
		h, err := New(testConfig(t, hostilePlugin(t, "escape", "fork-escape", out)))
		require.NoError(t, err)
		require.NoError(t, h.Start(t.Context()))
		t.Cleanup(func() { _ = h.Close() })
		pids := orphanPids(t, waitFile(t, out))
		require.Len(t, pids, 1)
		require.True(t, processExists(pids[0]), "the escapee runs")
		require.NoError(t, h.Close())
		assertGone(t, pids)
		assert.Empty(t, childProcesses(t), "child processes left after Close: %s", describeProcesses(childProcesses(t)))
	})
}

// assertGone waits (bounded) until none of pids exists, not even as a zombie.
func assertGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var left []int
	for {
		left = left[:0]
		for _, pid := range pids {
			if processExists(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("%d of %d escapees left", len(left), len(pids))
	assert.Empty(t, left, "escapees left: %s", describeProcesses(left))
}

// memfdsOfHost lists the host's descriptors of sealed driver copies.
func memfdsOfHost(tb testing.TB) []string {
	tb.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(tb, err)
	var out []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, "/memfd:authz-driver:") && !strings.Contains(target, ":launcher") {
			out = append(out, target)
		}
	}
	return out
}

// TestOneSealedCopyPerDigest: N workers of one binary run one in-memory copy of it, which the
// host holds once.
//
// Sequential: it counts the sealed copies the whole process holds.
func TestOneSealedCopyPerDigest(t *testing.T) {
	const n = 4
	var plugins []PluginConfig
	for i := range n {
		plugins = append(plugins, driverPlugin(t, fmt.Sprintf("copy%d", i), "-plugin-key", fmt.Sprintf("test.copy%d", i)))
	}
	h, rec := startHost(t, testConfig(t, plugins...))
	waitStarted(t, h, rec)
	copies := map[[2]uint64]bool{}
	for _, p := range h.Plugins() {
		require.NotNil(t, p.Worker, p.ID)
		dev, ino, err := exeIdentity(p.Worker.PID)
		require.NoError(t, err)
		copies[[2]uint64{dev, ino}] = true
	}
	fds := memfdsOfHost(t)
	t.Logf("%d workers run %d distinct copies; the host holds %d descriptors of copies", n, len(copies), len(fds))
	assert.Len(t, copies, 1, "one in-memory copy for every worker of the binary")
	assert.Len(t, fds, 1, "the host holds the copy once: %v", fds)
}

// TestCgroupLimits: memoryMax and pidsMax are the worker cgroup's memory.max and pids.max
// where the host can apply them, and a configuration error naming the field where it cannot.
//
// Sequential: it reads the process-wide containment set-up.
func TestCgroupLimits(t *testing.T) {
	p := driverPlugin(t, "limited")
	p.ResourceLimits.MemoryMax = 256 << 20
	p.ResourceLimits.PidsMax = 64
	cfg := testConfig(t, p)
	if why := cgroupLimitsProblem(); why != nil {
		t.Logf("cgroup limits cannot be applied here: %v", why)
		err := cfg.Validate()
		require.Error(t, err, "a configuration asking for limits that cannot be applied is refused")
		assert.Contains(t, err.Error(), "plugins[0].limits.memoryMax: cannot be applied here")
		assert.Contains(t, err.Error(), "plugins[0].limits.pidsMax: cannot be applied here")
		return
	}
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	pid := state(t, h, "limited").Worker.PID
	rel, err := cgroupOf(strconv.Itoa(pid))
	require.NoError(t, err)
	mount, err := cgroup2Mount()
	require.NoError(t, err)
	memMax, err := os.ReadFile(filepath.Join(mount, rel, "memory.max"))
	require.NoError(t, err)
	pidsMax, err := os.ReadFile(filepath.Join(mount, rel, "pids.max"))
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(256<<20), strings.TrimSpace(string(memMax)))
	assert.Equal(t, "64", strings.TrimSpace(string(pidsMax)))
}

// TestReaperLeavesOtherChildren: the host reaps the zombies it inherited from drivers, never a
// child someone else in the process started and waits for: its exit status stays theirs.
//
// Sequential: it checks the child processes of the whole test process.
func TestReaperLeavesOtherChildren(t *testing.T) {
	h, rec := startHost(t, testConfig(t, driverPlugin(t, "d")))
	waitStarted(t, h, rec)
	cmd := exec.CommandContext(t.Context(), "/bin/sh", "-c", "exit 7")
	require.NoError(t, cmd.Start())
	waitFor(t, 10*time.Second, "the child to end", func() bool { return !running(cmd.Process.Pid) })
	h.reaper.reapZombies()
	h.reaper.reapZombies()
	err := cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the exit status is still the starter's to read")
	assert.Equal(t, 7, ee.ExitCode())
}

// TestNoForgedGrantsFromAStolenListener: the host serves decisions (here: always a deny) on a
// loopback listener while a driver tries to copy that listener and answer grants on it; every
// answer is the host's.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestNoForgedGrantsFromAStolenListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"allow":false}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	dir := sharedDir(t)
	out := filepath.Join(dir, "steal.json")
	h, rec := startHost(t, testConfig(t, hostilePlugin(t, "steal", "steal", out)))
	waitStarted(t, h, rec)
	waitFile(t, out)

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	const n = 20
	forged := 0
	for range n {
		resp, err := client.Get("http://" + ln.Addr().String() + "/v1/authorize")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, errors.Join(err, resp.Body.Close()))
		if strings.Contains(string(body), `"allow":true`) {
			forged++
		}
	}
	t.Logf("%d of %d answers were forged grants", forged, n)
	assert.Zero(t, forged)
	require.NoError(t, h.Close()) // the driver ends before the listener closes
	require.NoError(t, srv.Close())
}

// TestStaleCgroupsAreEnded: the worker cgroups of a host that is gone (killed before it could
// remove them) are ended and removed when a host sets up, with what runs in them.
//
// Sequential: it reads the process-wide containment set-up.
func TestStaleCgroupsAreEnded(t *testing.T) {
	root := containment.setUp().cgroups
	if root == nil {
		testutil.SkipUnlessCI(t, "no writable cgroup v2 hierarchy: %v", containment.cgroupErr)
	}
	gone := exec.CommandContext(t.Context(), "/bin/true") // its pid names a host that is gone
	require.NoError(t, gone.Run())
	require.False(t, exists(gone.Process.Pid))
	stale := filepath.Join(root.mount, root.hostRel, cgroupParentPrefix+strconv.Itoa(gone.Process.Pid))
	worker := filepath.Join(stale, "p.marker")
	require.NoError(t, os.MkdirAll(worker, 0o755))
	t.Cleanup(func() { _ = os.Remove(worker); _ = os.Remove(stale) })

	left := exec.CommandContext(t.Context(), "/bin/sleep", "600")
	require.NoError(t, left.Start())
	waited := make(chan error, 1)
	go func() { waited <- left.Wait() }()
	require.NoError(t, os.WriteFile(filepath.Join(worker, "cgroup.procs"), []byte(strconv.Itoa(left.Process.Pid)), 0))

	root.removeStale()
	select {
	case err := <-waited:
		require.Error(t, err, "the process left in the stale cgroup was killed")
	case <-time.After(10 * time.Second):
		t.Fatal("the process left in the stale cgroup still runs")
	}
	_, err := os.Stat(stale)
	assert.True(t, errors.Is(err, os.ErrNotExist), "the stale cgroup is removed: %v", err)
}

// TestMissingContainmentIsWarnedOnce: what drivers run without is one WARN line at start.
//
// Sequential: it reads the process-wide containment set-up.
func TestMissingContainmentIsWarnedOnce(t *testing.T) {
	var buf strings.Builder
	log := hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info})
	c := &hostContainment{Containment: sandbox.Containment{SeccompErr: errors.New("no seccomp filters")}, cgroupErr: errors.New("no cgroup2 mount")}
	c.warn(log)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1, "%s", buf.String())
	assert.Contains(t, lines[0], "[WARN]")
	assert.Contains(t, lines[0], "missing seccomp (no seccomp filters); cgroup (no cgroup2 mount)")

	buf.Reset()
	(&hostContainment{}).warn(log)
	assert.Empty(t, buf.String(), "nothing missing, nothing said")
}

// TestStaleCgroupIsWarned: the processes a SIGKILLed host left behind (escaped from their
// driver's process tree) are ended at the next host start, which says so in one WARN naming
// the stale cgroup and how many processes it ended.
//
// Sequential: it reads the process-wide containment set-up.
func TestStaleCgroupIsWarned(t *testing.T) {
	root := containment.setUp().cgroups
	if root == nil {
		testutil.SkipUnlessCI(t, "no writable cgroup v2 hierarchy: %v", containment.cgroupErr)
	}
	gone := exec.CommandContext(t.Context(), "/bin/true") // its pid names a host that is gone
	require.NoError(t, gone.Run())
	require.False(t, exists(gone.Process.Pid))
	stale := filepath.Join(root.mount, root.hostRel, cgroupParentPrefix+strconv.Itoa(gone.Process.Pid))
	worker := filepath.Join(stale, "p.marker")
	require.NoError(t, os.MkdirAll(worker, 0o755))
	t.Cleanup(func() { _ = os.Remove(worker); _ = os.Remove(stale) })
	var waits []chan error
	for range 2 {
		left := exec.CommandContext(t.Context(), "/bin/sleep", "600")
		require.NoError(t, left.Start())
		waited := make(chan error, 1)
		go func() { waited <- left.Wait() }()
		waits = append(waits, waited)
		require.NoError(t, os.WriteFile(filepath.Join(worker, "cgroup.procs"), []byte(strconv.Itoa(left.Process.Pid)), 0))
	}

	r, err := findCgroupRoot() // what a host start does
	require.NoError(t, err)
	var buf strings.Builder
	(&hostContainment{cgroups: r}).warn(hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info}))
	for _, waited := range waits {
		select {
		case err := <-waited:
			require.Error(t, err, "the process left in the stale cgroup was killed")
		case <-time.After(10 * time.Second):
			t.Fatal("a process left in the stale cgroup still runs")
		}
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1, "%s", buf.String())
	assert.Contains(t, lines[0], "[WARN]")
	assert.Contains(t, lines[0], "cgroup="+stale)
	assert.Contains(t, lines[0], "processes=2")
}

// TestSocketDirsOfKilledDriversAreRemoved: the private directory of a worker (its socket, its
// TMPDIR) goes with the worker, also when the driver was killed: none is left behind.
func TestSocketDirsOfKilledDriversAreRemoved(t *testing.T) {
	runParallel(t)
	cfg := testConfig(t, driverPlugin(t, "killed"))
	cfg.SocketDir = t.TempDir()
	dirs := func() []string {
		m, err := filepath.Glob(filepath.Join(cfg.SocketDir, "plugin-dir*"))
		require.NoError(t, err)
		return m
	}
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	for range 3 {
		w := state(t, h, "killed").Worker
		require.NotNil(t, w)
		require.NoError(t, syscall.Kill(w.PID, syscall.SIGKILL))
		waitFor(t, 30*time.Second, "a restarted worker", func() bool {
			s := state(t, h, "killed").Worker
			return s != nil && s.Generation > w.Generation
		})
	}
	waitFor(t, 10*time.Second, "one socket directory, the running worker's", func() bool { return len(dirs()) == 1 })
	require.NoError(t, h.Close())
	waitFor(t, 10*time.Second, "no socket directory once the host closed", func() bool { return len(dirs()) == 0 })
}

// TestLimitsHoldInsideTheDriver: the driver runs with the configured RLIMIT_DATA and
// RLIMIT_FSIZE, the default RLIMIT_NPROC (its uid is its own) and RLIMIT_NOFILE, and no RLIMIT_CPU; a file larger
// than its RLIMIT_FSIZE cannot be written.
func TestLimitsHoldInsideTheDriver(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test runs a driver of a uid of its own: run it as root (CI does)")
	}
	out := filepath.Join(sharedDir(t), "limits.json")
	p := hostilePlugin(t, "limits", "limits", out, "-size", strconv.Itoa(2<<20))
	p.ResourceLimits = ResourceLimits{DataBytes: 4 << 30, FileSizeBytes: 1 << 20}
	h, rec := startHost(t, testConfig(t, p))
	waitStarted(t, h, rec)
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(waitFile(t, out), &res))
	limits := res[hostile.AttemptLimits]
	require.True(t, limits.OK, "%+v", limits)
	limit := func(name string) string {
		for line := range strings.SplitSeq(limits.Detail, "\n") {
			if rest, ok := strings.CutPrefix(line, name); ok {
				f := strings.Fields(rest)
				require.NotEmpty(t, f, "%q", line)
				return f[0] // the soft limit
			}
		}
		t.Fatalf("no %q in %s", name, limits.Detail)
		return ""
	}
	assert.Equal(t, strconv.Itoa(4<<30), limit("Max data size"))
	assert.Equal(t, strconv.Itoa(1<<20), limit("Max file size"))
	assert.Equal(t, strconv.Itoa(DefaultProcesses), limit("Max processes"))
	assert.Equal(t, strconv.Itoa(DefaultOpenFiles), limit("Max open files"), "not the service's own RLIMIT_NOFILE")
	assert.Equal(t, "unlimited", limit("Max cpu time"), "RLIMIT_CPU is off by default")
	w := res[hostile.AttemptWriteFile]
	assert.False(t, w.OK, "a file past RLIMIT_FSIZE was written: %s", w.Detail)
	assert.Equal(t, int(syscall.EFBIG), w.Errno, "%s", w.Detail)
}

// TestMemoryBoundPerProcessIsWarned: where the worker cgroups get no memory controller
// (limits.memoryMax is refused: memory bound to cgroup v1, or not delegated), the start-up WARN
// says that a driver's memory is bounded per process, not in total: RLIMIT_DATA counts each of
// its processes alone.
//
// Sequential: it reads the process-wide containment set-up.
func TestMemoryBoundPerProcessIsWarned(t *testing.T) {
	var buf strings.Builder
	log := hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info})
	(&hostContainment{memoryErr: errors.New("memory is bound to cgroup v1")}).warn(log)
	assert.Contains(t, buf.String(), "[WARN]")
	assert.Contains(t, buf.String(), "missing a memory controller in the drivers' cgroups (memory is bound to cgroup v1): "+
		"a driver's memory is bounded per process (limits.dataBytes x limits.processes), not in total; "+
		"set limits.memoryMax where cgroup v2 has the memory controller")

	buf.Reset()
	(&hostContainment{cgroupErr: errors.New("no cgroup2 mount"), memoryErr: errors.New("no cgroup2 mount")}).warn(log)
	assert.Contains(t, buf.String(), "cgroup (no cgroup2 mount); a memory controller in the drivers' cgroups: a driver's memory is bounded per process")

	// This host's own set-up: the WARN names the memory bound exactly where memoryMax is refused.
	c := containment.setUp()
	assert.Equal(t, cgroupLimitsProblem() == nil, c.memoryErr == nil, "memoryErr %v, cgroupLimitsProblem %v", c.memoryErr, cgroupLimitsProblem())
	buf.Reset()
	c.warn(log)
	if c.memoryErr != nil {
		assert.Contains(t, buf.String(), "a driver's memory is bounded per process")
	} else {
		assert.NotContains(t, buf.String(), "a driver's memory is bounded per process")
	}
}
