package seccomp

import "golang.org/x/sys/unix"

// archSyscalls are the calls of allowedSyscalls that x86-64 alone has: its thread-local
// storage, and the older forms of calls that glibc and C libraries linked into a driver still
// make (the Go runtime and packages use the *at and *2 forms), and renameat (os.Rename),
// which arm64 has too.
var archSyscalls = []sysCall{
	// glibc and the Go runtime (cgo) set a thread's TLS base with it; the vDSO's fallbacks.
	{"arch_prctl", unix.SYS_ARCH_PRCTL},
	{"time", unix.SYS_TIME},

	// The older forms of the file, poller, pipe and process calls above.
	{"open", unix.SYS_OPEN},
	{"creat", unix.SYS_CREAT},
	{"stat", unix.SYS_STAT},
	{"lstat", unix.SYS_LSTAT},
	{"access", unix.SYS_ACCESS},
	{"readlink", unix.SYS_READLINK},
	{"mkdir", unix.SYS_MKDIR},
	{"rmdir", unix.SYS_RMDIR},
	{"unlink", unix.SYS_UNLINK},
	{"rename", unix.SYS_RENAME},
	{"renameat", unix.SYS_RENAMEAT},
	{"link", unix.SYS_LINK},
	{"symlink", unix.SYS_SYMLINK},
	{"getdents", unix.SYS_GETDENTS},
	{"dup2", unix.SYS_DUP2},
	{"pipe", unix.SYS_PIPE},
	{"poll", unix.SYS_POLL},
	{"select", unix.SYS_SELECT},
	{"epoll_create", unix.SYS_EPOLL_CREATE},
	{"epoll_wait", unix.SYS_EPOLL_WAIT},
	{"eventfd", unix.SYS_EVENTFD},
	{"accept", unix.SYS_ACCEPT},
	{"getpgrp", unix.SYS_GETPGRP},
	{"pause", unix.SYS_PAUSE},
	{"alarm", unix.SYS_ALARM},
	// fork and vfork take no flags, so they make no namespace: glibc's fork and posix_spawn.
	{"fork", unix.SYS_FORK},
	{"vfork", unix.SYS_VFORK},
}
