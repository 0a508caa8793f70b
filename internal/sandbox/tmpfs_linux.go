//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
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
