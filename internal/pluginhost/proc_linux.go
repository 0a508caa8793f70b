//go:build linux

package pluginhost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin/runner"
	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/sandbox"
	"github.com/authz-dev/authz/internal/sandbox/landlock"
	"github.com/authz-dev/authz/internal/sandbox/rlimit"
)

// workerMarkerEnv is set in every driver's environment to a token of its worker; descendants
// inherit it, which lets the host find a driver's orphans after they were reparented to it.
const workerMarkerEnv = "AUTHZ_DRIVER_WORKER"

// proc is one driver process: the contained process the sandbox package builds (a
// runner.Runner: start, wait, kill, the events of the launcher's init, liveness), with what
// only the host knows around it: the pinned copy it runs (checkExecutable), the peer check of
// the socket it announced (runner.AddrTranslator, dial), its cgroup and its reaper.
type proc struct {
	*sandbox.Process

	log       hclog.Logger
	exe       *pinnedExecutable
	socketDir string
	marker    string
	reaper    *reaper
	exited    <-chan struct{} // closed once the process has exited and was reaped (Process.Done)

	cred   *syscall.Credential // nil: the host's user
	cg     *workerCgroup       // nil: no cgroup (the process tree is all the host sees)
	cgErr  error               // why the worker has no cgroup
	cgOnce sync.Once           // the cgroup is removed once

	mu     sync.Mutex   // guards family
	family map[int]bool // descendants killed so far, to reap once the driver is gone

	addr    atomic.Pointer[string] // the announced unix socket
	peerErr atomic.Pointer[error]  // why a connection was refused
}

var (
	_ runner.Runner         = (*proc)(nil)
	_ runner.AddrTranslator = (*proc)(nil)
)

// newProc prepares (does not start) a driver process: spec carries the environment go-plugin
// built (magic cookie, protocol versions, mTLS certificate, socket directory). The sandbox
// package builds it (through the launcher when the host has one: limits, Landlock, the seccomp
// filter, then the sealed copy with the configured argv); it starts in a cgroup of its own when
// the host has cgroups, and as the plugin's user (driverCredential).
func newProc(log hclog.Logger, spec *exec.Cmd, exe *pinnedExecutable, cfg PluginConfig, socketDir string, rp *reaper) (*proc, error) {
	marker := make([]byte, 12)
	_, _ = rand.Read(marker)
	c := containment.setUp()
	p := &proc{log: log, exe: exe.ref(), socketDir: socketDir, marker: hex.EncodeToString(marker), reaper: rp}
	fail := func(err error) (*proc, error) {
		_ = p.exe.Close()
		p.removeCgroup()
		return nil, err
	}
	cred, err := driverCredential(cfg)
	if err != nil {
		return fail(err)
	}
	limits := withDefaultLimits(cfg.ResourceLimits, c.PidNamespaces(), cred)
	if cred != nil {
		p.cred = cred
		// The driver creates its socket in the directory go-plugin made for this start.
		if err := os.Chown(socketDir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(fmt.Errorf("hand the socket directory to the driver's user: %w", err))
		}
		if parent := filepath.Dir(socketDir); int(cred.Uid) != os.Getuid() {
			if fi, err := os.Stat(parent); err == nil && fi.Mode().Perm()&0o001 == 0 {
				return fail(fmt.Errorf("the driver's user (uid %d) cannot reach its socket in %s (mode %s): set TMPDIR to a directory others may search, such as /tmp", cred.Uid, parent, fi.Mode().Perm()))
			}
		}
	}
	cgLimits := cfg.ResourceLimits.MemoryMax != 0 || cfg.ResourceLimits.PidsMax != 0
	switch {
	case c.cgroups != nil:
		p.cg, p.cgErr = c.cgroups.newWorker(cgroupName(cfg.ID)+"."+p.marker, cfg.ResourceLimits)
	default:
		p.cgErr = c.cgroupErr
	}
	if p.cgErr != nil && cgLimits {
		return fail(coded.Errorf(coded.StartFailed, "the driver's cgroup limits cannot be applied: %w", p.cgErr))
	}
	cgroupFD := 0
	if p.cg != nil {
		cgroupFD = p.cg.fd
	}
	write := append(append([]string{}, cfg.Sandbox.WritePaths...), fixtureWritePaths...)
	sp, err := sandbox.NewProcess(sandbox.Spec{
		Log:  log,
		Path: cfg.Path,
		Args: cfg.Args,
		// TMPDIR: the worker's private directory, the only one its sandbox lets it write.
		Env:             append(append([]string{}, spec.Env...), workerMarkerEnv+"="+p.marker, "TMPDIR="+socketDir),
		Executable:      p.exe.file,
		ExecPath:        p.exe.execPath(),
		NoNewPrivileges: cfg.NoNewPrivileges,
		Limits:          limits.rlimits(),
		Rules:           landlock.Spec{Tmp: socketDir, Read: cfg.Sandbox.ReadPaths, Write: write, Connect: cfg.Sandbox.ConnectTCP},
		Credential:      cred,
		Tmpfs:           tmpfsSpec(c, socketDir, limits, cred),
		CgroupFD:        cgroupFD,
		Hooks: sandbox.Hooks{
			Started:        p.startedChild,
			Release:        func() { _ = p.exe.Close() },
			Cleanup:        p.removeCgroup,
			EndDescendants: p.endDescendants,
			KillAll:        p.killCgroup,
			ReapKilled:     p.reapKilled,
		},
	})
	if err != nil {
		return fail(err)
	}
	p.Process, p.exited = sp, sp.Done()
	return p, nil
}

// rlimits are the limits of l the kernel sets with setrlimit (the cgroup's are set apart).
func (l ResourceLimits) rlimits() rlimit.Limits {
	return rlimit.Limits{
		AddressSpaceBytes: l.AddressSpaceBytes, Processes: l.Processes, OpenFiles: l.OpenFiles,
		DataBytes: l.DataBytes, FileSizeBytes: l.FileSizeBytes, CPUSeconds: l.CPUSeconds,
	}
}

// withDefaultLimits fills in the default limits: RLIMIT_FSIZE, RLIMIT_DATA, RLIMIT_NOFILE and the
// tmpfs's size always, RLIMIT_NPROC where it
// counts only the driver (a user namespace of its own under a non-root host, a uid of its own
// under a root one; root's own limit the kernel ignores).
func withDefaultLimits(l ResourceLimits, pidns bool, cred *syscall.Credential) ResourceLimits {
	if l.FileSizeBytes == 0 {
		l.FileSizeBytes = DefaultFileSizeBytes
	}
	if l.DataBytes == 0 {
		l.DataBytes = DefaultDataBytes
	}
	if l.TempDirBytes == 0 {
		l.TempDirBytes = DefaultTempDirBytes
	}
	if l.OpenFiles == 0 {
		l.OpenFiles = DefaultOpenFiles
		// Never above the host's own hard limit: a launcher not running as root may not raise
		// it, and the driver would not start (a service under `ulimit -n 128`).
		var host unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &host) == nil && host.Max < l.OpenFiles {
			l.OpenFiles = host.Max
		}
	}
	ownUID := cred != nil && int(cred.Uid) != os.Getuid() && cred.Uid != 0
	if l.Processes == 0 && (ownUID || pidns && os.Getuid() != 0) {
		l.Processes = DefaultProcesses
	}
	return l
}

// fixtureWritePaths are added to every driver's writable paths; set only by this package's
// tests, whose fixture drivers write the tests' files (state, pid files, impostor binaries).
var fixtureWritePaths []string

// cgroupName turns a plugin id into a cgroup name: letters, digits, '-' and '_' are kept, any
// other byte becomes '_', and it is cut to a length the file system takes.
func cgroupName(id string) string {
	b := []byte(id)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// containment reports how the worker is contained.
func (p *proc) containment() *api.Containment {
	c := containment.setUp()
	seccomp, pidns := p.Launched(), p.PidNamespace()
	out := &api.Containment{UID: os.Getuid(), GID: os.Getgid(), Seccomp: seccomp, PidNamespace: pidns, Landlock: seccomp && c.Landlock == "", Cgroup: p.cg != nil, HostNonDumpable: c.DumpableErr == nil, SizedTmp: p.SizedTmp(), PrivateProc: p.PrivateProc()}
	if p.cred != nil {
		out.UID, out.GID = int(p.cred.Uid), int(p.cred.Gid)
	}
	if c.DumpableErr != nil {
		out.Missing = append(out.Missing, "non-dumpable host: "+c.DumpableErr.Error())
	}
	if !seccomp && c.SeccompErr != nil {
		out.Missing = append(out.Missing, "seccomp: "+c.SeccompErr.Error())
	}
	if !pidns && c.PidnsErr != nil {
		out.Missing = append(out.Missing, "pid namespace: "+c.PidnsErr.Error())
	}
	if !p.SizedTmp() && c.TmpfsErr != nil {
		out.Missing = append(out.Missing, "sized tmpfs: "+c.TmpfsErr.Error())
	}
	if !p.PrivateProc() && (c.ProcErr != nil || c.TmpfsErr != nil) {
		err := c.ProcErr
		if err == nil {
			err = c.TmpfsErr // the /proc goes in the tmpfs's mount namespace
		}
		out.Missing = append(out.Missing, "private /proc: "+err.Error())
	}
	if c.Landlock != "" {
		out.Missing = append(out.Missing, c.Landlock)
	}
	if p.cg == nil && p.cgErr != nil {
		out.Missing = append(out.Missing, "cgroup: "+p.cgErr.Error())
	}
	return out
}

// started returns the pid, 0 before Start.
func (p *proc) started() int { return p.Pid() }

// alive reports whether the process still runs, as the events about it said (Process.Alive:
// one atomic load).
func (p *proc) alive() bool { return p.Alive() }

// answering reports whether the process runs and is not stopped, as the events about it said
// (Process.Answering: two atomic loads, what every decision reads).
func (p *proc) answering() bool { return p.Answering() }

// running is a decision's last look at the process (Process.Running: the events, then one
// pread of its process table line).
func (p *proc) running() bool { return p.Running() }

// probe is the health check's look at the process (Process.Probe).
func (p *proc) probe() bool { return p.Probe() }

// release closes the process's descriptors once it is gone (Process.Release).
func (p *proc) release() { p.Release() }

// exitText words how the driver ended, once exited is closed; "" when unknown.
func (p *proc) exitText() string { return p.ExitText() }

// startedChild tells the reaper that pid (the launcher, then the driver) is the host's child.
func (p *proc) startedChild(pid int) {
	if p.reaper != nil {
		p.reaper.started(pid)
	}
}

// killCgroup kills everything in the worker's cgroup, the driver too.
func (p *proc) killCgroup() {
	if p.cg != nil {
		p.cg.kill()
	}
}

// reapKilled reaps every descendant killed, all of them the host's children once the driver is
// gone.
func (p *proc) reapKilled() {
	p.mu.Lock()
	family := p.family
	p.family = nil
	p.mu.Unlock()
	reapOrphans(family, 2*time.Second)
}

// removeCgroup waits (bounded) until the worker's cgroup is empty, reaps the host's zombie
// children that were in it, and removes it.
func (p *proc) removeCgroup() {
	if p.cg == nil {
		return
	}
	p.cgOnce.Do(func() {
		p.cg.kill()
		if !p.cg.waitEmpty(5 * time.Second) {
			p.log.Warn("processes are left in the driver's cgroup after it was killed", "cgroup", p.cg.dir)
		}
		if p.reaper != nil {
			p.reaper.reapCgroup(p.cg.rel)
		}
		p.cg.remove()
	})
}

// endDescendants kills every process the host can attribute to this driver, the driver
// itself aside: the other members of its cgroup, and (stopped first, then killed) its tree, its
// process group, and orphans carrying its marker.
func (p *proc) endDescendants() {
	pid := p.Pid()
	if pid == 0 {
		return
	}
	if p.cg != nil { // the whole cgroup but the driver, however its members escaped the process tree
		p.cg.killExcept(pid)
	}
	if p.reaper == nil {
		return
	}
	killed := p.reaper.endFamily(pid, p.marker)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.family == nil {
		p.family = map[int]bool{}
	}
	for k := range killed {
		p.family[k] = true
	}
}

// PluginToHost implements runner.AddrTranslator: the host talks to a driver over the unix
// socket it announced, never over TCP (a TCP address could be any other process's), and only
// over a socket file directly inside the socket directory made for this start. Another address
// (an abstract one, a path with "..", one in another directory) is refused before any
// connection: it could name a socket the driver's sandbox hides from the driver itself.
func (p *proc) PluginToHost(network, addr string) (string, string, error) {
	if network != "unix" {
		return "", "", coded.Errorf(coded.IdentityRefused, "driver announced a %q address %q in its handshake; the host accepts only a unix socket (is the driver built with driverplugin.Serve on a unix system?)", network, addr)
	}
	if !inSocketDir(p.socketDir, addr) {
		return "", "", coded.Errorf(coded.IdentityRefused, "driver announced the unix socket %s in its handshake; the host accepts only a socket file directly inside the worker's socket directory %s "+
			"(a plain name: no abstract address, no \"..\", no other directory), and connects to no other", quoteShort(addr), p.socketDir)
	}
	addr = p.HostPath(addr)
	p.addr.Store(&addr)
	return network, addr, nil
}

// inSocketDir reports whether addr is dir followed by one plain file name: not abstract, not
// ".", "..", empty or holding a '/' or a NUL byte.
func inSocketDir(dir, addr string) bool {
	if dir == "" || strings.HasPrefix(addr, "@") || strings.ContainsRune(addr, 0) {
		return false
	}
	prefix := dir
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	name, ok := strings.CutPrefix(addr, prefix)
	return ok && name != "" && name != "." && name != ".." && !strings.Contains(name, "/")
}

// HostToPlugin implements runner.AddrTranslator.
func (p *proc) HostToPlugin(network, addr string) (string, string, error) { return network, addr, nil }

// dial connects to the announced socket and accepts the connection only when the process at
// the other end is this driver process (SO_PEERCRED).
func (p *proc) dial(ctx context.Context, _ string) (net.Conn, error) {
	addr := p.addr.Load()
	if addr == nil {
		return nil, coded.Errorf(coded.IdentityRefused, "driver announced no address")
	}
	// The name is the driver's to choose, in a directory it writes: a symbolic link there could
	// point the host at any socket. The host opens the name without following a link, checks
	// that it is a socket, and connects through that descriptor.
	fd, err := unix.Open(*addr, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = unix.Close(fd) }()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		var err error = coded.Errorf(coded.IdentityRefused, "the name %s the driver announced is not a socket (mode %#o; a symbolic link is not followed): refusing to connect", *addr, st.Mode&unix.S_IFMT)
		p.peerErr.CompareAndSwap(nil, &err)
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, err
	}
	pid, err := peerPID(conn)
	if want := p.Pid(); err == nil && pid != want {
		err = coded.Errorf(coded.IdentityRefused, "the socket %s the driver announced is served by pid %d, not by the driver (pid %d): refusing to talk to another process", *addr, pid, want)
	}
	if err != nil {
		_ = conn.Close()
		p.peerErr.CompareAndSwap(nil, &err)
		return nil, err
	}
	return conn, nil
}

// refused returns why a connection to the driver was refused, if one was.
func (p *proc) refused() error {
	if e := p.peerErr.Load(); e != nil {
		return *e
	}
	return nil
}

// checkExecutable confirms that the process still runs the sealed copy it was started from:
// a driver that execve'd another program is not the pinned driver any more.
func (p *proc) checkExecutable() error {
	pid := p.Pid()
	dev, ino, err := exeIdentity(pid)
	if err != nil {
		return coded.Errorf(coded.IdentityRefused, "cannot confirm what driver pid %d runs: %w", pid, err)
	}
	if dev != p.exe.dev || ino != p.exe.ino {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		return coded.Errorf(coded.IdentityRefused, "driver pid %d no longer runs the pinned binary (it runs %q): a pinned driver must not exec another program", pid, target)
	}
	return nil
}

// peerPID returns the pid of the process at the other end of a unix socket.
func peerPID(conn net.Conn) (int, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("not a unix socket: %T", conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("read the peer credentials of the driver socket: %w", credErr)
	}
	return int(cred.Pid), nil
}
