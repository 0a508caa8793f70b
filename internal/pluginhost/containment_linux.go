//go:build linux

package pluginhost

import (
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/internal/sandbox"
)

// hostContainment is what this process, as a host of drivers, has set up to keep drivers out of
// its reach, once, at the first Host.Start: what the sandbox package set up (a non-dumpable
// host, the launcher: resource limits, Landlock, a seccomp filter and pid namespaces; see
// sandbox.Containment), and a cgroup for each worker.
type hostContainment struct {
	once sync.Once

	sandbox.Containment
	cgroups   *cgroupRoot
	cgroupErr error // why workers get no cgroup
}

var containment hostContainment

// setUp sets the host up once per process.
func (c *hostContainment) setUp() *hostContainment {
	c.once.Do(func() {
		c.Containment = *sandbox.Host()
		c.cgroups, c.cgroupErr = findCgroupRoot()
	})
	return c
}

// missing lists what the kernel or the host's situation lacks, one phrase each.
func (c *hostContainment) missing() []string {
	out := c.Missing()
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
