//go:build linux

package pluginhost

import (
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testdrivers/identity"
	"github.com/authz-dev/authz/internal/testutil"
)

// impostorBinary writes a copy of the test driver with a few bytes appended: it runs the same
// drivers, but it is not the pinned binary (another digest, another file).
func impostorBinary(tb testing.TB, dir string) string {
	tb.Helper()
	self, _ := driverBinary(tb)
	src, err := os.Open(self)
	require.NoError(tb, err)
	defer func() { _ = src.Close() }()
	path := filepath.Join(dir, "impostor")
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o700)
	require.NoError(tb, err)
	_, err = io.Copy(dst, src)
	require.NoError(tb, err)
	_, err = dst.WriteString(identity.ImpostorTrailer)
	require.NoError(tb, err)
	require.NoError(tb, dst.Close())
	return path
}

// flippingBinary makes dir/name a symlink to the pinned test driver and returns its path, its
// pin, and flip, which points the path at the pinned binary (even i) or at an impostor (odd i)
// in one atomic rename: a hard link of a prepared symlink renamed over the path.
func flippingBinary(tb testing.TB, dir, name string) (link, sum string, flip func(i int)) {
	tb.Helper()
	self, sum := driverBinary(tb)
	impostor := impostorBinary(tb, dir)
	link = filepath.Join(dir, name)
	require.NoError(tb, os.Symlink(self, link))
	targets := [2]string{link + ".pinned", link + ".impostor"}
	require.NoError(tb, os.Symlink(self, targets[0]))
	require.NoError(tb, os.Symlink(impostor, targets[1]))
	return link, sum, func(i int) {
		tmp := link + ".tmp"
		_ = os.Remove(tmp)
		_ = os.Link(targets[i%2], tmp)
		_ = os.Rename(tmp, link)
	}
}

// TestPinBindsTheBytesThatRun: the plugin path is a symlink flipped between the pinned binary
// and an impostor as fast as possible while the worker restarts over and over. Whatever the
// timing, what runs is what was hashed: no impostor is ever ready under the pin.
func TestPinBindsTheBytesThatRun(t *testing.T) {
	runParallel(t)
	link, sum, flip := flippingBinary(t, t.TempDir(), "driver")

	cfg := testConfig(t, PluginConfig{ID: "swapped", Path: link, SHA256: sum, Args: []string{identity.Marker, "serve"}})
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 5*time.Millisecond
	h, rec := startHost(t, cfg)

	defer testutil.Repeat(t, 1, func(i int) bool {
		flip(i)
		time.Sleep(50 * time.Microsecond)
		return true
	})()

	// Ten workers ready under the flipping link; on a machine too busy for ten within 8 s, as
	// many as started by then, at least one (within a minute).
	var readies, impostors int
	seen := map[int]bool{}
	start := time.Now()
	for readies < 10 && (readies == 0 || time.Since(start) < 8*time.Second) && time.Since(start) < time.Minute {
		st := state(t, h, "swapped")
		if st.Worker == nil || seen[st.Worker.PID] {
			time.Sleep(time.Millisecond)
			continue
		}
		seen[st.Worker.PID] = true
		rec.record(h)
		readies++
		if st.Key == identity.ImpostorKey {
			impostors++
		}
		_ = syscall.Kill(st.Worker.PID, syscall.SIGKILL)
	}
	t.Logf("%d workers ready, %d of them impostors, %d restarts", readies, impostors, state(t, h, "swapped").Restarts)
	require.Positive(t, readies, "the pinned driver should have started at least once")
	assert.Zero(t, impostors, "an impostor was ready under the pin")
}

// TestWritableBinaryIsRefused: a binary in a directory that others may write is refused by
// default, with what to do next; allowWritableBinary starts it with a warning.
func TestWritableBinaryIsRefused(t *testing.T) {
	runParallel(t)
	dir := t.TempDir()
	self, sum := driverBinary(t)
	path := filepath.Join(dir, "driver")
	require.NoError(t, os.Link(self, path))
	require.NoError(t, os.Chmod(dir, 0o777))

	p := PluginConfig{ID: "writable", Path: path, SHA256: sum, Args: []string{identity.Marker, "serve"}}
	allowed := p
	allowed.ID, allowed.AllowWritableBinary = "allowed", true
	h, rec := startHost(t, testConfig(t, p, allowed))
	waitFor(t, 30*time.Second, "status error", func() bool { return state(t, h, "writable").Status == StatusError })
	st := state(t, h, "writable")
	assert.Contains(t, st.LastError, "plugin directory "+dir+" is writable by group or others")
	assert.Contains(t, st.LastError, "chmod go-w")
	assert.Equal(t, string(coded.UnsafeBinary), st.LastErrorCode)
	waitFor(t, 30*time.Second, "the allowed plugin ready", func() bool { return state(t, h, "allowed").Status == StatusReady })
	rec.record(h)
}

// TestHostTalksOnlyToTheVerifiedProcess: a pinned driver that hands the host to another
// program is never ready: one that execve's an unpinned binary (same pid), one that points the
// host at the unix socket of an unpinned child, and one that points it at a TCP relay.
func TestHostTalksOnlyToTheVerifiedProcess(t *testing.T) {
	runParallel(t)
	impostor := impostorBinary(t, t.TempDir())
	tests := []struct {
		name    string
		flags   []string
		wantErr string
	}{
		{name: "execve of an unpinned binary", flags: []string{"-exec", impostor}, wantErr: "no longer runs the pinned binary"},
		{name: "socket of another process", flags: []string{"-exec", impostor, "-relay", "unix"}, wantErr: "not by the driver"},
		{name: "tcp address", flags: []string{"-exec", impostor, "-relay", "tcp"}, wantErr: "accepts only a unix socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runParallel(t) // each case starts a host of its own
			cfg := testConfig(t, identityPlugin(t, "hostile", tt.flags...))
			cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 100*time.Millisecond
			cfg.StartTimeout = 10 * time.Second
			h, rec := startHost(t, cfg)
			deadline := time.Now().Add(60 * time.Second)
			for {
				st := state(t, h, "hostile")
				rec.record(h)
				require.NotEqual(t, StatusReady, st.Status, "an impostor was ready: key %q", st.Key)
				require.NotEqual(t, identity.ImpostorKey, st.Key)
				pf, _ := h.Plugin("hostile")
				require.Nil(t, pf.Worker)
				if st.Restarts >= 2 && st.Status == StatusError {
					assert.Contains(t, st.LastError, tt.wantErr)
					assert.Equal(t, string(coded.IdentityRefused), st.LastErrorCode, "last error: %s", st.LastError)
					break
				}
				require.True(t, time.Now().Before(deadline), "no second failed start in time: %+v", st)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// countingListener listens on the unix socket addr ("@name": abstract) until the test ends and
// counts the connections it accepts.
func countingListener(t *testing.T, addr string) *atomic.Int64 {
	t.Helper()
	ln, err := net.Listen("unix", addr)
	require.NoError(t, err)
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return &n
}

// TestHostConnectsOnlyToItsDriversSocket: a driver that prints the handshake by hand, naming a
// socket in another directory, one reached through ".." out of its socket directory, an
// abstract one, or a symbolic link in its socket directory to another socket, is refused
// (IDENTITY_REFUSED) on every start, and the host connects to none of those sockets; a driver
// next to them serves as usual.
func TestHostConnectsOnlyToItsDriversSocket(t *testing.T) {
	runParallel(t)
	dir := sharedDir(t) // short paths: a unix socket's path is at most 107 bytes
	socketDir := sharedDir(t)
	abstract := "@authz-test-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	other, dotdot, linked := filepath.Join(dir, "other.sock"), filepath.Join(socketDir, "dotdot.sock"), filepath.Join(dir, "linked.sock")
	tests := []struct {
		id      string
		flags   []string
		target  string
		wantErr string
	}{
		{id: "otherdir", flags: []string{"-announce", other}, target: other, wantErr: "the host accepts only a socket file directly inside the worker's socket directory"},
		{id: "dotdot", flags: []string{"-announce", "{TMPDIR}/../dotdot.sock"}, target: dotdot, wantErr: "the host accepts only a socket file directly inside the worker's socket directory"},
		{id: "abstract", flags: []string{"-announce", abstract}, target: abstract, wantErr: "no abstract address"},
		{id: "symlink", flags: []string{"-announce", "{TMPDIR}/link", "-symlink", linked}, target: linked, wantErr: "is not a socket (mode 0120000; a symbolic link is not followed)"},
	}
	plugins := []PluginConfig{identityPlugin(t, "honest")}
	accepted := map[string]*atomic.Int64{}
	for _, tt := range tests {
		plugins = append(plugins, identityPlugin(t, tt.id, tt.flags...))
		accepted[tt.id] = countingListener(t, tt.target)
	}
	cfg := testConfig(t, plugins...)
	cfg.SocketDir = socketDir
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 100*time.Millisecond
	cfg.StartTimeout = 10 * time.Second
	h, rec := startHost(t, cfg)
	waitFor(t, 2*time.Minute, "the honest driver ready and two refused starts of each other", func() bool {
		rec.record(h)
		for _, tt := range tests {
			st := state(t, h, tt.id)
			require.NotEqual(t, StatusReady, st.Status, tt.id)
			if st.Restarts < 2 || st.Status != StatusError {
				return false
			}
		}
		return state(t, h, "honest").Status == StatusReady
	})
	for _, tt := range tests {
		st := state(t, h, tt.id)
		assert.Equal(t, string(coded.IdentityRefused), st.LastErrorCode, "%s: %s", tt.id, st.LastError)
		assert.Contains(t, st.LastError, tt.wantErr, tt.id)
		assert.Zero(t, accepted[tt.id].Load(), "%s: the host connected to the socket the driver named", tt.id)
	}
}

func TestInSocketDir(t *testing.T) {
	for addr, want := range map[string]bool{
		"/s/plugin-dir1/plugin123":       true,
		"/s/plugin-dir1/.hidden":         true,
		"/s/plugin-dir1/":                false,
		"/s/plugin-dir1/.":               false,
		"/s/plugin-dir1/..":              false,
		"/s/plugin-dir1/../x.sock":       false,
		"/s/plugin-dir1/sub/x.sock":      false,
		"/s/plugin-dir1//x.sock":         false,
		"/s/plugin-dir1x/y":              false,
		"/s/plugin-dir1":                 false,
		"/s/other/x.sock":                false,
		"@/s/plugin-dir1/x":              false,
		"@x":                             false,
		"/s/plugin-dir1/x\x00/../../etc": false,
		"plugin123":                      false,
	} {
		assert.Equal(t, want, inSocketDir("/s/plugin-dir1", addr), addr)
	}
	assert.True(t, inSocketDir("/s/plugin-dir1/", "/s/plugin-dir1/x"))
	assert.False(t, inSocketDir("", "/x"))
}

// TestDeadDriverWithChildHoldingPipes: a SIGKILLed driver whose child holds its stdout and
// stderr is gone at once, restarted, and Close is bounded; the child does not survive.
func TestDeadDriverWithChildHoldingPipes(t *testing.T) {
	runParallel(t)
	pidFile := filepath.Join(t.TempDir(), "child")
	h, rec := startHost(t, testConfig(t, identityPlugin(t, "holder", "-child-holds-pipes", pidFile)))
	waitStarted(t, h, rec)
	first := state(t, h, "holder").Worker
	require.NotNil(t, first)
	child := readPids(t, pidFile)[0]
	require.True(t, running(child))
	require.NoError(t, os.Remove(pidFile))

	require.NoError(t, syscall.Kill(first.PID, syscall.SIGKILL))
	gone := waitFor(t, 2*time.Second, "the worker gone", func() bool { _, ok := h.Worker("holder"); return !ok })
	t.Logf("SIGKILL to gone: %s", gone)
	waitFor(t, 30*time.Second, "generation 2", func() bool {
		w, ok := h.Worker("holder")
		return ok && w.Generation == 2
	})
	rec.record(h)
	waitFor(t, 5*time.Second, "the first child to end", func() bool { return !running(child) })
	child2 := readPids(t, pidFile)[0]
	require.NotEqual(t, child, child2)

	start := time.Now()
	require.NoError(t, h.Close())
	assert.Less(t, time.Since(start), 10*time.Second, "Close must be bounded")
	assert.False(t, running(child2), "the child of the last worker must end with the host")
}

// TestDeadWorkerDeniedAtOnce: a decision that read a worker just before it died, or any
// decision after the death is visible in the process table, carries no worker and denies with
// worker_not_running; the kernel is asked, not the supervisor.
func TestDeadWorkerDeniedAtOnce(t *testing.T) {
	runParallel(t)
	h, rec := startHost(t, testConfig(t, identityPlugin(t, "victim")))
	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 5 * time.Second})
	req := leaseOn(t, "victim", identity.DriverKey, `{}`)
	for i := range 5 {
		waitFor(t, 30*time.Second, "a worker", func() bool { _, ok := h.Worker("victim"); return ok })
		rec.record(h)
		before, ok := h.Plugin("victim")
		require.True(t, ok)
		require.NotNil(t, before.Worker)
		doc, _, err := eng.Decide(t.Context(), req, frozenFacts{Facts: h, pf: before})
		require.NoError(t, err)
		require.True(t, doc.Allow, "round %d: the live worker grants: %+v", i, doc)

		pid := state(t, h, "victim").Worker.PID
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		for running(pid) {
			time.Sleep(50 * time.Microsecond)
		}
		assert.False(t, before.Worker.Alive(), "round %d: dead per the process table, alive per the host", i)
		doc, in, err := eng.Decide(t.Context(), req, frozenFacts{Facts: h, pf: before})
		require.NoError(t, err)
		assert.False(t, doc.Allow)
		assert.Contains(t, doc.Reasons, "worker_not_running")
		assert.NotContains(t, in["facts"], "worker")
		now, _ := h.Plugin("victim")
		if now.Worker != nil {
			assert.NotEqual(t, before.Worker.Generation, now.Worker.Generation)
		}
	}
}

// frozenFacts answers Plugin with a snapshot taken earlier: a decision that read its facts just
// before the worker died.
type frozenFacts struct {
	snapshot.Facts
	pf snapshot.PluginFacts
}

func (f frozenFacts) Plugin(string) (snapshot.PluginFacts, bool) { return f.pf, true }

// TestDescendantsEndWithTheirDriver: children a driver started in their own sessions end when
// the driver is SIGKILLed (they are reparented to the host, a subreaper) and when the host
// closes.
func TestDescendantsEndWithTheirDriver(t *testing.T) {
	runParallel(t)
	pidFile := filepath.Join(t.TempDir(), "pids")
	h, rec := startHost(t, testConfig(t, identityPlugin(t, "spawner", "-setsid-children", "5", "-pidfile", pidFile)))
	waitStarted(t, h, rec)
	first := readPids(t, pidFile)
	require.Len(t, first, 5)
	for _, pid := range first {
		require.True(t, running(pid))
	}
	require.NoError(t, os.Remove(pidFile))
	require.NoError(t, syscall.Kill(state(t, h, "spawner").Worker.PID, syscall.SIGKILL))
	waitFor(t, 30*time.Second, "generation 2", func() bool {
		w, ok := h.Worker("spawner")
		return ok && w.Generation == 2
	})
	rec.record(h)
	for _, pid := range first {
		waitFor(t, 5*time.Second, "the children of the killed worker to end", func() bool { return !running(pid) })
	}
	second := readPids(t, pidFile)
	require.Len(t, second, 5)
	require.NoError(t, h.Close())
	for _, pid := range second {
		assert.False(t, running(pid), "child %d outlived the host's Close", pid)
		assert.False(t, processExists(pid), "child %d was not reaped", pid)
	}
}

// TestInheritedDescriptorsDoNotReachDrivers: a file the host process inherited open (without
// close-on-exec) is not open in any driver.
//
// Sequential: it leaves a descriptor without close-on-exec open in the whole process.
func TestInheritedDescriptorsDoNotReachDrivers(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("s3cr3t"), 0o600))
	f, err := os.Open(secret)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	inherited, err := syscall.Dup(int(f.Fd())) // no close-on-exec, like a descriptor from a parent
	require.NoError(t, err)
	defer func() { _ = syscall.Close(inherited) }()

	report := filepath.Join(dir, "fds")
	h, rec := startHost(t, testConfig(t, identityPlugin(t, "nosy", "-report-fds", report)))
	waitStarted(t, h, rec)
	fds, err := os.ReadFile(report)
	require.NoError(t, err)
	assert.NotContains(t, string(fds), secret, "the driver sees the host's inherited descriptor %d", inherited)
}

// TestNoSocketLeftBehind: neither failed starts nor killed workers leave their unix sockets.
func TestNoSocketLeftBehind(t *testing.T) {
	runParallel(t)
	sockets := t.TempDir()
	cfg := testConfig(t, driverPlugin(t, "bad", "-kind", "bogus"), driverPlugin(t, "killed"))
	cfg.SocketDir = sockets
	h, rec := startHost(t, cfg)
	waitFor(t, 30*time.Second, "two failed starts", func() bool { return state(t, h, "bad").Restarts >= 2 })
	waitFor(t, 30*time.Second, "killed ready", func() bool { _, ok := h.Worker("killed"); return ok })
	rec.record(h)
	require.NoError(t, syscall.Kill(state(t, h, "killed").Worker.PID, syscall.SIGKILL))
	waitFor(t, 30*time.Second, "generation 2", func() bool {
		w, ok := h.Worker("killed")
		return ok && w.Generation == 2
	})
	rec.record(h)
	require.NoError(t, h.Close())
	left, err := os.ReadDir(sockets)
	require.NoError(t, err)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	assert.Empty(t, names, "sockets left behind")
}

// readPids reads a file of pids, one a line (bounded wait until it is there).
func readPids(tb testing.TB, path string) []int {
	tb.Helper()
	var b []byte
	waitFor(tb, 10*time.Second, path, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil && len(b) > 0
	})
	var out []int
	for _, f := range strings.Fields(string(b)) {
		out = append(out, hostPID(tb, f))
	}
	return out
}

// TestLeastPrivilege: a driver runs with no_new_privs and the configured resource limits, and
// (when the host may switch users) another as the configured user; both still serve.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestLeastPrivilege(t *testing.T) {
	limited := identityPlugin(t, "limited")
	limited.User = "" // the default
	limited.NoNewPrivileges = true
	limited.ResourceLimits = ResourceLimits{OpenFiles: 200, CPUSeconds: 3600, Processes: 5000}
	plugins := []PluginConfig{limited}
	otherUID := -1
	if nobody, err := user.Lookup("nobody"); err == nil && os.Getuid() == 0 {
		other := identityPlugin(t, "other-user")
		other.User, other.NoNewPrivileges = "nobody", true
		otherUID, _ = strconv.Atoi(nobody.Uid)
		plugins = append(plugins, other)
	}
	h, rec := startHost(t, testConfig(t, plugins...))
	waitStarted(t, h, rec)

	pid := state(t, h, "limited").Worker.PID
	status := procFile(t, pid, "status")
	assert.Contains(t, status, "NoNewPrivs:\t1")
	// Without `user`: the host's own user, or, for a root host, an unprivileged user of the plugin's own.
	if os.Getuid() == 0 {
		uid := state(t, h, "limited").Worker.Containment.UID
		assert.NotZero(t, uid)
		assert.Contains(t, status, "Uid:\t"+strconv.Itoa(uid)+"\t")
	} else {
		assert.Contains(t, status, "Uid:\t"+strconv.Itoa(os.Getuid())+"\t")
	}
	limits := procFile(t, pid, "limits")
	for _, want := range []string{`Max open files\s+200\s+200`, `Max cpu time\s+3600\s+3600`, `Max processes\s+5000\s+5000`} {
		assert.Regexp(t, want, limits)
	}
	if otherUID >= 0 {
		pid := state(t, h, "other-user").Worker.PID
		status := procFile(t, pid, "status")
		assert.Contains(t, status, "Uid:\t"+strconv.Itoa(otherUID)+"\t")
		assert.Contains(t, status, "NoNewPrivs:\t1")
		t.Logf("driver pid %d runs as uid %d", pid, otherUID)
	}
}

// procFile reads /proc/PID/NAME.
func procFile(tb testing.TB, pid int, name string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), name))
	require.NoError(tb, err)
	return string(b)
}

// TestLeastPrivilegeConfig: an unknown user or group is a field error of the configuration.
func TestLeastPrivilegeConfig(t *testing.T) {
	p := identityPlugin(t, "x")
	p.User = "no-such-user-authz"
	q := identityPlugin(t, "y")
	q.Group = "no-such-group-authz"
	err := testConfig(t, p, q).Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), `plugins[0].user: no user "no-such-user-authz"`)
	assert.Contains(t, err.Error(), `plugins[1].user: no group "no-such-group-authz"`)
}

// TestOrphansThatEndAreReaped: the orphans a driver leaves go to the init of its pid
// namespace (the launcher; without a pid namespace, to the host, a child subreaper); those that
// end on their own while the driver runs are reaped, not left as zombies.
//
// Sequential: it checks the child processes of the whole test process.
func TestOrphansThatEndAreReaped(t *testing.T) {
	h, rec := startHost(t, testConfig(t, identityPlugin(t, "orphaner", "-orphans", "10")))
	waitStarted(t, h, rec)
	worker := state(t, h, "orphaner").Worker.PID
	reaper := os.Getpid()
	for _, p := range processTable() {
		if p.pid == worker {
			reaper = p.ppid
		}
	}
	sawOrphan := false
	waitFor(t, 30*time.Second, "every orphan ended and reaped", func() bool {
		n := 0
		for _, p := range processTable() {
			if p.ppid == reaper && p.pid != worker {
				n++
				sawOrphan = true
			}
		}
		return sawOrphan && n == 0
	})
	assert.Equal(t, worker, state(t, h, "orphaner").Worker.PID, "the driver itself still runs")
}
