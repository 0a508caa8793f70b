//go:build linux

// Package tmpfs makes a contained driver's private temporary directory a sized tmpfs in a
// mount namespace of the driver's own: whatever the driver writes there (its TMPDIR, and
// go-plugin's unix socket) is bounded in bytes and in files, and goes with the namespace when
// the driver's last process ends. RLIMIT_FSIZE bounds one file only; this bounds them all.
//
// The plugin host writes the launcher's Spec into its environment with Spec.Env; the init of
// the driver's pid namespace starts the driver stage in a new mount namespace (Cloneflags),
// and the driver stage, before its Landlock rules are made (they are bound to the mounted
// directory's inode), calls Mount (and MountProc where Spec.Proc says so: a /proc of the
// driver's own pid namespace), then gives up what let it mount (DropPrivileges) on the thread
// that executes the driver.
//
// Linux only.
package tmpfs

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Env is the launcher's environment variable that carries the Spec; the driver stage removes
// it from the driver's environment.
const Env = "AUTHZ_DRIVER_TMPFS"

// Spec is the tmpfs of one driver.
type Spec struct {
	Dir    string `json:"dir"`    // mounted on: the worker's private directory (the driver's TMPDIR)
	Bytes  uint64 `json:"bytes"`  // size=: what all its files hold together
	Inodes uint64 `json:"inodes"` // nr_inodes=: how many files and directories it holds
	UID    int    `json:"uid"`    // the owner of its root (the driver's user)
	GID    int    `json:"gid"`
	// Proc: the driver stage also mounts a procfs of its own pid namespace on /proc (MountProc),
	// where the host's probe found the kernel allows it.
	Proc bool `json:"proc,omitempty"`
}

// InodesFor is the number of files a tmpfs of bytes holds: one per 16 KiB, at least 1024.
// Each costs kernel memory that size= does not count (an inode and its directory entry,
// about a kilobyte), so it is bounded too.
func InodesFor(bytes uint64) uint64 { return max(1024, bytes/(16<<10)) }

// Env writes the Spec as the launcher's environment entry.
func (s Spec) Env() string {
	b, _ := json.Marshal(s)
	return Env + "=" + string(b)
}

// FromEnv reads the Spec from the environment and removes it, so that the driver does not
// inherit it; ok is false when there is none.
func FromEnv() (s Spec, ok bool, err error) {
	raw, ok := os.LookupEnv(Env)
	if !ok {
		return Spec{}, false, nil
	}
	_ = os.Unsetenv(Env)
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return Spec{}, true, fmt.Errorf("bad %s: %w", Env, err)
	}
	if s.Dir == "" || s.Bytes == 0 || s.Inodes == 0 {
		return Spec{}, true, fmt.Errorf("bad %s: want dir, bytes and inodes", Env)
	}
	return s, true, nil
}

// Cloneflags are the flags of the driver stage's clone: a mount namespace of its own.
const Cloneflags = syscall.CLONE_NEWNS

// Mount makes every mount of the calling process's (new) mount namespace private, so that
// nothing mounted here reaches the host's namespace, and mounts the tmpfs on s.Dir: size and
// inodes bounded, mode 0700, owned by the driver's user, no device files or set-id programs.
// It returns a descriptor of the tmpfs's root (O_PATH), through which the host reaches the
// driver's socket there.
func Mount(s Spec) (int, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, fmt.Errorf("make the driver's mounts private: %w", err)
	}
	opts := "size=" + strconv.FormatUint(s.Bytes, 10) + ",nr_inodes=" + strconv.FormatUint(s.Inodes, 10) +
		",mode=0700,uid=" + strconv.Itoa(s.UID) + ",gid=" + strconv.Itoa(s.GID)
	if err := unix.Mount("authz-driver-tmp", s.Dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return -1, fmt.Errorf("mount the driver's tmpfs on %s (%s): %w", s.Dir, opts, err)
	}
	fd, err := unix.Open(s.Dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, fmt.Errorf("open the driver's tmpfs: %w", err)
	}
	return fd, nil
}

// MountProc mounts a fresh procfs on /proc in the calling process's mount namespace (made
// private by Mount first): it shows the processes of the caller's pid namespace only (the
// driver's init, the driver and what it starts), not the machine's, whose command lines,
// mounts and descriptors a driver read through the host's /proc. No set-id programs, devices
// or executables on it. Called before the Landlock rules are made: their /proc rule is bound
// to this mount's root.
func MountProc() error {
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount a /proc of the driver's pid namespace: %w", err)
	}
	return nil
}

// DropPrivileges gives up what let the driver stage mount: as root for a driver of another
// user (a root host), it becomes that user, with no supplementary groups (every thread; the
// kernel clears the capabilities); as the driver's own user with capabilities in its user
// namespace (a host that is not root), it clears the calling thread's capabilities, the
// ambient ones too. The caller keeps its OS thread locked until it executes the driver: the
// driver gets the capabilities of that thread, none.
func DropPrivileges(s Spec) error {
	if os.Getuid() == 0 && s.UID == 0 {
		return nil // a driver that runs as root, as its plugin asked
	}
	if os.Getuid() != s.UID || os.Getgid() != s.GID {
		if err := syscall.Setgroups(nil); err != nil {
			return fmt.Errorf("drop the supplementary groups: %w", err)
		}
		if err := syscall.Setresgid(s.GID, s.GID, s.GID); err != nil {
			return fmt.Errorf("become group %d: %w", s.GID, err)
		}
		if err := syscall.Setresuid(s.UID, s.UID, s.UID); err != nil {
			return fmt.Errorf("become user %d: %w", s.UID, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear the ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return fmt.Errorf("clear the capabilities: %w", err)
	}
	return nil
}

// Probe mounts a small tmpfs on dir as Mount does, and reports why it cannot: the driver
// stage's test run, in a mount namespace the caller made for it.
func Probe(dir string) error {
	fd, err := Mount(Spec{Dir: dir, Bytes: 1 << 20, Inodes: 16, UID: os.Getuid(), GID: os.Getgid()})
	if err == nil {
		_ = unix.Close(fd)
	}
	return err
}
