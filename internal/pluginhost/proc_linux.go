//go:build linux

package pluginhost

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin/runner"
	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/sandbox/landlock"
	"github.com/authz-dev/authz/internal/sandbox/rlimit"
)

// workerMarkerEnv is set in every driver's environment to a token of its worker; descendants
// inherit it, which lets the host find a driver's orphans after they were reparented to it.
const workerMarkerEnv = "AUTHZ_DRIVER_WORKER"

// pipeDrain is how long the host keeps reading a driver's stdout and stderr after the driver
// exited: a child the driver started may hold the pipes open forever.
const pipeDrain = 250 * time.Millisecond

// proc is one driver process, started by the host from its sealed copy (runner.Runner for
// go-plugin). It watches the process itself (a pidfd and wait), not its pipes: the process is
// gone the moment it exits, whatever its children hold.
type proc struct {
	log       hclog.Logger
	cmd       *exec.Cmd
	exe       *pinnedExecutable
	socketDir string
	marker    string
	reaper    *reaper

	stdout, stderr *os.File // read ends
	pipesOnce      sync.Once

	noNewPrivs bool
	limits     ResourceLimits
	cred       *syscall.Credential // nil: the host's user
	seccomp    bool                // started through the launcher, with the seccomp filter
	pidns      bool                // started under an init of its own pid namespace (runInit)
	events     *os.File            // the host's end of the init's events socket; nil: no init
	eventsKid  *os.File            // the init's end, closed once it started
	eventsDone chan struct{}       // closed once the init's events socket is at its end
	initFD     int                 // pidfd of the init of the driver's namespace; -1: none
	tmpRoot    *os.File            // the root of the driver's tmpfs, its TMPDIR and socket's directory; nil: a plain directory
	sizedTmp   bool                // TMPDIR is a tmpfs of the driver's own (tmpfs.Spec in the init's environment)
	stopped    atomic.Bool         // the driver stopped and did not continue (the init's report, or the host's own wait)
	exitStatus atomic.Int64        // the driver's wait status as the init reported it; -1: none
	gone       atomic.Bool         // the driver (or its main thread) ended; never cleared (markGone)
	exitWatch  *os.File            // a pidfd of the driver in Go's poller; nil: none
	stat       *os.File            // the driver's /proc/PID/stat, open from its start; nil: none
	cg         *workerCgroup       // nil: no cgroup (the process tree is all the host sees)
	cgErr      error               // why the worker has no cgroup
	cgOnce     sync.Once           // the cgroup is removed once

	mu     sync.Mutex // guards pid (before Start returns), killed and family
	pid    int
	killed bool
	family map[int]bool  // descendants killed so far, to reap once the driver is gone
	exited chan struct{} // closed once the process has exited and was reaped
	state  *os.ProcessState

	fdMu     sync.RWMutex
	pidfd    int
	fdClosed bool

	addr    atomic.Pointer[string] // the announced unix socket
	peerErr atomic.Pointer[error]  // why a connection was refused
}

var _ runner.Runner = (*proc)(nil)

// newProc prepares (does not start) a driver process: spec carries the environment go-plugin
// built (magic cookie, protocol versions, mTLS certificate, socket directory). The process starts
// through the launcher when the host has one (the seccomp filter, then the sealed copy with the
// configured argv), in a cgroup of its own when the host has cgroups, and as the plugin's user
// (driverCredential).
func newProc(log hclog.Logger, spec *exec.Cmd, exe *pinnedExecutable, cfg PluginConfig, socketDir string, rp *reaper) (*proc, error) {
	marker := make([]byte, 12)
	_, _ = rand.Read(marker)
	c := containment.setUp()
	p := &proc{log: log, exe: exe.ref(), socketDir: socketDir, marker: hex.EncodeToString(marker), reaper: rp, exited: make(chan struct{}), pidfd: -1,
		noNewPrivs: cfg.NoNewPrivileges, limits: cfg.ResourceLimits}
	var cmd *exec.Cmd
	cred, err := driverCredential(cfg)
	if err != nil {
		_ = p.exe.Close()
		return nil, err
	}
	p.limits = withDefaultLimits(cfg.ResourceLimits, c.pidnsErr == nil && c.launcher != "", cred)
	p.exitStatus.Store(-1)
	p.initFD = -1
	write := append(append([]string{}, cfg.Sandbox.WritePaths...), fixtureWritePaths...)
	sandbox := landlock.Arg(landlock.Spec{Tmp: socketDir, Read: cfg.Sandbox.ReadPaths, Write: write, Connect: cfg.Sandbox.ConnectTCP})
	switch {
	case c.launcher != "" && c.pidnsErr == nil:
		host, kid, err := eventSocket()
		if err != nil {
			_ = p.exe.Close()
			return nil, fmt.Errorf("make the launcher's events socket: %w", err)
		}
		cmd = launcherCommand(c.launcher, append([]string{launchInitArg, launchLimits(p.limits), sandbox}, cfg.Args...)...)
		cmd.ExtraFiles = []*os.File{p.exe.file, kid} // launchFD, launchEventFD
		p.seccomp, p.pidns, p.events, p.eventsKid, p.eventsDone = true, true, host, kid, make(chan struct{})
	case c.launcher != "":
		cmd = exec.Command(c.launcher, append([]string{launchArg, launchLimits(p.limits), sandbox}, cfg.Args...)...)
		cmd.ExtraFiles = []*os.File{p.exe.file} // launchFD
		p.seccomp = true
	default:
		cmd = exec.Command(p.exe.execPath(), cfg.Args...)
	}
	cmd.Args[0] = cfg.Path
	// TMPDIR: the worker's private directory, the only one its sandbox lets it write.
	cmd.Env = append(append([]string{}, spec.Env...), workerMarkerEnv+"="+p.marker, "TMPDIR="+socketDir)
	if p.pidns && c.tmpfsErr == nil {
		cmd.Env = append(cmd.Env, tmpfsSpec(socketDir, p.limits, cred).Env())
		p.sizedTmp = true
	}
	cmd.Stdin = nil // /dev/null: the host's stdin is not the driver's
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			// Its own session (and so its own process group, ended as a whole) with no
			// controlling terminal: no /dev/tty of the operator to push input into, no SIGCONT
			// to the host by session membership. launcherCommand does the same.
			Setsid:    true,
			Pdeathsig: syscall.SIGKILL,
		}
	}
	fail := func(err error) (*proc, error) {
		_ = p.exe.Close()
		p.closeEvents()
		p.removeCgroup()
		return nil, err
	}
	if cred != nil {
		if !p.sizedTmp || os.Getuid() != 0 { // else the init and the driver stage become the user once the tmpfs is mounted
			cmd.SysProcAttr.Credential = cred
		}
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
	if p.cg != nil {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = p.cg.fd
	}
	p.cmd = cmd
	return p, nil
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

// eventSocket returns the two ends of the init's events socket (datagrams, in order); the
// host's end receives the sender's credentials.
func eventSocket() (host, kid *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "events"), os.NewFile(uintptr(fds[1]), "events"), nil
}

// closeEvents closes both ends of the events socket, if any.
func (p *proc) closeEvents() {
	if p.eventsKid != nil {
		_ = p.eventsKid.Close()
	}
	if p.events != nil {
		_ = p.events.Close()
	}
}

// launchTimeout bounds the wait for the init to report the driver's pid.
const launchTimeout = 30 * time.Second

// driverPID reads the init's first messages: the init's credentials, then the driver
// stage's, whose pids the kernel translated into the host's pid namespace. It opens a pidfd of
// the init (alive: it waits for the driver).
func (p *proc) driverPID() (int, error) {
	initPID, err := p.credentialsPID("init")
	if err != nil {
		return 0, err
	}
	if fd, err := unix.PidfdOpen(initPID, 0); err == nil {
		p.initFD = fd
	}
	return p.credentialsPID("pid")
}

// credentialsPID reads one message, want, with its sender's credentials, and returns their pid.
func (p *proc) credentialsPID(want string) (int, error) {
	fd := int(p.events.Fd())
	tv := unix.NsecToTimeval(launchTimeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	defer func() { _ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{}) }()
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("the launcher did not report the driver's pid: %w", err)
		}
		if n == 0 {
			return 0, errors.New("the launcher ended before it started the driver")
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if root := receivedTmpRoot(msgs); root != nil && want == "pid" && p.sizedTmp {
			p.tmpRoot = root
		} else if root != nil {
			_ = root.Close()
		}
		if err != nil || len(msgs) < 1 || string(buf[:n]) != want {
			return 0, fmt.Errorf("the launcher's message is not the %s credentials", want)
		}
		for i := range msgs { // the credentials first, before a descriptor
			if msgs[i].Header.Type == unix.SCM_CREDENTIALS {
				msgs[0], msgs[i] = msgs[i], msgs[0]
			}
		}
		cred, err := unix.ParseUnixCredentials(&msgs[0])
		if err != nil || cred.Pid <= 0 {
			return 0, errors.New("the launcher's first message carries no pid")
		}
		return int(cred.Pid), nil
	}
}

// readEvents records the init's reports (stop, continue, exit) until its socket ends.
func (p *proc) readEvents() {
	defer close(p.eventsDone)
	buf := make([]byte, 64)
	for {
		n, err := p.events.Read(buf)
		if err != nil || n == 0 {
			return
		}
		msg := string(buf[:n])
		switch {
		case msg == eventStop:
			p.stopped.Store(true)
		case msg == eventCont:
			p.stopped.Store(false)
		case len(msg) > len(eventExit)+1 && msg[:len(eventExit)+1] == eventExit+" ":
			if ws, err := strconv.ParseUint(msg[len(eventExit)+1:], 10, 32); err == nil {
				p.exitStatus.Store(int64(ws))
			}
			p.markGone()
		}
	}
}

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
	out := &api.Containment{UID: os.Getuid(), GID: os.Getgid(), Seccomp: p.seccomp, PidNamespace: p.pidns, Landlock: p.seccomp && c.landlock == "", Cgroup: p.cg != nil, HostNonDumpable: c.dumpableErr == nil, SizedTmp: p.sizedTmp}
	if p.cred != nil {
		out.UID, out.GID = int(p.cred.Uid), int(p.cred.Gid)
	}
	if c.dumpableErr != nil {
		out.Missing = append(out.Missing, "non-dumpable host: "+c.dumpableErr.Error())
	}
	if !p.seccomp && c.seccompErr != nil {
		out.Missing = append(out.Missing, "seccomp: "+c.seccompErr.Error())
	}
	if !p.pidns && c.pidnsErr != nil {
		out.Missing = append(out.Missing, "pid namespace: "+c.pidnsErr.Error())
	}
	if !p.sizedTmp && c.tmpfsErr != nil {
		out.Missing = append(out.Missing, "sized tmpfs: "+c.tmpfsErr.Error())
	}
	if c.landlock != "" {
		out.Missing = append(out.Missing, c.landlock)
	}
	if p.cg == nil && p.cgErr != nil {
		out.Missing = append(out.Missing, "cgroup: "+p.cgErr.Error())
	}
	return out
}

// Start implements runner.Runner.
func (p *proc) Start(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed {
		p.releaseStart()
		return errors.New("plugin start aborted: the host is closing")
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		p.releaseStart()
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		p.releaseStart()
		return err
	}
	p.cmd.Stdout, p.cmd.Stderr = outW, errW
	p.stdout, p.stderr = outR, errR
	started := make(chan error, 1)
	go p.run(started)
	err = <-started
	_ = outW.Close()
	_ = errW.Close()
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		p.releaseStart()
		return fmt.Errorf("start plugin: %w", err)
	}
	return nil
}

// releaseStart releases what a process that never started holds: its reference to the sealed
// copy and its cgroup.
func (p *proc) releaseStart() {
	_ = p.exe.Close()
	p.closeEvents()
	p.removeCgroup()
}

// run starts the driver from a locked OS thread that lives exactly as long as the driver, and
// then waits for it. Linux ties the parent-death signal to the thread that forked the child, and
// no_new_privs is set on that thread only (it is inherited by the child); the thread is never
// unlocked, so the runtime ends it with this goroutine and no other goroutine runs on it.
func (p *proc) run(started chan<- error) {
	runtime.LockOSThread()
	if p.noNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			started <- fmt.Errorf("set no_new_privs: %w", err)
			return
		}
	}
	var err error
	for try := 0; ; try++ {
		err = p.cmd.Start()
		// A fork elsewhere in the host may briefly hold the copy's writable descriptor open.
		if !errors.Is(err, syscall.ETXTBSY) || try == 20 {
			break
		}
		time.Sleep(10 * time.Millisecond)
		p.cmd = cloneCmd(p.cmd)
	}
	if err != nil {
		started <- err
		return
	}
	p.pid = p.cmd.Process.Pid // read by others under p.mu, which Start holds until started
	if p.pidns {
		_ = p.eventsKid.Close()
		if p.reaper != nil {
			p.reaper.started(p.pid) // the launcher, the host's child
		}
		pid, err := p.driverPID()
		if err != nil {
			close(p.eventsDone) // no reader: the socket is closed by wait
			_ = p.cmd.Process.Kill()
			p.wait()
			started <- err
			return
		}
		p.pid = pid
		go p.readEvents()
	}
	if p.reaper != nil {
		p.reaper.started(p.pid)
	}
	// Not reaped yet, so the pid is still this child's.
	if fd, err := unix.PidfdOpen(p.pid, 0); err == nil {
		p.pidfd = fd
	}
	p.watchExit()
	if f, err := os.Open("/proc/" + strconv.Itoa(p.pid) + "/stat"); err == nil {
		p.stat = f // bound to this process: once it is reaped, reading it fails, whoever gets the pid
	}
	if !p.pidns {
		p.watchStops() // the host is the driver's parent: its stops are reported to the host
	}
	if err := p.applyLimits(); err != nil {
		_ = p.cmd.Process.Kill()
		p.wait()
		started <- err
		return
	}
	started <- nil
	p.wait()
}

// applyLimits sets the configured resource limits on a driver started without the launcher
// (prlimit, right after it started); the launcher sets them itself before the driver runs.
func (p *proc) applyLimits() error {
	if p.seccomp {
		return nil
	}
	return rlimit.Prlimit(p.pid, p.limits.rlimits())
}

// cloneCmd returns an unstarted copy of cmd.
func cloneCmd(c *exec.Cmd) *exec.Cmd {
	n := exec.Command(c.Path, c.Args[1:]...)
	n.Args = c.Args
	n.Env, n.Stdin, n.Stdout, n.Stderr, n.SysProcAttr, n.ExtraFiles = c.Env, c.Stdin, c.Stdout, c.Stderr, c.SysProcAttr, c.ExtraFiles
	return n
}

// started returns the pid, 0 before Start.
func (p *proc) started() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// wait reaps the process, reports it gone at once, and then gives its pipes a short time to
// drain before they are cut: a child holding them cannot keep the worker alive.
func (p *proc) wait() {
	state, _ := p.cmd.Process.Wait()
	p.state = state
	p.markGone()
	if p.events != nil {
		// The init sent the driver's exit before it ended; nothing else holds the socket.
		select {
		case <-p.eventsDone:
		case <-time.After(time.Second):
		}
		_ = p.events.Close()
	}
	_ = p.exe.Close() // the copy stays shared while another worker runs it
	close(p.exited)
	deadline := time.Now().Add(pipeDrain)
	_ = p.stdout.SetReadDeadline(deadline)
	_ = p.stderr.SetReadDeadline(deadline)
	p.removeCgroup() // nothing the driver started outlives it
}

// alive reports whether the process still runs, as the events about it said: its exit (or
// that of its main thread) seen on its pidfd, reported by the init of its namespace or by its
// reaping. It is one atomic load: no lock, no system call, no allocation.
func (p *proc) alive() bool { return !p.gone.Load() }

// answering reports whether the process runs and is not stopped (by SIGSTOP or the like), as
// the events about it said (alive; the init's stop and continue reports, or the host's own wait
// on a driver it is the parent of): a stopped process answers nothing, so no decision reads it,
// not even from an answer the host kept of it, while the health check finds it and restarts the
// plugin. Two atomic loads, what every decision reads.
func (p *proc) answering() bool { return !p.gone.Load() && !p.stopped.Load() }

// running is a decision's last look at the process, once its facts and its config check were
// read: the events about it (answering), then one read of its line in the process table
// through a descriptor held open from its start (one system call, no lock, no allocation). The
// table says what no event says yet: a main thread that ended (the process was killed and its
// other threads are still being torn down, or it ended alone) or a thread-group leader that
// stopped before the group's stop is complete and reported.
func (p *proc) running() bool {
	if !p.answering() {
		return false
	}
	var buf [64]byte // the state letter comes within the first 30 bytes: pid, (comm of at most 16), state
	var n int
	var err error
	if p.stat != nil {
		n, err = p.stat.ReadAt(buf[:], 0) // one pread: the line is longer than buf
	} else {
		n = readProcessStat(p.pid, buf[:])
	}
	// What it finds ended is recorded, so that every later look (Host.Plugin) leaves the
	// worker out too: a main thread that ended (a zombie), a process reaped (the descriptor is
	// bound to it: ESRCH, whoever has the pid now).
	switch statState(buf[:n]) {
	case 0:
		if errors.Is(err, syscall.ESRCH) {
			p.markGone()
		}
		return false
	case 'Z', 'X':
		p.markGone()
		return false
	case 'T', 't':
		return false
	}
	return true
}

// markGone records that the process (or its main thread) ended: from here on no decision reads
// it.
func (p *proc) markGone() { p.gone.Store(true) }

// watchExit watches the driver's exit in Go's poller, through a pidfd that turns readable once
// the process has exited (every thread of it). Without a pidfd, the process's reaping and the
// init's exit report say it.
func (p *proc) watchExit() {
	fd, err := unix.PidfdOpen(p.pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		p.log.Debug("no pidfd to watch the driver's exit; its reaping says it", "error", err)
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return
	}
	p.exitWatch = f // closed by release; read by others only after Start returned
	go func() {
		ended := false
		// Called once at once, then each time the poller reports the pidfd readable: a pidfd
		// the poller cannot take makes Read return an error, and the exit is left to the
		// other events.
		_ = rc.Read(func(fd uintptr) bool {
			ended = pidfdEnded(int(fd))
			return ended
		})
		if ended {
			p.markGone()
		}
		_ = f.Close()
	}()
}

// pidfdEnded reports whether the pidfd is readable: its process (or thread) has ended.
func pidfdEnded(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	for err == unix.EINTR { // a signal to this thread (the runtime's preemption) is no answer
		n, err = unix.Poll(fds, 0)
	}
	return err != nil || n > 0
}

// si_code values of a SIGCHLD (siginfo.h), which golang.org/x/sys/unix does not name.
const (
	cldTrapped   = 4
	cldStopped   = 5
	cldContinued = 6
)

// watchStops follows, for a driver that is the host's own child (no init of its own), its stops
// and continues as the kernel reports them to its parent, until it exits: the exit is left
// unreaped (WNOWAIT) for the process's own wait, and marks it gone.
func (p *proc) watchStops() {
	if p.pidfd < 0 {
		return
	}
	fd, err := unix.FcntlInt(uintptr(p.pidfd), unix.F_DUPFD_CLOEXEC, 0) // its own: release closes p.pidfd
	if err != nil {
		return
	}
	go func() {
		defer func() { _ = unix.Close(fd) }()
		for {
			var info unix.Siginfo
			err := unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WSTOPPED|unix.WCONTINUED|unix.WNOWAIT, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return // reaped: its wait said it
			}
			var consume int
			switch info.Code {
			case cldStopped, cldTrapped:
				p.stopped.Store(true)
				consume = unix.WSTOPPED
			case cldContinued:
				p.stopped.Store(false)
				consume = unix.WCONTINUED
			default: // exited, killed or dumped
				p.markGone()
				return
			}
			// Take the report, so that the next wait blocks until the next one.
			for unix.Waitid(unix.P_PIDFD, fd, &info, consume|unix.WNOHANG, nil) == unix.EINTR {
			}
		}
	}()
}

// probe asks the kernel whether the process still runs: the health check's look, made once per
// health interval, never by a decision. Besides the events it reads the pidfd and the process
// table, and records what it finds ended (a main thread that ended while other threads run, on
// a kernel without PIDFD_THREAD).
func (p *proc) probe() bool {
	if !p.alive() {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
	}
	p.fdMu.RLock()
	defer p.fdMu.RUnlock()
	if p.fdClosed {
		return false
	}
	if p.pidfd >= 0 && p.pidns && pidfdEnded(p.pidfd) {
		p.markGone()
		return false
	}
	if p.pidfd >= 0 && !p.pidns {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, p.pidfd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err != nil || info.Signo != 0 {
			p.markGone()
			return false
		}
	}
	// A main thread that ended shows as a zombie: it runs no code any more.
	if dying(p.pid) {
		p.markGone()
		return false
	}
	return true
}

// dying reports whether the process table shows pid as a zombie (or gone).
func dying(pid int) bool {
	s := processState(pid)
	return s == 0 || s == 'Z' || s == 'X'
}

// processState is the state letter of pid in the process table (R, S, T, Z, …); 0 when it is
// gone or its line cannot be read.
func processState(pid int) byte {
	var buf [64]byte
	return statState(buf[:readProcessStat(pid, buf[:])])
}

// readProcessStat reads the start of pid's /proc/PID/stat into buf and returns its length; 0
// when it cannot be read.
func readProcessStat(pid int, buf []byte) int {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	n, _ := unix.Read(fd, buf)
	_ = unix.Close(fd)
	return max(n, 0)
}

// statState is the state letter of a /proc/PID/stat line (or its start): the field after the
// command's closing parenthesis, the last one of the line's start since the fields after it are
// numbers; 0 when there is none.
func statState(s []byte) byte {
	i := bytes.LastIndexByte(s, ')')
	if i < 0 || len(s) < i+3 {
		return 0
	}
	return s[i+2]
}

// release closes the pidfd once the process is gone and nobody needs it any more.
func (p *proc) release() {
	p.markGone()
	if p.exitWatch != nil {
		_ = p.exitWatch.Close() // ends its watch
	}
	if p.stat != nil {
		_ = p.stat.Close() // a decision reading it meanwhile finishes first (os.File counts its users)
	}
	p.fdMu.Lock()
	defer p.fdMu.Unlock()
	if !p.fdClosed && p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
	}
	if !p.fdClosed && p.initFD >= 0 {
		_ = unix.Close(p.initFD)
	}
	if !p.fdClosed && p.tmpRoot != nil {
		_ = p.tmpRoot.Close()
	}
	p.fdClosed = true
}

// Wait implements runner.Runner.
// go-plugin calls it once it has stopped reading the pipes, which are closed here.
func (p *proc) Wait(context.Context) error {
	<-p.exited
	p.closePipes()
	if ws := p.exitStatus.Load(); ws >= 0 {
		return waitStatusError(unix.WaitStatus(ws))
	}
	if p.state != nil && !p.state.Success() {
		return errors.New(p.state.String())
	}
	return nil
}

// waitStatusError words the driver's wait status as os.ProcessState does; nil for exit 0.
func waitStatusError(ws unix.WaitStatus) error {
	if ws.Exited() && ws.ExitStatus() == 0 {
		return nil
	}
	return errors.New(waitStatusText(ws))
}

// waitStatusText words a wait status as os.ProcessState.String does.
func waitStatusText(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled() && ws.CoreDump():
		return fmt.Sprintf("signal: %v (core dumped)", ws.Signal())
	case ws.Signaled():
		return fmt.Sprintf("signal: %v", ws.Signal())
	}
	return fmt.Sprintf("wait status %#x", uint32(ws))
}

// exitText words how the driver ended, once exited is closed: its own status as the init of
// its namespace reported it, else its process's; "" when unknown.
func (p *proc) exitText() string {
	if ws := p.exitStatus.Load(); ws >= 0 {
		return waitStatusText(unix.WaitStatus(ws))
	}
	if p.state == nil {
		return ""
	}
	return p.state.String()
}

// Kill implements runner.Runner: it ends the driver and every descendant (its whole cgroup, when
// it has one; else every descendant the host can find), and returns once the driver is reaped
// (bounded). The cgroup is removed once no process is left in it.
func (p *proc) Kill(ctx context.Context) error {
	p.mu.Lock()
	p.killed = true
	pid := p.pid
	p.mu.Unlock()
	if pid == 0 {
		p.releaseStart() // never started; a Start still to come sees killed
		return nil
	}
	p.endDescendants()
	if p.cg != nil {
		p.cg.kill() // everything in the worker's cgroup, the driver too
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL) // the process group
	if p.initFD >= 0 {
		// The init of the driver's namespace, which ends everything in it; under a non-root
		// host, its parent (the launcher of runNamespaces) reaps it and exits.
		p.fdMu.RLock()
		if !p.fdClosed {
			_ = unix.PidfdSendSignal(p.initFD, unix.SIGKILL, nil, 0)
		}
		p.fdMu.RUnlock()
		// Let the launcher reap it and exit: killed first, it would leave the init to the
		// host as a zombie nobody waits for.
		t := time.NewTimer(time.Second)
		select {
		case <-p.exited:
		case <-t.C:
		}
		t.Stop()
	}
	_ = p.cmd.Process.Kill()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-ctx.Done():
	case <-t.C:
	}
	// Orphans reparented to the host while the driver died; then reap every descendant killed,
	// all of them the host's children now that the driver is gone.
	p.endDescendants()
	p.mu.Lock()
	family := p.family
	p.family = nil
	p.mu.Unlock()
	reapOrphans(family, 2*time.Second)
	select {
	case <-p.exited:
		p.removeCgroup()
	default: // still not reaped: the cgroup goes with a later Kill
	}
	p.closePipes()
	return nil
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

// closePipes closes the read ends of the driver's stdout and stderr.
func (p *proc) closePipes() {
	p.pipesOnce.Do(func() {
		if p.stdout != nil {
			_ = p.stdout.Close()
			_ = p.stderr.Close()
		}
	})
}

// endDescendants kills every process the host can attribute to this driver, the driver
// itself aside: the other members of its cgroup, and (stopped first, then killed) its tree, its
// process group, and orphans carrying its marker.
func (p *proc) endDescendants() {
	pid := p.started()
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

// Stdout implements runner.Runner.
func (p *proc) Stdout() io.ReadCloser { return p.stdout }

// Stderr implements runner.Runner.
func (p *proc) Stderr() io.ReadCloser { return p.stderr }

// Name implements runner.Runner.
func (p *proc) Name() string { return p.cmd.Args[0] }

// ID implements runner.Runner.
func (p *proc) ID() string {
	if pid := p.started(); pid != 0 {
		return strconv.Itoa(pid)
	}
	return ""
}

// Diagnose implements runner.Runner.
func (p *proc) Diagnose(context.Context) string { return "" }

// PluginToHost implements runner.AddrTranslator: the host talks to a driver over the unix
// socket it announced, never over TCP (a TCP address could be any other process's).
func (p *proc) PluginToHost(network, addr string) (string, string, error) {
	if network != "unix" {
		return "", "", coded.Errorf(coded.IdentityRefused, "driver announced a %q address %q in its handshake; the host accepts only a unix socket (is the driver built with driverplugin.Serve on a unix system?)", network, addr)
	}
	addr = p.hostPath(addr)
	p.addr.Store(&addr)
	return network, addr, nil
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
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", *addr)
	if err != nil {
		return nil, err
	}
	pid, err := peerPID(conn)
	if want := p.started(); err == nil && pid != want {
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
	pid := p.started()
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
