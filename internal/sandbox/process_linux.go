//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

	"github.com/authz-dev/authz/internal/sandbox/landlock"
	"github.com/authz-dev/authz/internal/sandbox/rlimit"
	"github.com/authz-dev/authz/internal/sandbox/tmpfs"
)

// pipeDrain is how long the host keeps reading a driver's stdout and stderr after the driver
// exited: a child the driver started may hold the pipes open forever.
const pipeDrain = 250 * time.Millisecond

// Spec is what NewProcess builds a contained driver process from.
type Spec struct {
	Log  hclog.Logger
	Path string   // argv[0] the driver sees
	Args []string // the driver's argv[1:]
	Env  []string // the driver's whole environment

	Executable *os.File // the driver's sealed copy, executed by the launcher (its fd 3)
	ExecPath   string   // what to execute when the host has no launcher (the sealed copy, by descriptor)

	NoNewPrivileges bool
	Limits          rlimit.Limits       // set by the launcher before the driver runs; without one, by prlimit
	Rules           landlock.Spec       // the driver's Landlock sandbox
	Credential      *syscall.Credential // nil: the host's user
	Tmpfs           *tmpfs.Spec         // the driver's TMPDIR (Rules.Tmp) as a sized tmpfs, where the host can mount one (and its own /proc: Proc); nil: a plain directory
	CgroupFD        int                 // the worker's cgroup, which the driver starts in; <= 0: none
	Hooks           Hooks
}

// Hooks are what the host does around the process's life; each may be nil. Started, Release
// and Cleanup may run while Start holds the process's mu, and must not call into the process;
// EndDescendants, KillAll and ReapKilled run from Kill with no lock of the process held, and may
// call Pid (see the package doc's lock order).
type Hooks struct {
	// Started says that pid became the host's child: the launcher, then the driver.
	Started func(pid int)
	// Release lets go of the executable: the process was reaped, or will never start. It may
	// come more than once.
	Release func()
	// Cleanup ends and removes what the worker leaves (its cgroup) once nothing of it should
	// run: after its reaping, when it never started, after a Kill that reaped it. It may come
	// more than once.
	Cleanup func()
	// EndDescendants kills every process the host can attribute to the driver, the driver
	// itself aside; Kill calls it before and after killing the driver.
	EndDescendants func()
	// KillAll kills every process of the worker at once (its cgroup), the driver too.
	KillAll func()
	// ReapKilled reaps (bounded) what EndDescendants killed, once the driver is gone.
	ReapKilled func()
}

// Process is one contained driver process, started by the host from its sealed copy through
// the launcher when the host has one (runner.Runner for go-plugin). It watches the process
// itself (a pidfd and wait), not its pipes: the process is gone the moment it exits, whatever
// its children hold.
type Process struct {
	log   hclog.Logger
	cmd   *exec.Cmd
	hooks Hooks

	stdout, stderr *os.File // read ends
	pipesOnce      sync.Once

	noNewPrivs bool
	limits     rlimit.Limits
	seccomp    bool          // started through the launcher, with the seccomp filter
	pidns      bool          // started under an init of its own pid namespace (runInit)
	events     *os.File      // the host's end of the init's events socket; nil: no init
	eventsKid  *os.File      // the init's end, closed once it started
	eventsDone chan struct{} // closed once the init's events socket is at its end
	initFD     int           // pidfd of the init of the driver's namespace; -1: none
	tmpDir     string        // the driver's TMPDIR and socket's directory (Spec.Rules.Tmp)
	tmpRoot    *os.File      // the root of the driver's tmpfs on tmpDir, in the driver's mount namespace; nil: a plain directory
	sizedTmp   bool          // tmpDir is a tmpfs of the driver's own (tmpfs.Spec in the init's environment)
	ownProc    bool          // the driver stage mounts a /proc of the driver's pid namespace (tmpfs.Spec.Proc)
	stopped    atomic.Bool   // the driver stopped and did not continue (the init's report, or the host's own wait)
	exitStatus atomic.Int64  // the driver's wait status as the init reported it; -1: none
	gone       atomic.Bool   // the driver (or its main thread) ended; never cleared (markGone)
	exitWatch  *os.File      // a pidfd of the driver in Go's poller; nil: none
	stat       *os.File      // the driver's /proc/PID/stat, open from its start; nil: none

	mu     sync.Mutex // guards pid (before Start returns) and killed
	pid    int
	killed bool
	exited chan struct{} // closed once the process has exited and was reaped
	state  *os.ProcessState

	fdMu     sync.RWMutex
	pidfd    int
	fdClosed bool
}

var _ runner.Runner = (*Process)(nil)

// NewProcess prepares (does not start) a contained driver process: through the launcher in a
// pid namespace of its own (and a user namespace under a non-root host) when the host has both,
// through the launcher alone when the kernel refuses the namespaces, else (no launcher: the
// program did not call Init, or the kernel has no seccomp) the sealed copy itself, limited by
// prlimit once started. It runs as s.Credential, in its own session, in s.CgroupFD's cgroup.
func NewProcess(s Spec) (*Process, error) {
	c := Host()
	p := &Process{log: s.Log, hooks: s.Hooks, exited: make(chan struct{}), pidfd: -1, initFD: -1,
		noNewPrivs: s.NoNewPrivileges, limits: s.Limits}
	if p.log == nil {
		p.log = hclog.NewNullLogger()
	}
	p.exitStatus.Store(-1)
	var cmd *exec.Cmd
	sandbox := landlock.Arg(s.Rules)
	switch {
	case c.PidNamespaces():
		host, kid, err := eventSocket()
		if err != nil {
			return nil, fmt.Errorf("make the launcher's events socket: %w", err)
		}
		cmd = launcherCommand(c.Launcher, append([]string{launchInitArg, s.Limits.Arg(), sandbox}, s.Args...)...)
		cmd.ExtraFiles = []*os.File{s.Executable, kid} // launchFD, launchEventFD
		p.seccomp, p.pidns, p.events, p.eventsKid, p.eventsDone = true, true, host, kid, make(chan struct{})
	case c.Launcher != "":
		cmd = exec.Command(c.Launcher, append([]string{launchArg, s.Limits.Arg(), sandbox}, s.Args...)...)
		cmd.ExtraFiles = []*os.File{s.Executable} // launchFD
		p.seccomp = true
	default:
		cmd = exec.Command(s.ExecPath, s.Args...)
	}
	cmd.Args[0] = s.Path
	cmd.Env = s.Env
	p.tmpDir = s.Rules.Tmp
	if p.pidns && c.TmpfsErr == nil && s.Tmpfs != nil {
		spec := *s.Tmpfs
		spec.Proc = spec.Proc && c.ProcErr == nil
		cmd.Env = append(append([]string{}, s.Env...), spec.Env())
		p.sizedTmp, p.ownProc = true, spec.Proc
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
	// With a sized tmpfs a root host's init and driver stage become the driver's user once the
	// tmpfs is mounted.
	if s.Credential != nil && (!p.sizedTmp || os.Getuid() != 0) {
		cmd.SysProcAttr.Credential = s.Credential
	}
	if s.CgroupFD > 0 {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = s.CgroupFD
	}
	p.cmd = cmd
	return p, nil
}

// Launched reports whether the process starts through the launcher (limits, Landlock and the
// seccomp filter set before the driver runs).
func (p *Process) Launched() bool { return p.seccomp }

// PidNamespace reports whether the process starts under an init of its own pid namespace.
func (p *Process) PidNamespace() bool { return p.pidns }

// SizedTmp reports whether the driver's TMPDIR is a sized tmpfs of its own.
func (p *Process) SizedTmp() bool { return p.sizedTmp }

// PrivateProc reports whether the driver's /proc is one of its own pid namespace: it sees its
// namespace's processes only.
func (p *Process) PrivateProc() bool { return p.ownProc }

// HostPath turns an address the driver announced in its tmpfs (its socket) into a path the
// host reaches it by: through the host's descriptor of the tmpfs's root, which lies in the
// driver's mount namespace, not in the host's.
func (p *Process) HostPath(addr string) string {
	if p.tmpRoot == nil || filepath.Dir(addr) != filepath.Clean(p.tmpDir) {
		return addr
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", p.tmpRoot.Fd(), filepath.Base(addr))
}

// Done is closed once the process has exited and was reaped.
func (p *Process) Done() <-chan struct{} { return p.exited }

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
func (p *Process) closeEvents() {
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
func (p *Process) driverPID() (int, error) {
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
func (p *Process) credentialsPID(want string) (int, error) {
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
func (p *Process) readEvents() {
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

// Start implements runner.Runner.
func (p *Process) Start(context.Context) error {
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
// copy (hooks.Release), its events socket and its cgroup (hooks.Cleanup).
func (p *Process) releaseStart() {
	p.hook(p.hooks.Release)
	p.closeEvents()
	p.hook(p.hooks.Cleanup)
}

// hook calls h, if it is set.
func (p *Process) hook(h func()) {
	if h != nil {
		h()
	}
}

// startedChild tells hooks.Started that pid is the host's child.
func (p *Process) startedChild(pid int) {
	if p.hooks.Started != nil {
		p.hooks.Started(pid)
	}
}

// run starts the driver from a locked OS thread that lives exactly as long as the driver, and
// then waits for it. Linux ties the parent-death signal to the thread that forked the child, and
// no_new_privs is set on that thread only (it is inherited by the child); the thread is never
// unlocked, so the runtime ends it with this goroutine and no other goroutine runs on it.
func (p *Process) run(started chan<- error) {
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
		p.startedChild(p.pid) // the launcher, the host's child
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
	p.startedChild(p.pid)
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
func (p *Process) applyLimits() error {
	if p.seccomp {
		return nil
	}
	return rlimit.Prlimit(p.pid, p.limits)
}

// cloneCmd returns an unstarted copy of cmd.
func cloneCmd(c *exec.Cmd) *exec.Cmd {
	n := exec.Command(c.Path, c.Args[1:]...)
	n.Args = c.Args
	n.Env, n.Stdin, n.Stdout, n.Stderr, n.SysProcAttr, n.ExtraFiles = c.Env, c.Stdin, c.Stdout, c.Stderr, c.SysProcAttr, c.ExtraFiles
	return n
}

// Pid returns the pid, 0 before Start.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// wait reaps the process, reports it gone at once, and then gives its pipes a short time to
// drain before they are cut: a child holding them cannot keep the worker alive.
func (p *Process) wait() {
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
	p.hook(p.hooks.Release) // the copy stays shared while another worker runs it
	close(p.exited)
	deadline := time.Now().Add(pipeDrain)
	_ = p.stdout.SetReadDeadline(deadline)
	_ = p.stderr.SetReadDeadline(deadline)
	p.hook(p.hooks.Cleanup) // nothing the driver started outlives it
}

// Alive reports whether the process still runs, as the events about it said: its exit (or
// that of its main thread) seen on its pidfd, reported by the init of its namespace or by its
// reaping. It is one atomic load: no lock, no system call, no allocation.
func (p *Process) Alive() bool { return !p.gone.Load() }

// Answering reports whether the process runs and is not stopped (by SIGSTOP or the like), as
// the events about it said (alive; the init's stop and continue reports, or the host's own wait
// on a driver it is the parent of): a stopped process answers nothing, so no decision reads it,
// not even from an answer the host kept of it, while the health check finds it and restarts the
// plugin. Two atomic loads, what every decision reads.
func (p *Process) Answering() bool { return !p.gone.Load() && !p.stopped.Load() }

// Running is a decision's last look at the process, once its facts and its config check were
// read: the events about it (answering), then one read of its line in the process table
// through a descriptor held open from its start (one system call, no lock, no allocation). The
// table says what no event says yet: a main thread that ended (the process was killed and its
// other threads are still being torn down, or it ended alone) or a thread-group leader that
// stopped before the group's stop is complete and reported.
func (p *Process) Running() bool {
	if !p.Answering() {
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
func (p *Process) markGone() { p.gone.Store(true) }

// watchExit watches the driver's exit in Go's poller, through a pidfd that turns readable once
// the process has exited (every thread of it). Without a pidfd, the process's reaping and the
// init's exit report say it.
func (p *Process) watchExit() {
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
func (p *Process) watchStops() {
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

// Probe asks the kernel whether the process still runs: the health check's look, made once per
// health interval, never by a decision. Besides the events it reads the pidfd and the process
// table, and records what it finds ended (a main thread that ended while other threads run, on
// a kernel without PIDFD_THREAD).
func (p *Process) Probe() bool {
	if !p.Alive() {
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

// Release closes the pidfd once the process is gone and nobody needs it any more.
func (p *Process) Release() {
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
func (p *Process) Wait(context.Context) error {
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

// ExitText words how the driver ended, once exited is closed: its own status as the init of
// its namespace reported it, else its process's; "" when unknown.
func (p *Process) ExitText() string {
	if ws := p.exitStatus.Load(); ws >= 0 {
		return waitStatusText(unix.WaitStatus(ws))
	}
	if p.state == nil {
		return ""
	}
	return p.state.String()
}

// Kill implements runner.Runner: it ends the driver and every descendant (through the hooks: its
// whole cgroup, when it has one; else every descendant the host can find), and returns once the
// driver is reaped (bounded). The cgroup is removed (Cleanup) once no process is left in it.
func (p *Process) Kill(ctx context.Context) error {
	p.mu.Lock()
	p.killed = true
	pid := p.pid
	p.mu.Unlock()
	if pid == 0 {
		p.releaseStart() // never started; a Start still to come sees killed
		return nil
	}
	p.hook(p.hooks.EndDescendants)
	p.hook(p.hooks.KillAll)                 // everything in the worker's cgroup, the driver too
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
	p.hook(p.hooks.EndDescendants)
	p.hook(p.hooks.ReapKilled)
	select {
	case <-p.exited:
		p.hook(p.hooks.Cleanup)
	default: // still not reaped: the cgroup goes with a later Kill
	}
	p.closePipes()
	return nil
}

// closePipes closes the read ends of the driver's stdout and stderr.
func (p *Process) closePipes() {
	p.pipesOnce.Do(func() {
		if p.stdout != nil {
			_ = p.stdout.Close()
			_ = p.stderr.Close()
		}
	})
}

// Stdout implements runner.Runner.
func (p *Process) Stdout() io.ReadCloser { return p.stdout }

// Stderr implements runner.Runner.
func (p *Process) Stderr() io.ReadCloser { return p.stderr }

// Name implements runner.Runner.
func (p *Process) Name() string { return p.cmd.Args[0] }

// ID implements runner.Runner.
func (p *Process) ID() string {
	if pid := p.Pid(); pid != 0 {
		return strconv.Itoa(pid)
	}
	return ""
}

// Diagnose implements runner.Runner.
func (p *Process) Diagnose(context.Context) string { return "" }

// PluginToHost implements runner.AddrTranslator: the driver's addresses are the host's (the
// namespaces are pid and user ones; the file system and network are shared). The plugin host
// narrows it to unix sockets.
func (p *Process) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

// HostToPlugin implements runner.AddrTranslator.
func (p *Process) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}
