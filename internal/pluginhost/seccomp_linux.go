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

// refusedIoctls are the ioctl requests a driver is refused (EPERM) whatever the descriptor:
// TIOCSTI pushes bytes into a terminal's input (a command for the shell that reads it once the
// service stops), TIOCLINUX can do the same through the console's selection.
var refusedIoctls = []struct {
	name string
	req  uint32
}{
	{"TIOCSTI", unix.TIOCSTI},
	{"TIOCLINUX", unix.TIOCLINUX},
}

// Offsets in struct seccomp_data.
const (
	seccompDataNr   = 0
	seccompDataArch = 4
	// The low 32 bits of args[1] (little endian): the kernel reads an ioctl request as an
	// unsigned int, so the high half does not count.
	seccompDataArg1Low = 16 + 8
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

// bpfAsm assembles a classic BPF program whose conditional jumps name their targets by label.
type bpfAsm struct {
	insns  []unix.SockFilter
	jumps  map[int][2]string // instruction index: its true and false labels ("": the next one)
	labels map[string]int
}

func newBPFAsm() *bpfAsm { return &bpfAsm{jumps: map[int][2]string{}, labels: map[string]int{}} }

func (a *bpfAsm) label(name string) { a.labels[name] = len(a.insns) }

func (a *bpfAsm) stmt(code uint16, k uint32) {
	a.insns = append(a.insns, unix.SockFilter{Code: code, K: k})
}

func (a *bpfAsm) jump(code uint16, k uint32, jt, jf string) {
	a.jumps[len(a.insns)] = [2]string{jt, jf}
	a.insns = append(a.insns, unix.SockFilter{Code: code, K: k})
}

// program resolves the labels; a jump must go forward by at most 255 instructions.
func (a *bpfAsm) program() ([]unix.SockFilter, error) {
	out := append([]unix.SockFilter{}, a.insns...)
	for i, j := range a.jumps {
		for k, l := range j {
			off := 0
			if l != "" {
				to, ok := a.labels[l]
				if !ok {
					return nil, fmt.Errorf("seccomp filter: no label %q", l)
				}
				off = to - i - 1
			}
			if off < 0 || off > 255 {
				return nil, errors.New("seccomp filter: a jump out of reach")
			}
			if k == 0 {
				out[i].Jt = uint8(off)
			} else {
				out[i].Jf = uint8(off)
			}
		}
	}
	return out, nil
}

// seccompProgram builds the BPF program: check the architecture, refuse the listed calls and
// ioctl requests with EPERM, allow everything else.
func seccompProgram() ([]unix.SockFilter, error) {
	arch := auditArch()
	if arch == 0 {
		return nil, fmt.Errorf("no seccomp filter for %s", runtime.GOARCH)
	}
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
	)
	a := newBPFAsm()
	a.stmt(ldAbs, seccompDataArch)
	a.jump(jeq, arch, "", "kill")
	a.stmt(ldAbs, seccompDataNr)
	if arch == unix.AUDIT_ARCH_X86_64 {
		a.jump(jge, x32SyscallBit, "eperm", "")
	}
	a.jump(jeq, unix.SYS_IOCTL, "ioctl", "")
	for _, s := range refusedSyscalls {
		a.jump(jeq, s.nr, "eperm", "")
	}
	a.stmt(ret, unix.SECCOMP_RET_ALLOW)
	a.label("ioctl")
	a.stmt(ldAbs, seccompDataArg1Low)
	for _, r := range refusedIoctls {
		a.jump(jeq, r.req, "eperm", "")
	}
	a.stmt(ret, unix.SECCOMP_RET_ALLOW)
	a.label("kill")
	a.stmt(ret, unix.SECCOMP_RET_KILL_PROCESS)
	a.label("eperm")
	a.stmt(ret, unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM))
	return a.program()
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
