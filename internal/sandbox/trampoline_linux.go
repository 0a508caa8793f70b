//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/sandbox/landlock"
	"github.com/authz-dev/authz/internal/sandbox/rlimit"
	"github.com/authz-dev/authz/internal/sandbox/seccomp"
	"github.com/authz-dev/authz/internal/sandbox/tmpfs"
)

// launchArg is the first argument that makes the host's own executable the driver launcher:
// started by the host in the driver's place, it sets the driver's resource limits, installs the
// seccomp filter and executes the driver. Go cannot run code in a child between fork and exec,
// so the host executes itself (/proc/self/exe in the child) with
//
//	argv: [driver argv[0], launchArg, limits, sandbox, driver argv[1:]...]   fd 3: the sealed copy
//
// (limits as rlimit.Limits.Arg writes them, sandbox as landlock.Arg does) and the launcher, once limited and filtered, executes
// fd 3 with the driver's own argv and environment.
// A program is a launcher once it called Init first thing in main; no other argument or
// environment variable makes it one.
const launchArg = "--authz-driver-launch"

// launchFD is the descriptor of the driver's sealed copy in the launcher.
const launchFD = 3

// launcherExitCode is the launcher's exit status when it cannot filter or execute the driver.
const launcherExitCode = 126

// launchInitArg makes the host's executable the init of a driver's pid namespace:
//
//	argv: [driver argv[0], launchInitArg, limits, sandbox, driver argv[1:]...]   fd 3: the sealed copy, fd 4: events
//
// It forks the driver stage (launchChildArg: the launcher above, which first sends its own
// credentials over fd 4, so that the host learns the driver's pid in the host's pid
// namespace), stays pid 1 (never executes the driver itself), reaps every process of the
// namespace, and reports the driver's stops, continues and exit over fd 4. When it ends (the
// driver exited, or its parent-death signal came with the host's death), the kernel kills every
// process left in the namespace: nothing a driver starts outlives it, whatever it does to its
// own parent-death signal.
const launchInitArg = "--authz-driver-init"

// launchChildArg is the driver stage started by the init: limits, credentials on fd 4, seccomp,
// then the driver.
const launchChildArg = "--authz-driver-launch-child"

// launchProbeArg makes the launcher exit 0 at once: the host starts it once in new namespaces
// to learn whether the kernel allows them.
const launchProbeArg = "--authz-driver-probe"

// launchNSArg makes the host's executable the parent of a driver's namespaces when the host is
// not root: a user namespace is made by the parent writing the child's uid map, which a
// non-dumpable host (see hostContainment) cannot do. This launcher, freshly executed and so
// dumpable, starts the rest of its argv (the init, or the probe) in new user and pid
// namespaces, makes itself non-dumpable, and exits with its child's status; its parent-death
// signal and the child's chain the host's death down to the init.
const launchNSArg = "--authz-driver-ns"

// launchEventFD is the descriptor of the events socket in the init and the driver stage.
const launchEventFD = 4

// Events the init sends the host, one per datagram.
const (
	eventStop = "stop"
	eventCont = "cont"
	eventExit = "exit" // "exit N": N is the driver's wait status
)

// launcherRegistered is set by initLauncher: this program dispatches the launcher's arguments
// before anything else runs, so the host may start drivers through it.
var launcherRegistered atomic.Bool

// initLauncher makes this program the driver launcher (Init): started with a launcher
// argument, it runs the launcher and exits; otherwise it registers the launcher and returns. A
// host in a program that did not call it starts drivers without the launcher (no seccomp
// filter, pid namespace or Landlock) and says so in its start-up WARN.
func initLauncher() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case launchArg:
			os.Exit(runLauncher(os.Args, false))
		case launchChildArg:
			os.Exit(runLauncher(os.Args, true))
		case launchInitArg:
			os.Exit(runInit(os.Args))
		case launchNSArg:
			os.Exit(runNamespaces(os.Args))
		case launchProbeArg:
			os.Exit(0)
		case launchProbeTmpfsArg:
			os.Exit(runProbeTmpfs(os.Args))
		}
	}
	launcherRegistered.Store(true)
}

// runNamespaces starts argv[2:] in new user and pid namespaces and returns its exit status.
func runNamespaces(args []string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "authz driver launcher: %v; the driver was not started\n", err)
		return launcherExitCode
	}
	if len(args) < 3 {
		return fail(fmt.Errorf("want what to start"))
	}
	cmd := exec.Command("/proc/self/exe", args[2:]...)
	cmd.Args[0] = args[0]
	cmd.Env = os.Environ()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if args[2] == launchInitArg {
		exe, events := os.NewFile(launchFD, "driver"), os.NewFile(launchEventFD, "events")
		cmd.ExtraFiles = []*os.File{exe, events}
		defer func() { _ = exe.Close(); _ = events.Close() }()
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: initDeathSignal}
	namespaceAttr(cmd.SysProcAttr)
	if _, tmp := os.LookupEnv(tmpfs.Env); tmp || args[2] == launchProbeTmpfsArg {
		// The init keeps CAP_SYS_ADMIN of the new user namespace across its execve: the driver
		// stage it starts in a mount namespace of its own mounts the driver's tmpfs with it.
		cmd.SysProcAttr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN}
	}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start the driver's namespaces: %w", err))
	}
	// From here on the driver (the same user) may not open this process's memory.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	for _, f := range cmd.ExtraFiles {
		_ = f.Close()
	}
	err := cmd.Wait()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return launcherExitCode
	}
	return 0
}

// initDeathSignal is the parent-death signal of the init: caught (SIGKILL would leave the
// worker's private directory behind), it ends the namespace and removes the directory.
const initDeathSignal = syscall.SIGTERM

// sandboxTmp is the private directory of the launcher's sandbox argument, "" when none.
func sandboxTmp(arg string) string { return landlock.Tmp(arg) }

// removeTmp removes the worker's private directory, where its name says it is one (go-plugin's
// "plugin-dir" prefix): never a directory the argument names by mistake.
func removeTmp(dir string) {
	if dir != "" && strings.HasPrefix(filepath.Base(dir), "plugin-dir") {
		_ = removeAllOwned(dir)
	}
}

// removeAllOwned removes dir and everything in it, also what its owner made unreadable or
// nested past PATH_MAX: a driver that left a folder of mode 000 (or 0300) in its directory, or a
// tree thousands of folders deep, kept os.RemoveAll out of it, and the directory outlived its
// worker. removeTree then removes it by descriptors, opening each folder up; the caller owns
// them (the init runs as the driver's owner in its user namespace, or as root), after everything
// of the driver was killed.
func removeAllOwned(dir string) error {
	if os.RemoveAll(dir) == nil {
		return nil
	}
	return removeTree(dir)
}

// runInit is the init of a driver's pid namespace; it returns the driver's exit status (128+N
// when signal N ended it).
func runInit(args []string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "authz driver launcher: %v; the driver was not started\n", err)
		return launcherExitCode
	}
	// The driver (often the same user) may not open this process's memory to lie in its name.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail(fmt.Errorf("make the launcher non-dumpable: %w", err))
	}
	if len(args) < 3 {
		return fail(fmt.Errorf("want the limits argument"))
	}
	if err := sendCredentials("init"); err != nil {
		return fail(fmt.Errorf("tell the host the launcher's pid: %w", err))
	}
	// The worker's private directory goes with the worker, also when the host was killed: its
	// death reaches this process as initDeathSignal, which ends the namespace's processes first
	// (so that none keeps writing there), then removes the directory.
	tmp := sandboxTmp(args[3])
	died := make(chan os.Signal, 1)
	signal.Notify(died, initDeathSignal)
	go func() {
		<-died
		if os.Getpid() == 1 { // kill(-1) reaches only this namespace's processes
			_ = unix.Kill(-1, unix.SIGKILL)
		}
		removeTmp(tmp)
		os.Exit(128 + int(initDeathSignal))
	}()
	defer removeTmp(tmp)
	cmd := exec.Command("/proc/self/exe", append([]string{launchChildArg}, args[2:]...)...)
	cmd.Args[0] = args[0]
	cmd.Env = os.Environ()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	exe, events := os.NewFile(launchFD, "driver"), os.NewFile(launchEventFD, "events")
	cmd.ExtraFiles = []*os.File{exe, events}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	spec, sized, err := tmpfs.FromEnv()
	if err != nil {
		return fail(err)
	}
	if sized {
		// The driver stage mounts the driver's tmpfs in a mount namespace of its own (this
		// process stays in the host's, where it removes the worker's directory at the end).
		cmd.SysProcAttr.Cloneflags |= tmpfs.Cloneflags // cmd.Env keeps the spec for it
	}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start the driver: %w", err))
	}
	if sized {
		if err := dropInitPrivileges(spec); err != nil {
			_ = cmd.Process.Kill()
			return fail(err)
		}
	}
	_ = exe.Close()
	driver := cmd.Process.Pid
	send := func(msg string) { _, _ = events.Write([]byte(msg)) }
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WUNTRACED|unix.WCONTINUED, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil { // ECHILD: nothing left (cannot happen before the driver's exit is seen)
			return launcherExitCode
		}
		if pid != driver {
			continue // an orphan of the driver, reaped
		}
		switch {
		case ws.Stopped():
			send(eventStop)
		case ws.Continued():
			send(eventCont)
		case ws.Exited(), ws.Signaled():
			send(eventExit + " " + strconv.FormatUint(uint64(ws), 10))
			if os.Getpid() == 1 { // what the driver left, before its directory goes
				_ = unix.Kill(-1, unix.SIGKILL)
			}
			if ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return ws.ExitStatus()
		}
	}
}

// runLauncher is the launcher; it returns only when it failed. As the driver stage of an init
// (child), it sends its credentials over the events socket first.
func runLauncher(args []string, child bool) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "authz driver launcher: %v; the driver was not started\n", err)
		return launcherExitCode
	}
	if len(args) < 4 {
		return fail(fmt.Errorf("want the limits and sandbox arguments"))
	}
	if err := rlimit.Set(args[2]); err != nil {
		return fail(err)
	}
	spec, tmp, err := tmpfs.FromEnv()
	if err != nil {
		return fail(err)
	}
	tmpRoot := -1
	if tmp && child {
		if tmpRoot, err = tmpfs.Mount(spec); err != nil {
			return fail(err)
		}
		if spec.Proc {
			if err := tmpfs.MountProc(); err != nil {
				return fail(err)
			}
		}
	}
	if child {
		// With the tmpfs's root: the host reaches the driver's socket through it.
		if err := sendCredentials("pid", tmpRoot); err != nil {
			return fail(fmt.Errorf("tell the host the driver's pid: %w", err))
		}
		_ = unix.Close(launchEventFD)
	}
	if tmpRoot >= 0 {
		_ = unix.Close(tmpRoot)
		runtime.LockOSThread() // never unlocked: this thread executes the driver
		if err := tmpfs.DropPrivileges(spec); err != nil {
			return fail(err)
		}
		// A change of user clears the parent-death signal; the init's end ends the namespace
		// anyway, this ends the driver stage at once.
		_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0)
	}
	if err := landlock.Apply(args[3]); err != nil {
		return fail(err)
	}
	if err := seccomp.Install(landlock.ConnectsTCP(args[3])); err != nil {
		return fail(err)
	}
	// Resolved by execve before the descriptor closes: the driver does not inherit it.
	unix.CloseOnExec(launchFD)
	argv := append([]string{args[0]}, args[4:]...)
	err = unix.Exec(fmt.Sprintf("/proc/self/fd/%d", launchFD), argv, os.Environ())
	return fail(fmt.Errorf("execute the driver: %w", err))
}

// sendCredentials sends msg with this process's credentials over the events socket: the kernel
// writes the sender's pid as the receiving host sees it. A descriptor fd >= 0 goes with it.
func sendCredentials(msg string, fd ...int) error {
	oob := unix.UnixCredentials(&unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})
	if len(fd) == 1 && fd[0] >= 0 {
		oob = append(oob, unix.UnixRights(fd[0])...)
	}
	return unix.Sendmsg(launchEventFD, []byte(msg), oob, nil, 0)
}

// launchProbeTmpfsArg makes the launcher, in the namespaces of a driver's init, start a child
// in a mount namespace of its own that mounts a tmpfs on argv[2] and then a procfs on /proc as
// a driver stage does, and exit with its status: the host starts it once to learn whether the
// kernel allows them.
const launchProbeTmpfsArg = "--authz-driver-probe-tmpfs"

// probeNoProcExitCode is the tmpfs probe's exit status when the tmpfs was mounted but the
// kernel refused the procfs (a container runtime's /proc with masked paths makes it refuse a
// user namespace a new one).
const probeNoProcExitCode = 3

// runProbeTmpfs is the tmpfs probe; the child (argv[3] set) mounts, its parent starts it.
func runProbeTmpfs(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "want the directory to mount on")
		return launcherExitCode
	}
	if len(args) > 3 {
		if err := tmpfs.Probe(args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return launcherExitCode
		}
		if err := tmpfs.MountProc(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return probeNoProcExitCode
		}
		return 0
	}
	cmd := exec.Command("/proc/self/exe", launchProbeTmpfsArg, args[2], "child")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: tmpfs.Cloneflags, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == probeNoProcExitCode {
			return probeNoProcExitCode
		}
		fmt.Fprintf(os.Stderr, "a mount namespace for the driver: %v\n", err)
		return launcherExitCode
	}
	return 0
}

// dropInitPrivileges makes the init of a root host's driver of another user that user, once
// it started the driver stage as root (to mount the tmpfs): it holds no privilege the driver
// lacks, as when it is started as that user. The parent-death signal, which the change of user
// clears, is set again (and raised when the host died meanwhile).
func dropInitPrivileges(spec tmpfs.Spec) error {
	if os.Getuid() != 0 || spec.UID == 0 {
		return nil
	}
	parent := os.Getppid()
	if err := tmpfs.DropPrivileges(spec); err != nil {
		return err
	}
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(initDeathSignal), 0, 0, 0); err != nil {
		return fmt.Errorf("set the init's parent-death signal: %w", err)
	}
	if os.Getppid() != parent {
		_ = unix.Kill(os.Getpid(), initDeathSignal)
	}
	return nil
}
