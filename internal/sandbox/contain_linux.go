//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/sandbox/landlock"
	"github.com/authz-dev/authz/internal/sandbox/seccomp"
)

// Containment is what this process, as a host of drivers, has set up to keep drivers out of
// its reach, once, at the first Host.Start: the host is not dumpable (no process without
// CAP_SYS_PTRACE may open its /proc/PID/mem, /proc/PID/fd or attach to it), drivers start
// through the launcher (resource limits and a seccomp filter); the plugin host adds cgroups.
type Containment struct {
	DumpableErr  error    // why the host could not be made non-dumpable
	Launcher     string   // the executable drivers start through; "": none
	launcherCopy *os.File // a sealed copy of the host's executable, when others may not run the file
	SeccompErr   error    // why drivers start without the seccomp filter
	PidnsErr     error    // why drivers start without a pid namespace of their own
	TmpfsErr     error    // why a driver's TMPDIR is a plain directory, not a sized tmpfs of its own
	ProcErr      error    // why a driver sees the machine's /proc, not one of its own pid namespace
	Landlock     string   // what of the Landlock sandbox the kernel lacks; "": nothing
}

var (
	hostOnce sync.Once
	host     Containment
)

// Host sets the host up once per process and returns what it set up.
func Host() *Containment {
	hostOnce.Do(host.setUp)
	return &host
}

// setUp sets the host up.
func (c *Containment) setUp() {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		c.DumpableErr = fmt.Errorf("make the host non-dumpable: %w", err)
	}
	c.SeccompErr = seccomp.Available()
	if c.SeccompErr == nil && !launcherRegistered.Load() {
		c.SeccompErr = errors.New("no driver launcher: the program did not call sandbox.Init first in main")
	}
	if c.SeccompErr == nil {
		c.Launcher, c.launcherCopy, c.SeccompErr = findLauncher()
	}
	if c.Launcher != "" {
		c.PidnsErr = probeNamespaces(c.Launcher)
	} else {
		c.PidnsErr = fmt.Errorf("no launcher: %w", c.SeccompErr)
	}
	c.TmpfsErr, c.ProcErr = c.PidnsErr, c.PidnsErr
	if c.PidnsErr == nil {
		c.TmpfsErr, c.ProcErr = probeTmpfs(c.Launcher)
	}
	c.Landlock = landlock.Missing()
	if c.Launcher == "" {
		c.Landlock = "Landlock (no launcher to apply it)"
	}
}

// PidNamespaces reports whether drivers start under an init of their own pid namespace.
func (c *Containment) PidNamespaces() bool { return c.Launcher != "" && c.PidnsErr == nil }

// findLauncher returns the path drivers start through: /proc/self/exe, which in the forked
// child is the host's own executable (the running inode, even when the file was replaced since);
// when others may not execute it (a driver runs as another user), a sealed in-memory copy of it.
func findLauncher() (string, *os.File, error) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return "", nil, fmt.Errorf("open the host's executable to launch drivers: %w", err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return "", nil, fmt.Errorf("stat the host's executable: %w", err)
	}
	if fi.Mode().Perm()&0o005 == 0o005 {
		return "/proc/self/exe", nil, nil
	}
	c, _, _, err := SealedCopy(f, "launcher", nil)
	if err != nil {
		return "", nil, fmt.Errorf("copy the host's executable to launch drivers: %w", err)
	}
	return fmt.Sprintf("/proc/self/fd/%d", c.Fd()), c, nil
}

// namespaceAttr puts the process of attr into a new pid namespace, in a new user namespace
// too when the host is not root (a pid namespace needs CAP_SYS_ADMIN, which an ordinary user
// has only in a user namespace of its own): there the driver keeps the host's uid and gid,
// mapped to themselves, and no other.
func namespaceAttr(attr *syscall.SysProcAttr) {
	attr.Cloneflags |= syscall.CLONE_NEWPID
	if uid := os.Getuid(); uid != 0 {
		gid := os.Getgid()
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
}

// launcherCommand returns the command that starts the launcher with args in a driver's
// namespaces: directly for a root host, through runNamespaces for any other.
func launcherCommand(launcher string, args ...string) *exec.Cmd {
	if os.Getuid() == 0 {
		cmd := exec.Command(launcher, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: initDeathSignal}
		namespaceAttr(cmd.SysProcAttr)
		return cmd
	}
	cmd := exec.Command(launcher, append([]string{launchNSArg}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// probeNamespaces starts the launcher once in the namespaces a driver gets, and reports why
// the kernel (or a container runtime's seccomp profile) refuses them, nil when it does not.
func probeNamespaces(launcher string) error {
	cmd := launcherCommand(launcher, launchProbeArg)
	if out, err := cmd.CombinedOutput(); err != nil {
		kind := "pid namespace"
		if os.Getuid() != 0 {
			kind = "user and pid namespaces"
		}
		return fmt.Errorf("the kernel refuses %s: %w%s", kind, err, strings.TrimSpace(" "+string(out)))
	}
	return nil
}

// Missing lists what the kernel or the host's situation lacks, one phrase each.
func (c *Containment) Missing() []string {
	var out []string
	if c.DumpableErr != nil {
		out = append(out, "non-dumpable host ("+c.DumpableErr.Error()+")")
	}
	if c.SeccompErr != nil {
		out = append(out, "seccomp ("+c.SeccompErr.Error()+")")
	}
	if c.PidnsErr != nil {
		out = append(out, "pid namespace ("+c.PidnsErr.Error()+")")
	}
	if c.TmpfsErr != nil {
		out = append(out, "sized tmpfs as TMPDIR ("+c.TmpfsErr.Error()+"): a driver's files there are bounded one by one (RLIMIT_FSIZE), not together")
	}
	if c.ProcErr != nil {
		out = append(out, "a /proc of the driver's pid namespace ("+c.ProcErr.Error()+"): a driver reads the machine's /proc, every process's command line, status and mounts")
	}
	if c.Landlock != "" {
		out = append(out, c.Landlock)
	}
	return out
}
