//go:build linux

package pluginhost

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/sandbox/landlock"
	"github.com/authz-dev/authz/internal/sandbox/seccomp"
)

// hostContainment is what this process, as a host of drivers, has set up to keep drivers out of
// its reach, once, at the first Host.Start: the host is not dumpable (no process without
// CAP_SYS_PTRACE may open its /proc/PID/mem, /proc/PID/fd or attach to it), drivers start
// through the launcher (resource limits and a seccomp filter), and each worker gets a cgroup.
type hostContainment struct {
	once sync.Once

	dumpableErr  error    // why the host could not be made non-dumpable
	launcher     string   // the executable drivers start through; "": none
	launcherCopy *os.File // a sealed copy of the host's executable, when others may not run the file
	seccompErr   error    // why drivers start without the seccomp filter
	pidnsErr     error    // why drivers start without a pid namespace of their own
	tmpfsErr     error    // why a driver's TMPDIR is a plain directory, not a sized tmpfs of its own
	landlock     string   // what of the Landlock sandbox the kernel lacks; "": nothing
	cgroups      *cgroupRoot
	cgroupErr    error // why workers get no cgroup
}

var containment hostContainment

// setUp sets the host up once per process.
func (c *hostContainment) setUp() *hostContainment {
	c.once.Do(func() {
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
			c.dumpableErr = fmt.Errorf("make the host non-dumpable: %w", err)
		}
		c.seccompErr = seccomp.Available()
		if c.seccompErr == nil && !launcherRegistered.Load() {
			c.seccompErr = errors.New("no driver launcher: the program did not call sandbox.Init first in main")
		}
		if c.seccompErr == nil {
			c.launcher, c.launcherCopy, c.seccompErr = findLauncher()
		}
		if c.launcher != "" {
			c.pidnsErr = probeNamespaces(c.launcher)
		} else {
			c.pidnsErr = fmt.Errorf("no launcher: %w", c.seccompErr)
		}
		c.tmpfsErr = c.pidnsErr
		if c.pidnsErr == nil {
			c.tmpfsErr = probeTmpfs(c.launcher)
		}
		c.landlock = landlock.Missing()
		if c.launcher == "" {
			c.landlock = "Landlock (no launcher to apply it)"
		}
		c.cgroups, c.cgroupErr = findCgroupRoot()
	})
	return c
}

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
	c, err := sealCopy(f, "launcher")
	if err != nil {
		return "", nil, fmt.Errorf("copy the host's executable to launch drivers: %w", err)
	}
	return fmt.Sprintf("/proc/self/fd/%d", c.file.Fd()), c.file, nil
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

// missing lists what the kernel or the host's situation lacks, one phrase each.
func (c *hostContainment) missing() []string {
	var out []string
	if c.dumpableErr != nil {
		out = append(out, "non-dumpable host ("+c.dumpableErr.Error()+")")
	}
	if c.seccompErr != nil {
		out = append(out, "seccomp ("+c.seccompErr.Error()+")")
	}
	if c.pidnsErr != nil {
		out = append(out, "pid namespace ("+c.pidnsErr.Error()+")")
	}
	if c.tmpfsErr != nil {
		out = append(out, "sized tmpfs as TMPDIR ("+c.tmpfsErr.Error()+"): a driver's files there are bounded one by one (RLIMIT_FSIZE), not together")
	}
	if c.landlock != "" {
		out = append(out, c.landlock)
	}
	if c.cgroupErr != nil {
		out = append(out, "cgroup ("+c.cgroupErr.Error()+")")
	}
	return out
}

// warn logs, in one line, what drivers run without; and, once per process, one line per stale
// cgroup ended when the host set up (the processes a host killed with SIGKILL left behind).
func (c *hostContainment) warn(log hclog.Logger) {
	if m := c.missing(); len(m) > 0 {
		log.Warn("drivers run with less containment than this host offers elsewhere: missing " + strings.Join(m, "; ") +
			"; see docs/drivers.md, \"What a driver can and cannot do\"")
	}
	if c.cgroups == nil {
		return
	}
	for _, s := range c.cgroups.takeStale() {
		log.Warn("ended the driver cgroup of a host that is gone (it was killed without stopping its drivers): its processes ran until now",
			"cgroup", s.dir, "processes", s.ended)
	}
}
