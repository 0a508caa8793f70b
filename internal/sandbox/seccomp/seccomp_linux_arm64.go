package seccomp

import "golang.org/x/sys/unix"

// archSyscalls are the calls of allowedSyscalls that not every architecture has: on arm64,
// renameat (os.Rename); arm64 has only the *at and *2 forms of the other calls.
var archSyscalls = []sysCall{
	{"renameat", unix.SYS_RENAMEAT},
}
