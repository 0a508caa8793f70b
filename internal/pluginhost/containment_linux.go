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
	memoryErr error // why the worker cgroups get no memory controller (limits.memoryMax is refused)
}

var containment hostContainment

// setUp sets the host up once per process.
func (c *hostContainment) setUp() *hostContainment {
	c.once.Do(func() {
		c.Containment = *sandbox.Host()
		c.cgroups, c.cgroupErr = findCgroupRoot()
		c.memoryErr = c.cgroupErr
		if c.cgroups != nil {
			c.memoryErr = limitsAvailable(c.cgroups.mount, c.cgroups.hostRel)
		}
	})
	return c
}

// missing lists what the kernel or the host's situation lacks, one phrase each.
func (c *hostContainment) missing() []string {
	out := c.Missing()
	if c.cgroupErr != nil {
		out = append(out, "cgroup ("+c.cgroupErr.Error()+")")
	}
	switch {
	case c.memoryErr != nil && c.cgroupErr != nil:
		out = append(out, memoryUnbounded) // the cgroup's phrase says why
	case c.memoryErr != nil:
		out = append(out, "a memory controller in the drivers' cgroups ("+c.memoryErr.Error()+")"+strings.TrimPrefix(memoryUnbounded, "a memory controller in the drivers' cgroups"))
	}
	return out
}

// memoryUnbounded is the phrase of missing when the worker cgroups get no memory controller:
// RLIMIT_DATA counts per process, and nothing counts a driver's processes together.
const memoryUnbounded = "a memory controller in the drivers' cgroups: a driver's memory is bounded per process " +
	"(limits.dataBytes x limits.processes), not in total; set limits.memoryMax where cgroup v2 has the memory controller"

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
