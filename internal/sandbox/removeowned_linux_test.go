package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// asRemoveOwned makes the test binary fill a worker directory the way a hostile driver leaves
// it, then remove it with removeAllOwned (see runRemoveOwned).
const asRemoveOwned = "--as-remove-owned"

func init() {
	if len(os.Args) > 2 && os.Args[1] == asRemoveOwned {
		os.Exit(runRemoveOwned(os.Args[2]))
	}
}

// runRemoveOwned, as the directory's owner (not root): a folder of mode 000 inside another of
// mode 000, files in them, a link to a folder outside, and a tree deeper than PATH_MAX ending in
// folders it cannot list. os.RemoveAll must fail on it (else
// the test proves nothing); removeAllOwned must remove it all and leave the outside alone.
func runRemoveOwned(base string) int {
	fail := func(msg string, err error) int {
		_, _ = os.Stderr.WriteString(msg + ": " + errors.Join(err).Error() + "\n")
		return 1
	}
	dir := filepath.Join(base, "plugin-dir-test")
	outside := filepath.Join(base, "outside")
	sub := filepath.Join(dir, "keep", "sub")
	for _, d := range []string{sub, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fail("mkdir", err)
		}
	}
	for _, f := range []string{filepath.Join(sub, "f"), filepath.Join(dir, "keep", "g")} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			return fail("write", err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "keep", "link")); err != nil {
		return fail("symlink", err)
	}
	for _, d := range []string{sub, filepath.Join(dir, "keep")} {
		if err := os.Chmod(d, 0); err != nil {
			return fail("chmod", err)
		}
	}
	// A tree deeper than PATH_MAX with a folder it cannot list (0300) and one of mode 000 at its
	// bottom, made by descriptors as a driver makes it.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fail("open", err)
	}
	for range 2100 {
		if err := unix.Mkdirat(fd, "d", 0o700); err != nil {
			return fail("mkdirat", err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return fail("openat", err)
		}
		_ = unix.Close(fd)
		fd = next
	}
	for _, step := range []error{
		unix.Mkdirat(fd, "locked", 0o700), unix.Mkdirat(fd, "locked/sub", 0o700),
		unix.Fchmodat(fd, "locked", 0o300, 0), unix.Mkdirat(fd, "zero", 0),
	} {
		if step != nil {
			return fail("the deep folders", step)
		}
	}
	_ = unix.Close(fd)
	if err := os.RemoveAll(dir); err == nil {
		return fail("os.RemoveAll removed the folders of mode 000: the test proves nothing", nil)
	}
	if err := removeAllOwned(dir); err != nil {
		return fail("removeAllOwned", err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		return fail("the worker directory is still there", err)
	}
	st, err := os.Stat(outside)
	if err != nil || st.Mode().Perm() != 0o755 {
		return fail("the folder outside, reached through a link, was changed or removed", err)
	}
	return 0
}

// TestWorkerDirectoryWithLockedFoldersIsRemoved: a driver that left folders of mode 000 in its
// private directory kept it from being removed when its worker ended (a non-root service's
// disk filled with every restart); the init removes it all, as the directory's owner, and
// follows no link out of it.
func TestWorkerDirectoryWithLockedFoldersIsRemoved(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test runs the removal as another user (root would not be stopped by mode 000): run it as root (CI does)")
	}
	nobody, err := user.Lookup("nobody")
	require.NoError(t, err)
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)

	dir := sharedDir(t)
	exe := copyTestBinary(t, dir)
	work := filepath.Join(dir, "work")
	require.NoError(t, os.Mkdir(work, 0o755))
	require.NoError(t, os.Chown(work, uid, gid))

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, asRemoveOwned, work)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}
