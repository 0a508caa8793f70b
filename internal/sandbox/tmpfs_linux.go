//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// probeTmpfs starts the launcher once as a driver's init would be, in its namespaces, and
// has it mount a tmpfs, then a procfs on /proc, in a mount namespace of its own as a driver
// stage does; it reports why the kernel (or a container runtime) refuses the tmpfs (then the
// procfs too, which goes in the same mount namespace), and why it refuses the procfs alone;
// nil when it does not.
func probeTmpfs(launcher string) (tmpErr, procErr error) {
	dir, err := os.MkdirTemp("", "authz-tmpfs-probe")
	if err != nil {
		err = fmt.Errorf("make a directory to probe a tmpfs on: %w", err)
		return err, err
	}
	defer func() { _ = os.Remove(dir) }()
	cmd := launcherCommand(launcher, launchProbeTmpfsArg, dir)
	out, err := cmd.CombinedOutput()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == probeNoProcExitCode {
		return nil, fmt.Errorf("the kernel refuses the driver a /proc of its own pid namespace: %w%s", err, strings.TrimSpace(" "+string(out)))
	}
	if err != nil {
		err = fmt.Errorf("the kernel refuses a mount namespace with a tmpfs for the driver: %w%s", err, strings.TrimSpace(" "+string(out)))
		return err, err
	}
	return nil, nil
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
