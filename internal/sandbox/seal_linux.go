package sandbox

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/coded"
)

// SealedCopy copies src into a new sealed memfd named name, writing what it copies to also too
// (nil: nowhere), and returns it open read-only (close-on-exec, readable and executable by all:
// a driver may run as another user) with its device and inode.
func SealedCopy(src io.Reader, name string, also io.Writer) (f *os.File, dev, ino uint64, err error) {
	mfd, err := unix.MemfdCreate("authz-driver:"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("create the in-memory copy of the plugin binary: %w", err)
	}
	rw := os.NewFile(uintptr(mfd), "memfd")
	defer func() { _ = rw.Close() }()
	var dst io.Writer = rw
	if also != nil {
		dst = io.MultiWriter(rw, also)
	}
	if _, err := io.Copy(dst, src); err != nil {
		return nil, 0, 0, coded.Errorf(coded.PinUnreadable, "copy plugin binary: %w", err)
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(rw.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return nil, 0, 0, fmt.Errorf("seal the in-memory copy of the plugin binary: %w", err)
	}
	// execve refuses a file open for writing (ETXTBSY): reopen the copy read-only, drop rw.
	ro, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", rw.Fd()), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("reopen the in-memory copy of the plugin binary: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(ro.Fd()), &st); err != nil {
		_ = ro.Close()
		return nil, 0, 0, fmt.Errorf("stat the in-memory copy of the plugin binary: %w", err)
	}
	if err := unix.Fchmod(int(ro.Fd()), 0o555); err != nil {
		_ = ro.Close()
		return nil, 0, 0, fmt.Errorf("make the in-memory copy executable: %w", err)
	}
	return ro, st.Dev, st.Ino, nil
}
