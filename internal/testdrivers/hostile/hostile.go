//go:build linux

// Package hostile is a test-only authz driver plugin that attacks its host and the host's
// process table while it serves as the example driver:
//
//	steal -out FILE        try to reach into the host (-target PID, default its parent): list /proc/PPID/fd, copy its
//	                       descriptors with pidfd_getfd (and answer forged grants on every TCP
//	                       listener among them, for as long as it lives), open
//	                       /proc/PPID/mem for writing, write into /proc/PPID/fd/2, read its
//	                       memory with process_vm_readv, and make both calls on itself (which
//	                       only a seccomp filter refuses); FILE gets the outcome of each (JSON)
//	zombify -n N -out FILE leave N orphans (double fork, setsid, no environment) that end 0.5 s
//	                       later; FILE gets their pids once all were started
//	tty -out FILE          try to reach the operator through the host's terminal and session:
//	                       open /dev/tty and push input into it (TIOCSTI), push input into
//	                       the host's stdin (/proc/TARGET/fd/0) and into a terminal of its own
//	                       made its controlling terminal (which only a seccomp filter
//	                       refuses), and send SIGCONT to the host; -target PID is the host
//	                       (default: the parent)
//	outlive -out FILE      clear its parent-death signal, start a child (own session) that clears
//	                       its own and sleeps for 10 minutes; FILE gets both pids (hostpid
//	                       references), one a line, once the child runs
//	files -out FILE        as the user of a host without root: read each file of -read (a
//	                       comma-separated list), append to -append, open for writing the
//	                       /proc/PID/mem of the other driver whose command line holds -victim
//	                       (once VictimRuns(FILE) exists, the host saw it run: a /proc that
//	                       does not show it then is reported as ENOENT), send SIGCONT to the host (-target), bind a TCP port, connect to
//	                       the host's TCP port -connect
//	limits -out FILE       report its resource limits (/proc/self/limits) and try to write a
//	                       file of -size bytes into its TMPDIR
//	tmpdir -out FILE       fill its TMPDIR: try to write a file of -size bytes there, keep a
//	                       small one (FILE reports its path), and report the mount TMPDIR is on
//	                       (/proc/self/mountinfo)
//	calls -out FILE        make system calls a Go driver has no use for, which only a seccomp
//	                       allowlist refuses (io_uring_setup, name_to_handle_at, syslog, raw
//	                       packet sockets, namespaces through clone, unshare and setns, another
//	                       personality, clone3), and list the network interfaces (through a
//	                       NETLINK_ROUTE socket, which it must be allowed); FILE gets the outcome
//	                       of each (JSON)
//	fork-escape -out FILE  leave one orphan (double fork, setsid, no environment, /proc/self/exe
//	                       re-executed) that sleeps for 10 minutes; FILE gets its pid
//
// Pids in FILE are hostpid references (hostpid.Resolve turns them into the host's). Every
// mode takes -key KEY, the plugin key it reports. The authz command never links it
// (TestNotInTheShippedBinary); the host's tests run it by re-executing their own binary, and a
// FILE is written whole (renamed into place), so a test waits for it to exist.
package hostile

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/testdrivers/faults"
	"github.com/authz-dev/authz/internal/testdrivers/hostpid"
)

// Marker is the first argument that makes a test binary run as this driver (see Main).
const Marker = "--as-hostile-driver"

// ForgedLine is what the steal mode writes into the host's stderr when it can.
const ForgedLine = "hostile driver: this line was written into the host's stderr"

// Attempts of the steal mode, the keys of its FILE.
const (
	AttemptListFDs    = "list /proc/PPID/fd"
	AttemptPidfdGetfd = "pidfd_getfd"
	AttemptMem        = "open /proc/PPID/mem read-write"
	AttemptStderr     = "write /proc/PPID/fd/2"
	AttemptVMRead     = "process_vm_readv"
	// Calls on the driver itself, which only a seccomp filter refuses.
	AttemptSelfGetfd  = "pidfd_getfd of its own descriptor"
	AttemptSelfVMRead = "process_vm_readv of itself"
)

// Attempts of the tty mode, the keys of its FILE.
const (
	AttemptOpenTTY     = "open /dev/tty"
	AttemptTTYInject   = "TIOCSTI on /dev/tty"
	AttemptStdinInject = "TIOCSTI on the host's stdin"
	AttemptOwnInject   = "TIOCSTI on a terminal of its own"
	AttemptSIGCONT     = "SIGCONT to the host"
)

// Attempts of the files mode, the keys of its FILE (with ReadAttempt and AppendAttempt).
const (
	AttemptVictimMem  = "open another driver's /proc/PID/mem read-write"
	AttemptBindTCP    = "bind a TCP port"
	AttemptConnectTCP = "connect to the host's TCP port"
)

// ReadAttempt is the key of the files mode's attempt to read path.
func ReadAttempt(path string) string { return "read " + path }

// AppendAttempt is the key of the files mode's attempt to append to path.
func AppendAttempt(path string) string { return "append to " + path }

// Outcome is how one attempt ended: OK, or the error and its errno.
type Outcome struct {
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"` // what was obtained, or the error
	Errno  int    `json:"errno,omitempty"`
}

// probe is a variable at the same address in the host (the same test binary, not position
// independent) and the driver: process_vm_readv reads it from the host.
var probe = [8]byte{'h', 'o', 's', 't', 'i', 'l', 'e', '!'}

// Main runs the driver with command-line args (without the program name or the marker) and
// returns the process exit status.
func Main(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "hostile: want a mode: steal, zombify, fork-escape")
		return 2
	}
	mode := args[0]
	switch mode {
	case "fork": // the middle of a double fork: start the orphan, then exit at once
		return forkOrphan(args[1:])
	case "sleep":
		d, _ := time.ParseDuration(argAt(args, 1))
		time.Sleep(d)
		return 0
	case "linger": // the outlive mode's child: write its pid to args[1], then sleep
		_ = unix.Prctl(unix.PR_SET_PDEATHSIG, 0, 0, 0, 0)
		if err := writeFile(argAt(args, 1), []byte(ownHostPID())); err != nil {
			return 1
		}
		time.Sleep(10 * time.Minute)
		return 0
	}
	fs := flag.NewFlagSet("hostile "+mode, flag.ContinueOnError)
	out := fs.String("out", "", "file for what the driver did")
	n := fs.Int("n", 40, "zombify: how many orphans")
	key := fs.String("key", "test.hostile", "plugin key")
	target := fs.Int("target", 0, "tty: the host's pid (0: the parent)")
	readList := fs.String("read", "", "files: files to read, comma-separated")
	appendTo := fs.String("append", "", "files: a file to append to")
	victim := fs.String("victim", "", "files: a string in the command line of another driver")
	connect := fs.Int("connect", 0, "files: a TCP port of the host on 127.0.0.1")
	size := fs.Int("size", 0, "limits: bytes to write into a file")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	hs := driverplugin.Handshake
	if os.Getenv(hs.MagicCookieKey) != hs.MagicCookieValue {
		fmt.Fprintln(os.Stderr, "hostile is a test driver plugin: the host starts it, it is not meant to be run by hand.")
		return 1
	}
	var attack func() error
	switch mode {
	case "steal":
		attack = func() error { return writeJSON(*out, steal(hostPID(*target))) }
	case "zombify":
		attack = func() error { return orphans(*out, *n, "500ms") }
	case "tty":
		attack = func() error {
			return writeJSON(*out, ttyAttacks(hostPID(*target)))
		}
	case "files":
		attack = func() error {
			return writeJSON(*out, fileAttacks(hostPID(*target), *readList, *appendTo, *victim, VictimRuns(*out), *connect))
		}
	case "limits":
		attack = func() error { return writeJSON(*out, limitAttempts(*size)) }
	case "tmpdir":
		attack = func() error { return writeJSON(*out, tmpdirAttempts(*size)) }
	case "calls":
		attack = func() error { return writeJSON(*out, callAttempts()) }
	case "proc":
		attack = func() error { return writeJSON(*out, procAttempts(hostPID(*target))) }
	case "outlive":
		attack = func() error { return outlive(*out) }
	case "fork-escape":
		attack = func() error { return orphans(*out, 1, "10m") }
	default:
		fmt.Fprintf(os.Stderr, "hostile: unknown mode %q\n", mode)
		return 2
	}
	// While serving: starting many processes takes longer than the host's start timeout allows
	// on a slow machine.
	go func() {
		if err := attack(); err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
		}
	}()
	opts := faults.DefaultOptions()
	opts.PluginKey = *key
	log := hclog.New(&hclog.LoggerOptions{Name: "hostile", Level: hclog.Info, Output: os.Stderr, JSONFormat: true})
	driverplugin.Serve(faults.New(opts, log))
	return 0
}

func argAt(args []string, i int) string {
	if i < len(args) {
		return args[i]
	}
	return ""
}

// outcome records err (nil: success, with detail).
func outcome(detail string, err error) Outcome {
	if err == nil {
		return Outcome{OK: true, Detail: detail}
	}
	o := Outcome{Detail: err.Error()}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		o.Errno = int(errno)
	}
	return o
}

// hostPID is the host's pid: target, or the parent when target is 0.
func hostPID(target int) int {
	if target != 0 {
		return target
	}
	return os.Getppid()
}

// steal tries every way into the host it knows.
func steal(host int) map[string]Outcome {
	proc := "/proc/" + strconv.Itoa(host)
	res := map[string]Outcome{}

	var fds []int
	entries, err := os.ReadDir(proc + "/fd")
	if err == nil {
		for _, e := range entries {
			if fd, err := strconv.Atoi(e.Name()); err == nil {
				fds = append(fds, fd)
			}
		}
	} else {
		for fd := range 64 { // the numbers the host most likely uses
			fds = append(fds, fd)
		}
	}
	res[AttemptListFDs] = outcome(fmt.Sprintf("%d descriptors", len(entries)), err)

	res[AttemptPidfdGetfd] = getfd(host, fds)

	if f, err := os.OpenFile(proc+"/mem", os.O_RDWR, 0); err == nil {
		_ = f.Close()
		res[AttemptMem] = outcome("opened", nil)
	} else {
		res[AttemptMem] = outcome("", err)
	}

	if f, err := os.OpenFile(proc+"/fd/2", os.O_WRONLY|os.O_APPEND, 0); err == nil {
		_, err = f.WriteString(ForgedLine + "\n")
		_ = f.Close()
		res[AttemptStderr] = outcome("written", err)
	} else {
		res[AttemptStderr] = outcome("", err)
	}

	res[AttemptVMRead] = vmRead(host)
	res[AttemptSelfGetfd] = getfd(os.Getpid(), []int{0, 1, 2})
	res[AttemptSelfVMRead] = vmRead(os.Getpid())
	return res
}

// getfd copies each of the host's descriptors it can, and reports whether one was a listener.
func getfd(host int, fds []int) Outcome {
	pidfd, err := unix.PidfdOpen(host, 0)
	if err != nil {
		return outcome("", fmt.Errorf("pidfd_open: %w", err))
	}
	defer func() { _ = unix.Close(pidfd) }()
	var copied, listeners int
	var last error
	for _, fd := range fds {
		c, err := unix.PidfdGetfd(pidfd, fd, 0)
		if err != nil {
			if !errors.Is(err, unix.EBADF) {
				last = err
			}
			continue
		}
		copied++
		if v, err := unix.GetsockoptInt(c, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err == nil && v == 1 && host != os.Getpid() {
			listeners++
			if forge(c) {
				continue // the descriptor now serves forged grants
			}
		}
		_ = unix.Close(c)
	}
	if copied > 0 {
		return outcome(fmt.Sprintf("copied %d descriptors, %d of them listening sockets", copied, listeners), nil)
	}
	if last == nil {
		last = unix.EBADF
	}
	return outcome("", last)
}

// ForgedGrant is what the steal mode answers on a listener it took from the host.
const ForgedGrant = `{"allow":true,"forged":true}`

// forge answers every HTTP request on the stolen TCP listener fd with ForgedGrant, as long as
// the driver lives; false when fd is no TCP listener.
func forge(fd int) bool {
	f := os.NewFile(uintptr(fd), "stolen")
	ln, err := net.FileListener(f)
	_ = f.Close()
	if err != nil {
		return false
	}
	if _, ok := ln.Addr().(*net.TCPAddr); !ok {
		_ = ln.Close()
		return false
	}
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, ForgedGrant)
		}),
	}
	go func() { _ = srv.Serve(ln) }()
	return true
}

// vmRead reads probe from the host's memory.
func vmRead(host int) Outcome {
	var buf [len(probe)]byte
	local := []unix.Iovec{{Base: &buf[0], Len: uint64(len(buf))}}
	remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&probe[0])), Len: len(probe)}}
	n, err := unix.ProcessVMReadv(host, local, remote, 0)
	if err != nil {
		return outcome("", err)
	}
	return outcome(fmt.Sprintf("read %d bytes: %q", n, buf[:n]), nil)
}

// ttyAttacks tries to reach the operator's terminal and the host's session.
func ttyAttacks(host int) map[string]Outcome {
	res := map[string]Outcome{}
	if f, err := os.OpenFile("/dev/tty", os.O_RDWR, 0); err == nil {
		res[AttemptOpenTTY] = outcome("opened", nil)
		res[AttemptTTYInject] = outcome("pushed", inject(int(f.Fd())))
		_ = f.Close()
	} else {
		res[AttemptOpenTTY] = outcome("", err)
		res[AttemptTTYInject] = outcome("", err)
	}
	if f, err := os.OpenFile("/proc/"+strconv.Itoa(host)+"/fd/0", os.O_RDWR, 0); err == nil {
		res[AttemptStdinInject] = outcome("pushed", inject(int(f.Fd())))
		_ = f.Close()
	} else {
		res[AttemptStdinInject] = outcome("", err)
	}
	res[AttemptOwnInject] = outcome("pushed", ownTerminalInject())
	res[AttemptSIGCONT] = outcome("sent", unix.Kill(host, unix.SIGCONT))
	return res
}

// Attempts of the calls mode, the keys of its FILE: AttemptsOutsideTheAllowlist are refused
// with EPERM under authz's seccomp filter, AttemptClone3 with ENOSYS, and AttemptInterfaces
// succeeds.
const (
	AttemptIOURing       = "io_uring_setup"
	AttemptNameToHandle  = "name_to_handle_at of /"
	AttemptSyslog        = "syslog (size of the kernel's log buffer)"
	AttemptPacketSocket  = "socket(AF_PACKET)"
	AttemptAddKey        = "add_key"
	AttemptCloneNewUser  = "clone(CLONE_NEWUSER)"
	AttemptUnshare       = "unshare(CLONE_NEWUSER)"
	AttemptSetns         = "setns"
	AttemptPersonality   = "personality(PER_LINUX32)"
	AttemptClone3        = "clone3"
	AttemptInterfaces    = "list the network interfaces (NETLINK_ROUTE)"
	AttemptMemfdCreate   = "memfd_create"
	AttemptNetlinkAudit  = "socket(AF_NETLINK, NETLINK_AUDIT)"
	AttemptTIOCSTIOnNull = "ioctl(TIOCSTI) on /dev/null"
	AttemptMPTCPSocket   = "socket(AF_INET, IPPROTO_MPTCP)"
	AttemptChmod         = "chmod of a file of its own"
	AttemptChown         = "chown of a file of its own"
	AttemptUtimes        = "utimes of a file of its own"
	AttemptListenUnbound = "listen on a TCP socket never bound (no sandbox.connectTCP)"
)

// AttemptsOutsideTheAllowlist are the calls mode's attempts that authz's seccomp filter refuses
// with EPERM.
var AttemptsOutsideTheAllowlist = []string{
	AttemptIOURing, AttemptNameToHandle, AttemptSyslog, AttemptPacketSocket, AttemptAddKey,
	AttemptCloneNewUser, AttemptUnshare, AttemptSetns, AttemptPersonality, AttemptMemfdCreate,
	AttemptNetlinkAudit, AttemptTIOCSTIOnNull, AttemptMPTCPSocket, AttemptChmod, AttemptChown,
	AttemptUtimes, AttemptListenUnbound,
}

// callAttempts makes each call of the calls mode. None does harm where it succeeds: the
// descriptors it gets are closed, the personality is set back, and the clone and unshare
// flags are ones the kernel refuses (EINVAL) when no filter does.
func callAttempts() map[string]Outcome {
	res := map[string]Outcome{}
	errnoOf := func(errno unix.Errno) error {
		if errno != 0 {
			return errno
		}
		return nil
	}
	closeFD := func(fd int, err error) error {
		if err == nil {
			_ = unix.Close(fd)
		}
		return err
	}

	var params [120]byte // struct io_uring_params, zeroed
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	res[AttemptIOURing] = outcome("a ring", closeFD(int(fd), errnoOf(errno)))

	_, _, err := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
	res[AttemptNameToHandle] = outcome("a handle", err)

	const syslogActionSizeBuffer = 10
	_, _, errno = unix.Syscall(unix.SYS_SYSLOG, syslogActionSizeBuffer, 0, 0)
	res[AttemptSyslog] = outcome("read", errnoOf(errno))

	res[AttemptPacketSocket] = outcome("a socket", closeFD(unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)))
	res[AttemptNetlinkAudit] = outcome("a socket", closeFD(unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT)))

	_, err = unix.AddKey("user", "hostile", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
	res[AttemptAddKey] = outcome("a key", err)

	// CLONE_NEWUSER with CLONE_FS is invalid: the kernel answers EINVAL where no filter refuses it.
	_, _, errno = unix.RawSyscall(unix.SYS_CLONE, unix.CLONE_NEWUSER|unix.CLONE_FS, 0, 0)
	res[AttemptCloneNewUser] = outcome("a child", errnoOf(errno))
	// The process has several threads: EINVAL where no filter refuses it.
	res[AttemptUnshare] = outcome("a user namespace", unix.Unshare(unix.CLONE_NEWUSER))
	res[AttemptSetns] = outcome("joined", unix.Setns(-1, 0))

	const perLinux32 = 0x0008
	old, _, errno := unix.Syscall(unix.SYS_PERSONALITY, perLinux32, 0, 0)
	if errno == 0 {
		_, _, _ = unix.Syscall(unix.SYS_PERSONALITY, old, 0, 0)
	}
	res[AttemptPersonality] = outcome("changed", errnoOf(errno))

	// No arguments: the kernel answers EINVAL where no filter refuses it.
	_, _, errno = unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	res[AttemptClone3] = outcome("a child", errnoOf(errno))

	res[AttemptMemfdCreate] = outcome("a memfd", closeFD(unix.MemfdCreate("hostile", 0)))

	if f, err := os.Open(os.DevNull); err == nil {
		res[AttemptTIOCSTIOnNull] = outcome("pushed", inject(int(f.Fd())))
		_ = f.Close()
	} else {
		res[AttemptTIOCSTIOnNull] = outcome("", err)
	}

	res[AttemptMPTCPSocket] = outcome("a socket", closeFD(unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)))
	// The kernel binds an ephemeral port on every interface for a listen on an unbound socket,
	// which Landlock's bind rule does not see.
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0); err != nil {
		res[AttemptListenUnbound] = outcome("", err)
	} else {
		res[AttemptListenUnbound] = outcome("listening", unix.Listen(fd, 1))
		_ = unix.Close(fd)
	}

	// A file of its own, in its TMPDIR: what it may not do to it, it may not do to the
	// service's files of the same uid either.
	if f, err := os.CreateTemp("", "hostile-meta-"); err == nil {
		name := f.Name()
		_ = f.Close()
		res[AttemptChmod] = outcome("changed", os.Chmod(name, 0o666))
		res[AttemptChown] = outcome("changed", os.Chown(name, os.Getuid(), os.Getgid()))
		res[AttemptUtimes] = outcome("changed", os.Chtimes(name, time.Unix(0, 0), time.Unix(0, 0)))
		_ = os.Remove(name)
	} else {
		for _, a := range []string{AttemptChmod, AttemptChown, AttemptUtimes} {
			res[a] = outcome("", err)
		}
	}

	ifs, err := net.Interfaces()
	res[AttemptInterfaces] = outcome(fmt.Sprintf("%d interfaces", len(ifs)), err)
	return res
}

// Attempts of the limits mode, the keys of its FILE.
const (
	AttemptLimits    = "read /proc/self/limits"
	AttemptWriteFile = "write a file into TMPDIR"
)

// Attempts of the tmpdir mode.
const (
	AttemptFillTmp  = "write a file of -size bytes into TMPDIR"
	AttemptKeepTmp  = "keep a file in TMPDIR"
	AttemptTmpMount = "read the mount of TMPDIR"
)

// tmpdirAttempts writes size bytes into a file of its TMPDIR (removed after), keeps a file of
// 4 KiB there (its Detail is the path), and reports the line of /proc/self/mountinfo whose
// mount point is TMPDIR.
func tmpdirAttempts(size int) map[string]Outcome {
	res := map[string]Outcome{}
	f, err := os.CreateTemp("", "fill")
	if err == nil {
		var n int
		n, err = f.Write(make([]byte, size))
		if err == nil {
			err = f.Sync()
		}
		_ = f.Close()
		_ = os.Remove(f.Name())
		res[AttemptFillTmp] = outcome(fmt.Sprintf("wrote %d of %d bytes", n, size), err)
	} else {
		res[AttemptFillTmp] = outcome("", err)
	}
	kept := filepath.Join(os.TempDir(), "kept")
	res[AttemptKeepTmp] = outcome(kept, os.WriteFile(kept, make([]byte, 4096), 0o600))
	b, err := os.ReadFile("/proc/self/mountinfo")
	line := ""
	for l := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == os.TempDir() {
			line = l
		}
	}
	if err == nil && line == "" {
		err = fmt.Errorf("no mount on %s", os.TempDir())
	}
	res[AttemptTmpMount] = outcome(line, err)
	return res
}

// Attempts of the proc mode, the keys of its FILE.
const (
	AttemptListProc    = "list /proc"              // Detail: the pids listed, comma-separated
	AttemptOwnPID      = "its own pid"             // Detail: the pid
	AttemptHostCmdline = "read /proc/HOST/cmdline" // the host's pid (-target) as the host sees it
	AttemptSelfStatus  = "read /proc/self/status"  // what the Go runtime and a driver read of themselves
	AttemptProcMount   = "read the mount of /proc" // Detail: the line of /proc/self/mountinfo
)

// procAttempts lists the processes /proc shows, reads the host's command line and its own
// status, and reports the mount of /proc.
func procAttempts(host int) map[string]Outcome {
	res := map[string]Outcome{}
	entries, err := os.ReadDir("/proc")
	var pids []string
	for _, e := range entries {
		if _, perr := strconv.Atoi(e.Name()); perr == nil {
			pids = append(pids, e.Name())
		}
	}
	res[AttemptListProc] = outcome(strings.Join(pids, ","), err)
	res[AttemptOwnPID] = outcome(strconv.Itoa(os.Getpid()), nil)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(host) + "/cmdline")
	res[AttemptHostCmdline] = outcome(strings.ReplaceAll(string(b), "\x00", " "), err)
	b, err = os.ReadFile("/proc/self/status")
	res[AttemptSelfStatus] = outcome(fmt.Sprintf("%d bytes", len(b)), err)
	b, err = os.ReadFile("/proc/self/mountinfo")
	line := ""
	for l := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == "/proc" {
			line = l // the last: the one on top
		}
	}
	res[AttemptProcMount] = outcome(line, err)
	return res
}

// limitAttempts reports the driver's limits and writes size bytes into a file of its TMPDIR.
func limitAttempts(size int) map[string]Outcome {
	res := map[string]Outcome{}
	b, err := os.ReadFile("/proc/self/limits")
	res[AttemptLimits] = outcome(string(b), err)
	f, err := os.CreateTemp("", "big")
	if err == nil {
		_, err = f.Write(make([]byte, size))
		_ = f.Close()
		_ = os.Remove(f.Name())
	}
	res[AttemptWriteFile] = outcome(fmt.Sprintf("wrote %d bytes", size), err)
	return res
}

// VictimRuns is the file the host of the files mode writes once the victim driver runs, next
// to the driver's FILE.
func VictimRuns(out string) string { return out + ".victim-runs" }

// fileAttacks tries what a driver of a host without root could do as the host's own user.
// victimRuns: a file that exists once the host saw the victim driver run.
func fileAttacks(host int, readList, appendTo, victim, victimRuns string, port int) map[string]Outcome {
	res := map[string]Outcome{}
	for p := range strings.SplitSeq(readList, ",") {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		res[ReadAttempt(p)] = outcome(fmt.Sprintf("read %d bytes", len(b)), err)
	}
	if appendTo != "" {
		f, err := os.OpenFile(appendTo, os.O_WRONLY|os.O_APPEND, 0)
		if err == nil {
			_, err = f.WriteString(`{"forged":true}` + "\n")
			_ = f.Close()
		}
		res[AppendAttempt(appendTo)] = outcome("appended", err)
	}
	pid, runs := 0, false
	for deadline := time.Now().Add(30 * time.Second); pid == 0 && !runs && victim != "" && time.Now().Before(deadline); {
		_, err := os.Stat(victimRuns)
		runs = err == nil // looked at before the search: the victim ran during it
		if pid = findProcess(victim); pid == 0 && !runs {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if pid == 0 && runs {
		// Its /proc is its own pid namespace's: the other driver runs and is not there.
		res[AttemptVictimMem] = Outcome{Detail: "the other driver runs and its /proc does not show it", Errno: int(syscall.ENOENT)}
	} else if pid == 0 {
		res[AttemptVictimMem] = Outcome{Detail: "no process with " + victim + " in its command line"}
	} else if f, err := os.OpenFile("/proc/"+strconv.Itoa(pid)+"/mem", os.O_RDWR, 0); err == nil {
		_ = f.Close()
		res[AttemptVictimMem] = outcome("opened", nil)
	} else {
		res[AttemptVictimMem] = outcome("", err)
	}
	res[AttemptSIGCONT] = outcome("sent", unix.Kill(host, unix.SIGCONT))
	// A port of its choosing (Landlock leaves port 0, an ephemeral port, to the kernel's
	// choice unless a rule names it); another when that one is taken.
	for try := range 20 {
		addr := "127.0.0.1:" + strconv.Itoa(20000+(os.Getpid()*7+try*131)%20000)
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			res[AttemptBindTCP] = outcome("listening on "+ln.Addr().String(), nil)
			_ = ln.Close()
			break
		}
		res[AttemptBindTCP] = outcome("", err)
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second); err == nil {
		res[AttemptConnectTCP] = outcome("connected", nil)
		_ = c.Close()
	} else {
		res[AttemptConnectTCP] = outcome("", err)
	}
	return res
}

// findProcess returns the host pid of a process whose command line holds s, 0 when none: not
// this driver's (which names s as its victim) nor a launcher's (which carries its driver's
// arguments).
func findProcess(s string) int {
	if s == "" {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(b), s) || strings.Contains(string(b), "-victim") || strings.Contains(string(b), "--authz-driver") {
			continue
		}
		return pid
	}
	return 0
}

// inject pushes a harmless character into the input of the terminal fd.
func inject(fd int) error {
	c := byte('#')
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	if errno != 0 {
		return errno
	}
	return nil
}

// ownTerminalInject opens a new terminal, makes it the driver's controlling terminal (possible
// for a session leader without one) and pushes input into it: the kernel allows that to anyone,
// so only a seccomp filter refuses it.
func ownTerminalInject() error {
	master, slave, err := OpenPTY()
	if err != nil {
		return err
	}
	defer func() { _ = master.Close(); _ = slave.Close() }()
	if err := unix.IoctlSetInt(int(slave.Fd()), unix.TIOCSCTTY, 0); err != nil {
		return fmt.Errorf("make it the controlling terminal: %w", err)
	}
	return inject(int(slave.Fd()))
}

// OpenPTY opens a new pseudo-terminal pair.
func OpenPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		_ = master.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		_ = master.Close()
		return nil, nil, err
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		_ = master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// ownHostPID is this process's pid for the host's tests: a hostpid reference (hostpid.Resolve).
func ownHostPID() string { return hostpid.Self() }

// outlive clears the driver's parent-death signal and starts a child that clears its own.
func outlive(out string) error {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, 0, 0, 0, 0); err != nil {
		return err
	}
	gc := out + ".child"
	c := exec.Command("/proc/self/exe", Marker, "linger", gc)
	c.Env = []string{}
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		return err
	}
	go func() { _ = c.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(gc)
		if err == nil {
			return writeFile(out, []byte(ownHostPID()+"\n"+string(b)+"\n"))
		}
		if time.Now().After(deadline) {
			return errors.New("the child wrote no pid")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// orphans leaves n orphans that sleep for d (double fork, setsid, no environment) and writes
// their pids to out.
func orphans(out string, n int, d string) error {
	var pids []string
	for range n {
		// The driver runs from a sealed copy with no path of its own: /proc/self/exe is it.
		c := exec.Command("/proc/self/exe", Marker, "fork", d)
		c.Env = []string{}
		b, err := c.Output()
		if err != nil {
			return fmt.Errorf("double fork: %w", err)
		}
		pids = append(pids, strings.TrimSpace(string(b)))
	}
	return writeFile(out, []byte(strings.Join(pids, "\n")+"\n"))
}

// forkOrphan starts the orphan in a session of its own, with no environment, prints its pid
// and returns: the orphan is reparented to the nearest subreaper.
func forkOrphan(args []string) int {
	c := exec.Command("/proc/self/exe", Marker, "sleep", argAt(args, 0))
	c.Env = []string{}
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "hostile fork:", err)
		return 1
	}
	fmt.Println(hostpid.Of(c.Process.Pid))
	return 0
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFile(path, b)
}

// writeFile writes path whole: a temporary file renamed into place.
func writeFile(path string, b []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
