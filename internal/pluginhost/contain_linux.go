//go:build linux

package pluginhost

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
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
		c.seccompErr = seccompAvailable()
		if c.seccompErr == nil {
			c.launcher, c.launcherCopy, c.seccompErr = findLauncher()
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

// missing lists what the kernel or the host's situation lacks, one phrase each.
func (c *hostContainment) missing() []string {
	var out []string
	if c.dumpableErr != nil {
		out = append(out, "non-dumpable host ("+c.dumpableErr.Error()+")")
	}
	if c.seccompErr != nil {
		out = append(out, "seccomp ("+c.seccompErr.Error()+")")
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
