//go:build linux

package pluginhost

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// refusedSyscalls are the system calls a driver is refused (EPERM) by the seccomp filter the
// launcher installs before it executes the driver: the calls that reach into another process
// (its memory, its descriptors, its execution), and those that change the kernel or the mount
// table. docs/drivers.md lists them for driver authors.
var refusedSyscalls = []struct {
	name string
	nr   uint32
}{
	{"ptrace", unix.SYS_PTRACE},
	{"process_vm_readv", unix.SYS_PROCESS_VM_READV},
	{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"process_madvise", unix.SYS_PROCESS_MADVISE},
	{"pidfd_getfd", unix.SYS_PIDFD_GETFD},
	{"kcmp", unix.SYS_KCMP},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"bpf", unix.SYS_BPF},
	{"userfaultfd", unix.SYS_USERFAULTFD},
	{"keyctl", unix.SYS_KEYCTL},
	{"add_key", unix.SYS_ADD_KEY},
	{"request_key", unix.SYS_REQUEST_KEY},
	{"mount", unix.SYS_MOUNT},
	{"umount2", unix.SYS_UMOUNT2},
	{"pivot_root", unix.SYS_PIVOT_ROOT},
	{"move_mount", unix.SYS_MOVE_MOUNT},
	{"open_tree", unix.SYS_OPEN_TREE},
	{"fsopen", unix.SYS_FSOPEN},
	{"fsconfig", unix.SYS_FSCONFIG},
	{"fsmount", unix.SYS_FSMOUNT},
	{"fspick", unix.SYS_FSPICK},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT},
	{"kexec_load", unix.SYS_KEXEC_LOAD},
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"init_module", unix.SYS_INIT_MODULE},
	{"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE},
	{"reboot", unix.SYS_REBOOT},
	{"swapon", unix.SYS_SWAPON},
	{"swapoff", unix.SYS_SWAPOFF},
	{"acct", unix.SYS_ACCT},
}

// Offsets in struct seccomp_data.
const (
	seccompDataNr   = 0
	seccompDataArch = 4
)

// x32SyscallBit marks the x32 system call numbers on x86_64: they are refused as a whole, so
// that none of the calls above is reachable under another number.
const x32SyscallBit = 0x40000000

// auditArch is the architecture the filter admits; any other (a 32-bit call from a 64-bit
// process) ends the process. Zero: no filter for this architecture.
func auditArch() uint32 {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	return 0
}

// seccompProgram builds the BPF program: check the architecture, refuse the listed calls with
// EPERM, allow everything else.
func seccompProgram() ([]unix.SockFilter, error) {
	arch := auditArch()
	if arch == 0 {
		return nil, fmt.Errorf("no seccomp filter for %s", runtime.GOARCH)
	}
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jump := func(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
	}
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
	)
	n := len(refusedSyscalls)
	if n+2 > 255 {
		return nil, errors.New("seccomp filter: too many calls for one jump")
	}
	prog := []unix.SockFilter{
		stmt(ldAbs, seccompDataArch),
		jump(jeq, arch, 1, 0),
		stmt(ret, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(ldAbs, seccompDataNr),
	}
	if arch == unix.AUDIT_ARCH_X86_64 {
		// To the EPERM at the end: past the n checks and the ALLOW.
		prog = append(prog, jump(jge, x32SyscallBit, uint8(n+1), 0))
	}
	for i, s := range refusedSyscalls {
		prog = append(prog, jump(jeq, s.nr, uint8(n-i), 0))
	}
	prog = append(prog,
		stmt(ret, unix.SECCOMP_RET_ALLOW),
		stmt(ret, unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM)),
	)
	return prog, nil
}

// installSeccomp sets no_new_privs and installs the filter on every thread of the calling
// process (SECCOMP_FILTER_FLAG_TSYNC: the Go runtime runs several).
func installSeccomp() error {
	prog, err := seccompProgram()
	if err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("install the seccomp filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("install the seccomp filter: thread %d could not be synchronised", r)
	}
	return nil
}

// seccompAvailable reports why this kernel cannot filter a driver's system calls, nil when it can.
func seccompAvailable() error {
	if _, err := seccompProgram(); err != nil {
		return err
	}
	action := uint32(unix.SECCOMP_RET_ERRNO)
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&action)))
	if errno != 0 {
		return fmt.Errorf("the kernel has no seccomp filters (seccomp: %w)", errno)
	}
	return nil
}
