//go:build linux

// Package identity holds hostile driver plugins for tests, written against the public SDK
// (driverplugin) the way an outside author would. Each attacks what the plugin host vouches
// for: that the process it talks to is the pinned one, that a dead driver is gone, that one
// decision sees one generation, that a driver ends with the host and sees none of its files.
//
// A test binary runs Main(os.Args[2:]) when os.Args[1] is Marker; nothing shipped imports
// this package.
//
//	serve [flags]             a driver (see the flags)
//	sleep SECONDS             sleep, then exit (a child that holds what it inherited)
//
// Flags of serve:
//
//	-key K                    the plugin key (default test.identity)
//	-flipflop DIR             count starts in DIR/starts; even starts declare duplexCommandStream
//	                          without the duplexChannelOpen method, odd starts the method without
//	                          the declaration; DIR/pid-PID records "even" or "odd"
//	-child-holds-pipes FILE   start a child that holds stdout and stderr, write its pid to FILE
//	-setsid-children N        start N children in their own sessions (write pids to -pidfile)
//	-pidfile FILE             where -setsid-children writes the pids, one a line
//	-report-fds FILE          write the targets of every open descriptor to FILE
//	-orphans N                leave N orphans that end on their own 2 s later
//	-exec PATH                execve PATH (serve -key UNPINNED.impostor) instead of serving
//	-relay unix|tcp           start PATH of -exec as a child and hand the host its socket
//	                          (unix) or a loopback TCP relay to it (tcp)
//	-announce ADDR            print the go-plugin handshake by hand, naming the unix socket ADDR
//	                          ({TMPDIR} in it is the driver's TMPDIR; "@name" is abstract), and
//	                          serve nothing
//	-symlink TARGET           with -announce: first make {TMPDIR}/link a symbolic link to TARGET
package identity

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/testdrivers/hostpid"
)

// Marker is the first argument that makes a test binary run Main with the arguments after it;
// the drivers re-execute themselves with it to start their children.
const Marker = "--as-identity-driver"

// ImpostorKey is the plugin key an unpinned impostor reports.
const ImpostorKey = "UNPINNED.impostor"

// ImpostorTrailer ends an impostor binary: a copy of a driver binary with these bytes appended
// runs the same code, but not the pinned bytes. A driver that finds it at the end of its own
// executable reports ImpostorKey, whatever its flags say.
const ImpostorTrailer = "\x00identity: not the pinned binary"

// DriverKey is the driverKey of every entry these drivers declare.
const DriverKey = "identity"

// Main runs a mode with its arguments and returns the exit status.
func Main(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "identity: want a mode: serve, sleep")
		return 2
	}
	switch args[0] {
	case "sleep":
		secs, _ := strconv.Atoi(argAt(args, 1))
		time.Sleep(time.Duration(secs) * time.Second)
		return 0
	case "serve":
		return serve(args[1:])
	case "orphan":
		// Start a grandchild that outlives this process by SECONDS, then exit at once.
		c := exec.Command("/proc/self/exe", Marker, "sleep", argAt(args, 1))
		if err := c.Start(); err != nil {
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "identity: unknown mode %q\n", args[0])
	return 2
}

func argAt(args []string, i int) string {
	if i < len(args) {
		return args[i]
	}
	return ""
}

type options struct {
	key             string
	flipflop        string
	childHoldsPipes string
	setsidChildren  int
	pidfile         string
	reportFDs       string
	orphans         int
	execPath        string
	relay           string
	announce        string
	symlink         string
}

func serve(args []string) int {
	fs := flag.NewFlagSet("identity serve", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.key, "key", "test.identity", "plugin key")
	fs.StringVar(&o.flipflop, "flipflop", "", "state directory of the flip-flop driver")
	fs.StringVar(&o.childHoldsPipes, "child-holds-pipes", "", "start a child holding stdout/stderr; write its pid here")
	fs.IntVar(&o.setsidChildren, "setsid-children", 0, "start this many children in their own sessions")
	fs.StringVar(&o.pidfile, "pidfile", "", "pids of -setsid-children")
	fs.StringVar(&o.reportFDs, "report-fds", "", "write the open descriptors here")
	fs.IntVar(&o.orphans, "orphans", 0, "leave this many short-lived orphans (2 s), one every 100 ms")
	fs.StringVar(&o.execPath, "exec", "", "impostor binary")
	fs.StringVar(&o.relay, "relay", "", "unix or tcp: relay the host to the impostor instead of exec")
	fs.StringVar(&o.announce, "announce", "", "announce this unix socket in a handshake printed by hand")
	fs.StringVar(&o.symlink, "symlink", "", "with -announce: make {TMPDIR}/link a symbolic link to this")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "identity:", err)
		return 1
	}
	return 0
}

func run(o options) error {
	// The host runs a driver from a sealed in-memory copy: os.Executable names the memfd, and
	// /proc/self/exe re-executes the same bytes.
	const self = "/proc/self/exe"
	if o.reportFDs != "" {
		if err := reportFDs(o.reportFDs); err != nil {
			return err
		}
	}
	if o.childHoldsPipes != "" {
		// The child inherits stdout and stderr and outlives this process.
		c := exec.Command(self, Marker, "sleep", "60")
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			return err
		}
		if err := os.WriteFile(o.childHoldsPipes, []byte(hostpid.Of(c.Process.Pid)), 0o600); err != nil {
			return err
		}
	}
	if o.setsidChildren > 0 {
		var pids []string
		for range o.setsidChildren {
			c := exec.Command(self, Marker, "sleep", "60")
			c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := c.Start(); err != nil {
				return err
			}
			pids = append(pids, hostpid.Of(c.Process.Pid))
		}
		if err := os.WriteFile(o.pidfile, []byte(strings.Join(pids, "\n")), 0o600); err != nil {
			return err
		}
	}
	if o.orphans > 0 {
		go func() {
			for range o.orphans {
				c := exec.Command(self, Marker, "orphan", "2")
				if c.Run() != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	if o.announce != "" {
		return announce(o.announce, o.symlink)
	}
	impostorArgs := []string{Marker, "serve", "-key", ImpostorKey}
	switch {
	case o.execPath != "" && o.relay == "":
		// Keep the pid, the pipes and the environment; run another program.
		return syscall.Exec(o.execPath, append([]string{o.execPath}, impostorArgs...), os.Environ())
	case o.execPath != "":
		return relay(o.execPath, impostorArgs, o.relay)
	}

	d := &driver{key: o.key, declare: true, method: true}
	if isImpostor(self) {
		d.key = ImpostorKey
	}
	if o.flipflop != "" {
		odd, err := countStart(o.flipflop)
		if err != nil {
			return err
		}
		d.declare, d.method = !odd, odd
	}
	driverplugin.Serve(d)
	return nil
}

// announce prints the go-plugin handshake line a driver would, naming addr as its unix socket
// (after making {TMPDIR}/link a symbolic link to symlink, when given), and waits to be ended.
func announce(addr, symlink string) error {
	tmp := os.Getenv("TMPDIR")
	if symlink != "" {
		if err := os.Symlink(symlink, filepath.Join(tmp, "link")); err != nil {
			return err
		}
	}
	addr = strings.ReplaceAll(addr, "{TMPDIR}", tmp)
	fmt.Printf("%d|%d|unix|%s|grpc|\n", plugin.CoreProtocolVersion, driverplugin.ProtocolVersion, addr)
	time.Sleep(2 * time.Minute)
	return nil
}

// isImpostor reports whether the executable at path ends with ImpostorTrailer.
func isImpostor(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil || fi.Size() < int64(len(ImpostorTrailer)) {
		return false
	}
	tail := make([]byte, len(ImpostorTrailer))
	if _, err := f.ReadAt(tail, fi.Size()-int64(len(tail))); err != nil {
		return false
	}
	return string(tail) == ImpostorTrailer
}

// countStart counts one start of the flip-flop driver and tells whether it is odd.
func countStart(dir string) (bool, error) {
	path := filepath.Join(dir, "starts")
	b, _ := os.ReadFile(path)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	n++
	if err := os.WriteFile(path, []byte(strconv.Itoa(n)), 0o600); err != nil {
		return false, err
	}
	odd := n%2 == 1
	parity := "even"
	if odd {
		parity = "odd"
	}
	return odd, os.WriteFile(filepath.Join(dir, "pid-"+hostpid.Self()), []byte(parity), 0o600)
}

// reportFDs writes where each open descriptor of this process points.
func reportFDs(path string) error {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	var lines []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil {
			lines = append(lines, e.Name()+" "+target)
		}
	}
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600)
}

// relay starts the impostor as a child with this process's environment (so it has the host's
// mTLS certificate), reads its handshake line and hands it to the host: as is (the host dials
// the impostor's socket) or rewritten to a loopback TCP relay in front of it.
func relay(path string, args []string, network string) error {
	c := exec.Command(path, args...)
	c.Env = os.Environ()
	c.Stderr = os.Stderr
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := c.StdoutPipe()
	if err != nil {
		return err
	}
	if err := c.Start(); err != nil {
		return err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return fmt.Errorf("impostor handshake: %w", err)
	}
	parts := strings.Split(strings.TrimSpace(line), "|")
	if len(parts) < 4 || parts[2] != "unix" {
		return fmt.Errorf("impostor handshake %q", line)
	}
	if network == "tcp" {
		// The address is announced whether or not the relay could listen: a contained driver
		// may bind no TCP port (Landlock), and the host must refuse a TCP address either way.
		addr := "127.0.0.1:1"
		if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
			target := parts[3]
			go func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					go pipe(conn, target)
				}
			}()
			addr = ln.Addr().String()
		}
		parts[2], parts[3] = "tcp", addr
	}
	fmt.Println(strings.Join(parts, "|"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	<-ctx.Done()
	return nil
}

func pipe(conn net.Conn, unixAddr string) {
	defer func() { _ = conn.Close() }()
	up, err := net.Dial("unix", unixAddr)
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
	<-done
}

// driver declares duplexCommandStream and implements duplexChannelOpen as told.
type driver struct {
	key     string
	declare bool
	method  bool
}

func (d *driver) Describe(context.Context) (driverplugin.Description, error) {
	return driverplugin.Description{
		Key: d.key,
		EnvironmentDrivers: []driverplugin.EnvironmentDriver{{
			DriverKey:           DriverKey,
			Kind:                driverplugin.KindSandboxProvider,
			SandboxCapabilities: map[string]any{"duplexCommandStream": d.declare},
		}},
	}, nil
}

func (d *driver) SupportedMethods(context.Context) ([]string, error) {
	methods := []string{"environmentExecute"}
	if d.method {
		methods = append(methods, "duplexChannelOpen")
	}
	return methods, nil
}

func (d *driver) CheckConfig(_ context.Context, driverKey string, _ map[string]any) (bool, string, error) {
	if driverKey != DriverKey {
		return false, "unknown driver key", nil
	}
	return true, "", nil
}
