//go:build linux

package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sysCall is one system call the seccomp filter allows, by its name and its number on this
// architecture.
type sysCall struct {
	name string
	nr   uint32
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

// ipSocketFamilies are the address families of the IP network: a driver may open sockets of them
// only where its plugin lists TCP ports it may connect to (sandbox.connectTCP). A driver with
// none has no IP network at all: Landlock ABI 7 checks a TCP socket's bind but not the port the
// kernel binds for a listen on an unbound socket, so without this such a driver listened on every
// interface. Unix sockets (its go-plugin socket) are always allowed; AF_NETLINK for
// NETLINK_ROUTE only (net.Interfaces and the resolver's address selection read the interfaces
// through it); raw packet sockets, Bluetooth, vsock, alg and the rest are refused.
var ipSocketFamilies = []uint32{unix.AF_INET, unix.AF_INET6}

// cloneNamespaceFlags are the clone flags that make a namespace: refused, as are unshare and
// setns (not allowed at all), so that a driver makes no user namespace (where it would hold
// every capability) nor leaves the ones it runs in.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// personalityQuery is personality(0xffffffff): it reads the persona without changing it.
const personalityQuery = 0xffffffff

// Offsets in struct seccomp_data.
const (
	seccompDataNr   = 0
	seccompDataArch = 4
)

// seccompDataArgLow is the offset of the low 32 bits of argument i (little endian, as on
// amd64 and arm64): the calls filtered by an argument read it as an int or unsigned int (the
// kernel drops the high half of clone's flags too), so the high half does not count.
func seccompDataArgLow(i int) uint32 { return 16 + 8*uint32(i) }

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

// allowChunk bounds how many allowed calls jump to one ALLOW return: a conditional jump
// reaches at most 255 instructions ahead.
const allowChunk = 200

// seccompProgram builds the BPF program: check the architecture; allow the calls of
// allowedSyscalls and archSyscalls; filter ioctl, socket, clone and personality by their
// arguments; refuse clone3 with ENOSYS and every other call with EPERM. The allowed calls depend
// on nothing but their number, which lets the kernel cache the filter's answer for them. ip
// allows IPv4 and IPv6 sockets (ipSocketFamilies).
func seccompProgram(ip bool) ([]unix.SockFilter, error) {
	arch := auditArch()
	if arch == 0 {
		return nil, fmt.Errorf("no seccomp filter for %s", runtime.GOARCH)
	}
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ja    = unix.BPF_JMP | unix.BPF_JA
		ret   = unix.BPF_RET | unix.BPF_K
	)
	a := newBPFAsm()
	a.stmt(ldAbs, seccompDataArch)
	a.jump(jeq, arch, "", "kill")
	a.stmt(ldAbs, seccompDataNr)
	if arch == unix.AUDIT_ARCH_X86_64 {
		a.jump(jge, x32SyscallBit, "eperm", "")
	}
	allowed := append(append([]sysCall{}, allowedSyscalls...), archSyscalls...)
	for i := 0; i < len(allowed); i += allowChunk {
		chunk := allowed[i:min(i+allowChunk, len(allowed))]
		label := fmt.Sprintf("allow%d", i)
		for _, s := range chunk {
			a.jump(jeq, s.nr, label, "")
		}
		a.stmt(ja, 1) // past this chunk's ALLOW
		a.label(label)
		a.stmt(ret, unix.SECCOMP_RET_ALLOW)
	}
	a.jump(jeq, sysIoctl, "ioctl", "")
	a.jump(jeq, sysSocket, "socket", "")
	a.jump(jeq, sysClone, "clone", "")
	a.jump(jeq, sysClone3, "enosys", "")
	a.jump(jeq, sysPersonality, "personality", "eperm")

	a.label("ioctl")
	a.stmt(ldAbs, seccompDataArgLow(1))
	for _, r := range refusedIoctls {
		a.jump(jeq, r.req, "eperm", "")
	}
	a.stmt(ret, unix.SECCOMP_RET_ALLOW)

	a.label("socket")
	a.stmt(ldAbs, seccompDataArgLow(0))
	a.jump(jeq, unix.AF_UNIX, "allow", "")
	for _, f := range ipSocketFamilies {
		if ip {
			a.jump(jeq, f, "socketProtocol", "")
		} else {
			a.jump(jeq, f, "eperm", "")
		}
	}
	a.jump(jeq, unix.AF_NETLINK, "", "eperm")
	a.stmt(ldAbs, seccompDataArgLow(2))
	a.jump(jeq, unix.NETLINK_ROUTE, "allow", "eperm")
	// Multipath TCP is TCP that Landlock's TCP rules do not see: a driver connected with it to
	// ports sandbox.connectTCP does not list (the service's own). Refused, Go falls back to TCP.
	a.label("socketProtocol")
	a.stmt(ldAbs, seccompDataArgLow(2))
	a.jump(jeq, unix.IPPROTO_MPTCP, "eperm", "allow")

	a.label("clone")
	a.stmt(ldAbs, seccompDataArgLow(0))
	a.jump(jset, cloneNamespaceFlags, "eperm", "allow")

	a.label("personality")
	a.stmt(ldAbs, seccompDataArgLow(0))
	a.jump(jeq, 0, "allow", "")
	a.jump(jeq, personalityQuery, "allow", "eperm")

	a.label("allow")
	a.stmt(ret, unix.SECCOMP_RET_ALLOW)
	a.label("enosys")
	a.stmt(ret, unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS))
	a.label("kill")
	a.stmt(ret, unix.SECCOMP_RET_KILL_PROCESS)
	a.label("eperm")
	a.stmt(ret, unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM))
	return a.program()
}

// Install sets no_new_privs and installs the filter on every thread of the calling
// process (SECCOMP_FILTER_FLAG_TSYNC: the Go runtime runs several). ip allows IPv4 and IPv6
// sockets: for a driver whose plugin lists ports in sandbox.connectTCP.
func Install(ip bool) error {
	prog, err := seccompProgram(ip)
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

// Available reports why this kernel cannot filter a driver's system calls, nil when it can.
func Available() error {
	if _, err := seccompProgram(true); err != nil {
		return err
	}
	action := uint32(unix.SECCOMP_RET_ERRNO)
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&action)))
	if errno != 0 {
		return fmt.Errorf("the kernel has no seccomp filters (seccomp: %w)", errno)
	}
	return nil
}
