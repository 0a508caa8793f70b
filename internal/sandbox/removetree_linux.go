package sandbox

import (
	"errors"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// removeTree removes the directory dir and everything below it by descriptors, never by paths
// longer than the one given: a driver's tree can nest deeper than PATH_MAX (4096 bytes), where
// every call by path fails with ENAMETOOLONG. It opens up (u+rwx) each folder it cannot read or
// empty, through a descriptor of the folder itself, so no link is followed. It holds two
// descriptors at a time whatever the depth: it climbs back up through "..", which nothing moves
// under it (the driver's processes are gone when it runs).
func removeTree(dir string) error {
	top, err := openDir(unix.AT_FDCWD, dir)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	cur, depth := top, 0
	for {
		child, err := emptyDir(cur)
		if err != nil {
			_ = unix.Close(cur)
			return err
		}
		if child != "" { // a folder that must be emptied first: go down into it
			next, err := openDir(cur, child)
			if err != nil {
				_ = unix.Close(cur)
				return err
			}
			_ = unix.Close(cur)
			cur, depth = next, depth+1
			continue
		}
		if depth == 0 {
			_ = unix.Close(cur)
			return os.Remove(dir)
		}
		parent, err := openDir(cur, "..")
		_ = unix.Close(cur)
		if err != nil {
			return err
		}
		cur, depth = parent, depth-1
	}
}

// emptyDir removes what it can of the directory fd: files, links and empty folders. It returns
// the name of a folder that is not empty (to go down into), or "" once fd is empty.
func emptyDir(fd int) (string, error) {
	for {
		names, err := dirNames(fd)
		if err != nil {
			return "", err
		}
		if len(names) == 0 {
			return "", nil
		}
		for _, name := range names {
			err := unix.Unlinkat(fd, name, 0)
			if err == nil || errors.Is(err, unix.ENOENT) {
				continue
			}
			if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
				return "", err
			}
			err = unix.Unlinkat(fd, name, unix.AT_REMOVEDIR)
			if err == nil || errors.Is(err, unix.ENOENT) {
				continue
			}
			return name, nil // not empty, or not writable: opened up and emptied below
		}
	}
}

// dirNames lists the directory fd (at most a few thousand names a call; emptyDir lists again).
func dirNames(fd int) ([]string, error) {
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil { // shared with the dup below
		return nil, err
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	names, err := f.Readdirnames(4096)
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	return names, err
}

// openDir opens the folder name below dirfd for reading, giving it mode 0700 first (through a
// descriptor of the folder, never a link) so that a folder its driver made unreadable opens.
func openDir(dirfd int, name string) (int, error) {
	p, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	_ = os.Chmod("/proc/self/fd/"+strconv.Itoa(p), 0o700)
	fd, err := unix.Openat(p, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	_ = unix.Close(p)
	return fd, err
}
