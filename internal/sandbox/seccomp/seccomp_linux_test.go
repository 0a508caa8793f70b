package seccomp

import (
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// seccompRun runs the filter's program on one call as the kernel would, and returns the action.
func seccompRun(t *testing.T, prog []unix.SockFilter, arch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	data := make([]byte, 64) // struct seccomp_data
	binary.LittleEndian.PutUint32(data[seccompDataNr:], nr)
	binary.LittleEndian.PutUint32(data[seccompDataArch:], arch)
	for i, a := range args {
		binary.LittleEndian.PutUint64(data[16+8*i:], a)
	}
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(in.K)
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			var cond bool
			switch in.Code & 0xf0 {
			case unix.BPF_JEQ:
				cond = acc == in.K
			case unix.BPF_JGE:
				cond = acc >= in.K
			default:
				cond = acc&in.K != 0
			}
			if cond {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case unix.BPF_RET | unix.BPF_K:
			return in.K
		default:
			t.Fatalf("instruction %d: unknown code %#x", pc, in.Code)
		}
	}
	t.Fatal("the program ended without a return")
	return 0
}

// TestSeccompAllowlist: the filter's program allows every listed call and the filtered calls
// with the arguments a Go driver uses; it refuses with EPERM the calls authz always refuses,
// any call it does not list, clone with a namespace flag, socket of another family, ioctl
// TIOCSTI and TIOCLINUX, another personality; clone3 with ENOSYS; x32 calls with EPERM; and it
// kills a process calling with another architecture's convention.
func TestSeccompAllowlist(t *testing.T) {
	t.Parallel()
	prog, err := seccompProgram(true)
	require.NoError(t, err)
	arch := auditArch()
	allow := uint32(unix.SECCOMP_RET_ALLOW)
	eperm := unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	t.Logf("%d instructions", len(prog))

	allowed := map[uint32]bool{}
	for _, s := range append(append([]sysCall{}, allowedSyscalls...), archSyscalls...) {
		assert.False(t, allowed[s.nr], "%s is listed twice", s.name)
		allowed[s.nr] = true
		assert.Equal(t, allow, seccompRun(t, prog, arch, s.nr), s.name)
	}
	// Always refused, whatever the list says.
	for name, nr := range map[string]uint32{
		"ptrace": unix.SYS_PTRACE, "pidfd_getfd": unix.SYS_PIDFD_GETFD, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
		"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV, "process_madvise": unix.SYS_PROCESS_MADVISE, "kcmp": unix.SYS_KCMP,
		"bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN, "userfaultfd": unix.SYS_USERFAULTFD,
		"keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY, "request_key": unix.SYS_REQUEST_KEY,
		"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "fsopen": unix.SYS_FSOPEN, "fsconfig": unix.SYS_FSCONFIG,
		"fsmount": unix.SYS_FSMOUNT, "fspick": unix.SYS_FSPICK, "move_mount": unix.SYS_MOVE_MOUNT, "open_tree": unix.SYS_OPEN_TREE,
		"mount_setattr": unix.SYS_MOUNT_SETATTR, "pivot_root": unix.SYS_PIVOT_ROOT, "chroot": unix.SYS_CHROOT,
		"unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS, "kexec_load": unix.SYS_KEXEC_LOAD,
		"kexec_file_load": unix.SYS_KEXEC_FILE_LOAD, "init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE,
		"delete_module": unix.SYS_DELETE_MODULE, "reboot": unix.SYS_REBOOT, "swapon": unix.SYS_SWAPON, "swapoff": unix.SYS_SWAPOFF,
		"acct": unix.SYS_ACCT, "syslog": unix.SYS_SYSLOG, "open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
		"name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT, "io_uring_setup": unix.SYS_IO_URING_SETUP,
		"io_uring_enter": unix.SYS_IO_URING_ENTER, "memfd_create": unix.SYS_MEMFD_CREATE, "setuid": unix.SYS_SETUID,
		"setgid": unix.SYS_SETGID, "setresuid": unix.SYS_SETRESUID, "setgroups": unix.SYS_SETGROUPS,
		"settimeofday": unix.SYS_SETTIMEOFDAY, "clock_settime": unix.SYS_CLOCK_SETTIME, "sethostname": unix.SYS_SETHOSTNAME,
		"quotactl": unix.SYS_QUOTACTL, "lookup_dcookie": unix.SYS_LOOKUP_DCOOKIE, "vhangup": unix.SYS_VHANGUP,
		// A non-root service's driver has its uid: with these it opened the service's tokens,
		// configuration and decision log to every local user (Landlock does not cover them).
		"fchmod": unix.SYS_FCHMOD, "fchmodat": unix.SYS_FCHMODAT, "fchmodat2": unix.SYS_FCHMODAT2,
		"fchown": unix.SYS_FCHOWN, "fchownat": unix.SYS_FCHOWNAT, "utimensat": unix.SYS_UTIMENSAT,
		"setxattr": unix.SYS_SETXATTR, "lsetxattr": unix.SYS_LSETXATTR, "fsetxattr": unix.SYS_FSETXATTR,
		"removexattr": unix.SYS_REMOVEXATTR, "fremovexattr": unix.SYS_FREMOVEXATTR,
	} {
		assert.False(t, allowed[nr], "%s is on the allowlist", name)
		assert.Equal(t, eperm, seccompRun(t, prog, arch, nr), name)
	}
	assert.Equal(t, eperm, seccompRun(t, prog, arch, 1023), "a number no kernel has yet")

	cases := []struct {
		name string
		nr   uint32
		args []uint64
		want uint32
	}{
		{"clone of a thread", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM}, allow},
		{"clone of a process (os/exec)", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, allow},
		{"clone into a user namespace", unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm},
		{"clone into a mount namespace", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNS | uint64(unix.SIGCHLD)}, eperm},
		{"clone into a network namespace", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNET}, eperm},
		{"clone3", unix.SYS_CLONE3, nil, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{"socket(AF_UNIX)", unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM}, allow},
		{"socket(AF_INET)", unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM}, allow},
		{"socket(AF_INET6)", unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_DGRAM}, allow},
		{"socket(AF_INET, Multipath TCP)", unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, eperm},
		{"socket(AF_INET6, Multipath TCP)", unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, eperm},
		{"socket(AF_NETLINK, NETLINK_ROUTE)", unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, allow},
		{"socket(AF_NETLINK, NETLINK_AUDIT)", unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT}, eperm},
		{"socket(AF_PACKET)", unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_RAW}, eperm},
		{"socket(AF_VSOCK)", unix.SYS_SOCKET, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM}, eperm},
		{"socket(AF_ALG)", unix.SYS_SOCKET, []uint64{unix.AF_ALG, unix.SOCK_SEQPACKET}, eperm},
		{"ioctl(TCGETS)", unix.SYS_IOCTL, []uint64{1, unix.TCGETS}, allow},
		{"ioctl(TIOCSTI)", unix.SYS_IOCTL, []uint64{0, unix.TIOCSTI}, eperm},
		{"ioctl(TIOCSTI) with high bits", unix.SYS_IOCTL, []uint64{0, 1<<32 | unix.TIOCSTI}, eperm},
		{"ioctl(TIOCLINUX)", unix.SYS_IOCTL, []uint64{0, unix.TIOCLINUX}, eperm},
		{"personality query", unix.SYS_PERSONALITY, []uint64{0xffffffff}, allow},
		{"personality(PER_LINUX)", unix.SYS_PERSONALITY, []uint64{0}, allow},
		{"personality(PER_LINUX32)", unix.SYS_PERSONALITY, []uint64{8}, eperm},
		{"personality(ADDR_NO_RANDOMIZE)", unix.SYS_PERSONALITY, []uint64{0x0040000}, eperm},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, seccompRun(t, prog, arch, c.nr, c.args...), c.name)
	}

	// A driver whose plugin lists no sandbox.connectTCP has no IP network: its unix and netlink
	// route sockets stay.
	noIP, err := seccompProgram(false)
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		args []uint64
		want uint32
	}{
		{"socket(AF_UNIX)", []uint64{unix.AF_UNIX, unix.SOCK_STREAM}, allow},
		{"socket(AF_NETLINK, NETLINK_ROUTE)", []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, allow},
		{"socket(AF_INET)", []uint64{unix.AF_INET, unix.SOCK_STREAM}, eperm},
		{"socket(AF_INET6, UDP)", []uint64{unix.AF_INET6, unix.SOCK_DGRAM}, eperm},
	} {
		assert.Equal(t, c.want, seccompRun(t, noIP, arch, unix.SYS_SOCKET, c.args...), "without IP: "+c.name)
	}

	other := uint32(unix.AUDIT_ARCH_I386)
	if runtime.GOARCH == "arm64" {
		other = unix.AUDIT_ARCH_ARM
	}
	assert.Equal(t, uint32(unix.SECCOMP_RET_KILL_PROCESS), seccompRun(t, prog, other, unix.SYS_READ), "another architecture")
	if arch == unix.AUDIT_ARCH_X86_64 {
		assert.Equal(t, eperm, seccompRun(t, prog, arch, x32SyscallBit|unix.SYS_READ), "an x32 call")
	}
}
