//go:build linux

package pluginhost

import (
	"os"
	"syscall"

	"github.com/authz-dev/authz/internal/sandbox/tmpfs"
)

// tmpfsSpec is the tmpfs of a driver of the worker directory dir: owned by the driver's user;
// nil where the host cannot mount one (the driver's TMPDIR is then the plain directory). In
// the same mount namespace the driver gets a /proc of its own pid namespace, where the host can
// mount one.
func tmpfsSpec(c *hostContainment, dir string, l ResourceLimits, cred *syscall.Credential) *tmpfs.Spec {
	if c.TmpfsErr != nil {
		return nil
	}
	s := tmpfs.Spec{Dir: dir, Bytes: l.TempDirBytes, Inodes: tmpfs.InodesFor(l.TempDirBytes), UID: os.Getuid(), GID: os.Getgid(), Proc: c.ProcErr == nil}
	if cred != nil {
		s.UID, s.GID = int(cred.Uid), int(cred.Gid)
	}
	return &s
}
