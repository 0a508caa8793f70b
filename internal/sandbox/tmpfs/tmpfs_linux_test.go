//go:build linux

package tmpfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const asMounter = "--tmpfs-test-mount"

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == asMounter {
		os.Exit(mountAndFill(os.Args[2]))
	}
	os.Exit(m.Run())
}

// mountAndFill is the child of TestMountBoundsTheDirectory, in a mount namespace of its own:
// it mounts the Spec of its environment, drops its privileges, writes past the size, and
// prints what happened.
func mountAndFill(dir string) int {
	s, ok, err := FromEnv()
	if err != nil || !ok {
		fmt.Println("no spec:", err)
		return 1
	}
	if _, ok := os.LookupEnv(Env); ok {
		fmt.Println("the spec stayed in the environment")
		return 1
	}
	fd, err := Mount(s)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	_ = unix.Close(fd)
	runtime.LockOSThread() // as the launcher: the thread that dropped is the one that goes on
	if err := DropPrivileges(s); err != nil {
		fmt.Println(err)
		return 1
	}
	err = os.WriteFile(filepath.Join(dir, "big"), make([]byte, 2*s.Bytes), 0o600)
	fmt.Println("fill:", errors.Is(err, syscall.ENOSPC), err)
	var files int
	for files = 0; files < int(s.Inodes)+10; files++ {
		if os.WriteFile(filepath.Join(dir, fmt.Sprint("f", files)), nil, 0o600) != nil {
			break
		}
	}
	fmt.Println("files:", files)
	err = unix.Mount("again", dir, "tmpfs", 0, "")
	fmt.Println("mount after drop:", err)
	return 0
}

// TestMountBoundsTheDirectory: in a mount namespace of its own, Mount makes the directory a
// tmpfs of Spec.Bytes and Spec.Inodes (a write past its size fails with ENOSPC; it holds no
// more files than its inodes, the root among them), which the host's namespace does not see;
// after DropPrivileges (to the user nobody's id, as root) the process cannot mount again.
func TestMountBoundsTheDirectory(t *testing.T) {
	dir, err := os.MkdirTemp("", "tmpfs-test")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := Spec{Dir: dir, Bytes: 1 << 20, Inodes: 32, UID: os.Getuid(), GID: os.Getgid()}
	if os.Getuid() == 0 {
		s.UID, s.GID = 65534, 65534 // a root host's driver of another user
	}
	cmd := exec.Command("/proc/self/exe", asMounter, dir)
	cmd.Env = append(os.Environ(), s.Env())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: Cloneflags}
	if os.Getuid() != 0 {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getuid(), HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getgid(), HostID: os.Getgid(), Size: 1}}
		cmd.SysProcAttr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "%s", out.String())
	got := out.String()
	assert.Contains(t, got, "fill: true", "a write past the size fails with ENOSPC")
	assert.Contains(t, got, "files: 30\n", "32 inodes: the root, the file cut short and 30 files")
	assert.Contains(t, got, "mount after drop: operation not permitted")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "the host's namespace sees the directory as it was")
}

// TestSpecEnv: the Spec goes through the environment whole; a malformed or incomplete one is
// an error, not a tmpfs of size zero.
func TestSpecEnv(t *testing.T) {
	s := Spec{Dir: "/tmp/plugin-dir1", Bytes: 64 << 20, Inodes: InodesFor(64 << 20), UID: 5, GID: 6}
	assert.Equal(t, uint64(4096), s.Inodes)
	assert.Equal(t, uint64(1024), InodesFor(1<<20))
	name, value, _ := strings.Cut(s.Env(), "=")
	t.Setenv(name, value)
	got, ok, err := FromEnv()
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, s, got)
	t.Setenv(Env, `{"dir":"/x"}`)
	_, ok, err = FromEnv()
	assert.True(t, ok)
	assert.Error(t, err)
	_, ok, err = FromEnv()
	assert.False(t, ok, "FromEnv removed it")
	assert.NoError(t, err)
}
