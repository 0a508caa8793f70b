//go:build linux && (amd64 || arm64)

package seccomp

import "golang.org/x/sys/unix"

// allowedSyscalls are the calls a driver may make whatever their arguments: the seccomp filter
// the launcher installs before it executes the driver refuses every other call with EPERM (the
// calls below with argument conditions apart). The set is what a Go driver needs (the Go
// runtime, package os and net, gRPC and go-plugin, and glibc where the driver links it), seen
// with `strace -f` of the project's test drivers and the example driver, and is a subset of
// Docker's default profile (github.com/moby/profiles/seccomp). Each group says why.
// archSyscalls (seccomp_linux_amd64.go, seccomp_linux_arm64.go) adds the calls of one
// architecture only; docs/drivers.md lists what is refused.
var allowedSyscalls = []sysCall{
	// The Go runtime's and glibc's memory: heap arenas, stacks, returning memory to the kernel,
	// naming its mappings (prctl PR_SET_VMA, below), glibc's malloc.
	{"mmap", unix.SYS_MMAP},
	{"munmap", unix.SYS_MUNMAP},
	{"mprotect", unix.SYS_MPROTECT},
	{"madvise", unix.SYS_MADVISE},
	{"mremap", unix.SYS_MREMAP},
	{"mincore", unix.SYS_MINCORE},
	{"brk", unix.SYS_BRK},

	// Threads of the runtime and of glibc (clone itself is filtered below), their parking and
	// wake-ups, thread-local set-up at start, and their end.
	{"futex", unix.SYS_FUTEX},
	{"set_robust_list", unix.SYS_SET_ROBUST_LIST},
	{"set_tid_address", unix.SYS_SET_TID_ADDRESS},
	{"rseq", unix.SYS_RSEQ},
	{"gettid", unix.SYS_GETTID},
	{"getpid", unix.SYS_GETPID},
	{"getppid", unix.SYS_GETPPID},
	{"sched_yield", unix.SYS_SCHED_YIELD},
	{"sched_getaffinity", unix.SYS_SCHED_GETAFFINITY},
	{"getcpu", unix.SYS_GETCPU},
	{"exit", unix.SYS_EXIT},
	{"exit_group", unix.SYS_EXIT_GROUP},

	// Signals: the runtime's handlers and preemption (tgkill of its own threads), os/signal,
	// os.Process.Signal and exec.Cmd's cancellation of the driver's own children (the pid
	// namespace and Landlock's signal scope keep every other process out of reach).
	{"rt_sigaction", unix.SYS_RT_SIGACTION},
	{"rt_sigprocmask", unix.SYS_RT_SIGPROCMASK},
	{"rt_sigreturn", unix.SYS_RT_SIGRETURN},
	{"rt_sigpending", unix.SYS_RT_SIGPENDING},
	{"rt_sigsuspend", unix.SYS_RT_SIGSUSPEND},
	{"rt_sigtimedwait", unix.SYS_RT_SIGTIMEDWAIT},
	{"sigaltstack", unix.SYS_SIGALTSTACK},
	{"restart_syscall", unix.SYS_RESTART_SYSCALL},
	{"kill", unix.SYS_KILL},
	{"tgkill", unix.SYS_TGKILL},
	{"tkill", unix.SYS_TKILL},

	// Time: clocks where the vDSO is missing, sleeps, the runtime's profiling timers, time.Timer
	// in C libraries (timerfd).
	{"clock_gettime", unix.SYS_CLOCK_GETTIME},
	{"clock_getres", unix.SYS_CLOCK_GETRES},
	{"clock_nanosleep", unix.SYS_CLOCK_NANOSLEEP},
	{"nanosleep", unix.SYS_NANOSLEEP},
	{"gettimeofday", unix.SYS_GETTIMEOFDAY},
	{"getitimer", unix.SYS_GETITIMER},
	{"setitimer", unix.SYS_SETITIMER},
	{"timer_create", unix.SYS_TIMER_CREATE},
	{"timer_settime", unix.SYS_TIMER_SETTIME},
	{"timer_gettime", unix.SYS_TIMER_GETTIME},
	{"timer_delete", unix.SYS_TIMER_DELETE},
	{"timerfd_create", unix.SYS_TIMERFD_CREATE},
	{"timerfd_settime", unix.SYS_TIMERFD_SETTIME},
	{"timerfd_gettime", unix.SYS_TIMERFD_GETTIME},

	// The runtime's network poller (every socket and pipe of net, os and gRPC) and the pipes of
	// os/exec and go-plugin's stdio.
	{"epoll_create1", unix.SYS_EPOLL_CREATE1},
	{"epoll_ctl", unix.SYS_EPOLL_CTL},
	{"epoll_pwait", unix.SYS_EPOLL_PWAIT},
	{"epoll_pwait2", unix.SYS_EPOLL_PWAIT2},
	{"eventfd2", unix.SYS_EVENTFD2},
	{"pipe2", unix.SYS_PIPE2},
	{"ppoll", unix.SYS_PPOLL},
	{"pselect6", unix.SYS_PSELECT6},

	// Files (Landlock decides which): package os, the runtime's reads of /proc and /sys at
	// start, glibc's loading of shared libraries, name resolution and certificates; io.Copy's
	// zero-copy paths (copy_file_range, sendfile, splice); file watching (fsnotify).
	{"read", unix.SYS_READ},
	{"write", unix.SYS_WRITE},
	{"readv", unix.SYS_READV},
	{"writev", unix.SYS_WRITEV},
	{"pread64", unix.SYS_PREAD64},
	{"pwrite64", unix.SYS_PWRITE64},
	{"preadv", unix.SYS_PREADV},
	{"pwritev", unix.SYS_PWRITEV},
	{"openat", unix.SYS_OPENAT},
	{"openat2", unix.SYS_OPENAT2},
	{"close", unix.SYS_CLOSE},
	{"close_range", unix.SYS_CLOSE_RANGE},
	{"lseek", unix.SYS_LSEEK},
	{"fstat", unix.SYS_FSTAT},
	{"newfstatat", unix.SYS_NEWFSTATAT},
	{"statx", unix.SYS_STATX},
	{"statfs", unix.SYS_STATFS},
	{"fstatfs", unix.SYS_FSTATFS},
	{"fcntl", unix.SYS_FCNTL},
	{"dup", unix.SYS_DUP},
	{"dup3", unix.SYS_DUP3},
	{"flock", unix.SYS_FLOCK},
	{"fsync", unix.SYS_FSYNC},
	{"fdatasync", unix.SYS_FDATASYNC},
	{"ftruncate", unix.SYS_FTRUNCATE},
	{"fallocate", unix.SYS_FALLOCATE},
	{"fadvise64", unix.SYS_FADVISE64},
	{"getdents64", unix.SYS_GETDENTS64},
	{"readlinkat", unix.SYS_READLINKAT},
	{"faccessat", unix.SYS_FACCESSAT},
	{"faccessat2", unix.SYS_FACCESSAT2},
	{"mkdirat", unix.SYS_MKDIRAT},
	{"unlinkat", unix.SYS_UNLINKAT},
	{"renameat2", unix.SYS_RENAMEAT2},
	{"linkat", unix.SYS_LINKAT},
	{"symlinkat", unix.SYS_SYMLINKAT},
	{"getcwd", unix.SYS_GETCWD},
	{"chdir", unix.SYS_CHDIR},
	{"fchdir", unix.SYS_FCHDIR},
	{"umask", unix.SYS_UMASK},
	{"copy_file_range", unix.SYS_COPY_FILE_RANGE},
	{"sendfile", unix.SYS_SENDFILE},
	{"splice", unix.SYS_SPLICE},
	{"inotify_init1", unix.SYS_INOTIFY_INIT1},
	{"inotify_add_watch", unix.SYS_INOTIFY_ADD_WATCH},
	{"inotify_rm_watch", unix.SYS_INOTIFY_RM_WATCH},

	// Sockets (socket itself is filtered below): go-plugin's unix socket and its gRPC server,
	// the driver's own clients (HTTP, DNS over UDP and TCP; Landlock decides which TCP ports),
	// socket options of net and gRPC.
	{"socketpair", unix.SYS_SOCKETPAIR},
	{"bind", unix.SYS_BIND},
	{"listen", unix.SYS_LISTEN},
	{"accept4", unix.SYS_ACCEPT4},
	{"connect", unix.SYS_CONNECT},
	{"getsockname", unix.SYS_GETSOCKNAME},
	{"getpeername", unix.SYS_GETPEERNAME},
	{"setsockopt", unix.SYS_SETSOCKOPT},
	{"getsockopt", unix.SYS_GETSOCKOPT},
	{"sendto", unix.SYS_SENDTO},
	{"recvfrom", unix.SYS_RECVFROM},
	{"sendmsg", unix.SYS_SENDMSG},
	{"recvmsg", unix.SYS_RECVMSG},
	{"sendmmsg", unix.SYS_SENDMMSG},
	{"recvmmsg", unix.SYS_RECVMMSG},
	{"shutdown", unix.SYS_SHUTDOWN},

	// Processes: the launcher's execve of the driver, and a driver's own children through
	// os/exec (started with clone, waited for with a pidfd; they inherit every restriction).
	{"execve", unix.SYS_EXECVE},
	{"wait4", unix.SYS_WAIT4},
	{"waitid", unix.SYS_WAITID},
	{"pidfd_open", unix.SYS_PIDFD_OPEN},
	{"pidfd_send_signal", unix.SYS_PIDFD_SEND_SIGNAL},
	{"setpgid", unix.SYS_SETPGID},
	{"getpgid", unix.SYS_GETPGID},
	{"setsid", unix.SYS_SETSID},
	{"getsid", unix.SYS_GETSID},

	// The process's own state: prctl (the runtime names its mappings, a driver sets its
	// parent-death signal or no_new_privs; what the filter and the pid namespace hold does not
	// depend on it), its limits (read; lowered by the driver itself at most: raising a hard
	// limit needs a capability it lacks), its usage, the kernel's name and version, randomness.
	{"prctl", unix.SYS_PRCTL},
	{"prlimit64", unix.SYS_PRLIMIT64},
	{"getrlimit", unix.SYS_GETRLIMIT},
	{"setrlimit", unix.SYS_SETRLIMIT},
	{"getrusage", unix.SYS_GETRUSAGE},
	{"sysinfo", unix.SYS_SYSINFO},
	{"uname", unix.SYS_UNAME},
	{"getrandom", unix.SYS_GETRANDOM},

	// Credentials, read only (os/user, glibc, hclog): a driver changes none of them.
	{"getuid", unix.SYS_GETUID},
	{"geteuid", unix.SYS_GETEUID},
	{"getgid", unix.SYS_GETGID},
	{"getegid", unix.SYS_GETEGID},
	{"getgroups", unix.SYS_GETGROUPS},
	{"getresuid", unix.SYS_GETRESUID},
	{"getresgid", unix.SYS_GETRESGID},
	{"capget", unix.SYS_CAPGET},

	// A driver that sandboxes itself further (Landlock, a seccomp filter of its own: filters
	// only add refusals).
	{"landlock_create_ruleset", unix.SYS_LANDLOCK_CREATE_RULESET},
	{"landlock_add_rule", unix.SYS_LANDLOCK_ADD_RULE},
	{"landlock_restrict_self", unix.SYS_LANDLOCK_RESTRICT_SELF},
	{"seccomp", unix.SYS_SECCOMP},
}

// The calls allowed only with some arguments (see seccompProgram): ioctl (not TIOCSTI or
// TIOCLINUX), socket (the families of allowedSocketFamilies), clone (no namespace flags),
// personality (the default persona, or a query); and clone3, refused with ENOSYS, which makes
// glibc fall back to clone: its flags are in memory a filter cannot read.
const (
	sysIoctl       = unix.SYS_IOCTL
	sysSocket      = unix.SYS_SOCKET
	sysClone       = unix.SYS_CLONE
	sysClone3      = unix.SYS_CLONE3
	sysPersonality = unix.SYS_PERSONALITY
)
