//go:build linux

package pluginhost

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/sandbox/tmpfs"
)

// probeTmpfs starts the launcher once as a driver's init would be, in its namespaces, and
// has it mount a tmpfs in a mount namespace of its own as a driver stage does; it reports why
// the kernel (or a container runtime) refuses, nil when it does not.
func probeTmpfs(launcher string) error {
	dir, err := os.MkdirTemp("", "authz-tmpfs-probe")
	if err != nil {
		return fmt.Errorf("make a directory to probe a tmpfs on: %w", err)
	}
	defer func() { _ = os.Remove(dir) }()
	cmd := launcherCommand(launcher, launchProbeTmpfsArg, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the kernel refuses a mount namespace with a tmpfs for the driver: %w%s", err, strings.TrimSpace(" "+string(out)))
	}
	return nil
}

// tmpfsSpec is the tmpfs of a driver of the worker directory dir: owned by the driver's user.
func tmpfsSpec(dir string, l ResourceLimits, cred *syscall.Credential) tmpfs.Spec {
	s := tmpfs.Spec{Dir: dir, Bytes: l.TempDirBytes, Inodes: tmpfs.InodesFor(l.TempDirBytes), UID: os.Getuid(), GID: os.Getgid()}
	if cred != nil {
		s.UID, s.GID = int(cred.Uid), int(cred.Gid)
	}
	return s
}

// receivedTmpRoot keeps the descriptor of the driver's tmpfs root that came with the driver
// stage's credentials (closing any other), nil when none came.
func receivedTmpRoot(msgs []unix.SocketControlMessage) *os.File {
	var root *os.File
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if root == nil {
				root = os.NewFile(uintptr(fd), "tmpfs")
			} else {
				_ = unix.Close(fd)
			}
		}
	}
	return root
}

// hostPath turns an address the driver announced in its tmpfs (its socket) into a path the
// host reaches it by: through the host's descriptor of the tmpfs's root, which lies in the
// driver's mount namespace, not in the host's.
func (p *proc) hostPath(addr string) string {
	if p.tmpRoot == nil || filepath.Dir(addr) != filepath.Clean(p.socketDir) {
		return addr
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", p.tmpRoot.Fd(), filepath.Base(addr))
}
