//go:build linux

// Package liveness is a test-only authz driver plugin that stops answering after it was found
// ready, in the two ways a process can look alive to its pid and still serve nothing:
//
//   - selfstop: it sends itself SIGSTOP. The process exists, its socket accepts connections,
//     and no call is ever answered.
//   - mainexit: its main thread (the thread-group leader) ends with the raw exit system call
//     while the other threads keep running. The process table shows the leader as a zombie;
//     the process is never reaped while its threads live, so a supervisor waiting for its exit
//     waits forever.
//
// Otherwise it is the example driver, reporting the plugin key -plugin-key. The authz command
// never links it (TestNotInTheShippedBinary); the host's tests run it by re-executing their own
// binary.
package liveness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/testdrivers/faults"
)

// Marker is the first argument that makes a test binary run as this driver (see Main).
const Marker = "--as-liveness-driver"

// Modes of the driver.
const (
	ModeSelfStop = "selfstop" // SIGSTOP itself once ready
	ModeMainExit = "mainexit" // end the main thread once ready, the other threads live on
)

// The main goroutine must run on the main thread for mainexit: a function locked to its thread
// in an init function keeps main on the process's first thread, the thread-group leader. Only
// the driver locks it; a test binary that merely links this package is left alone.
func init() {
	if len(os.Args) > 1 && os.Args[1] == Marker {
		runtime.LockOSThread()
	}
}

// readyDriver is the example driver that reports when the host has read its methods, the last
// call of a worker's start.
type readyDriver struct {
	*faults.Driver
	once  sync.Once
	ready chan struct{}
}

func (d *readyDriver) SupportedMethods(ctx context.Context) ([]string, error) {
	defer d.once.Do(func() { close(d.ready) })
	return d.Driver.SupportedMethods(ctx)
}

// Main runs the driver with command-line args (without the program name or the marker) and
// returns the process exit status. Call it from the main goroutine.
func Main(args []string) int {
	return run(args, os.Stderr)
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("liveness-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", ModeSelfStop, "how to stop answering once ready: selfstop or mainexit")
	after := fs.Duration("after", 100*time.Millisecond, "how long after the host read the methods")
	opts := faults.DefaultOptions()
	fs.StringVar(&opts.PluginKey, "plugin-key", opts.PluginKey, "plugin key reported by Describe")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *mode != ModeSelfStop && *mode != ModeMainExit {
		_, _ = fmt.Fprintf(stderr, "liveness-driver: unknown -mode %q\n", *mode)
		return 2
	}
	hs := driverplugin.Handshake
	if os.Getenv(hs.MagicCookieKey) != hs.MagicCookieValue {
		_, _ = fmt.Fprintln(stderr, "liveness-driver is a test driver plugin: the host starts it, it is not meant to be run by hand.")
		return 1
	}
	if *mode == ModeMainExit && unix.Gettid() != unix.Getpid() {
		_, _ = fmt.Fprintln(stderr, "liveness-driver: -mode mainexit needs Main on the main thread (link the package and call Main from main)")
		return 2
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "liveness-driver", Level: hclog.Info, Output: stderr, JSONFormat: true})
	d := &readyDriver{Driver: faults.New(opts, log), ready: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		driverplugin.Serve(d)
	}()
	select {
	case <-d.ready:
	case <-served:
		return 0
	}
	t := time.NewTimer(*after)
	select {
	case <-t.C:
	case <-served:
		return 0
	}
	switch *mode {
	case ModeSelfStop:
		log.Warn("stopping myself with SIGSTOP on purpose (-mode selfstop)")
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	case ModeMainExit:
		log.Warn("ending my main thread on purpose (-mode mainexit)")
		// exit(2), not exit_group(2): only this thread ends. Through Syscall, so that the
		// runtime counts the thread as in a system call and hands its P to another thread.
		_, _, _ = unix.Syscall(unix.SYS_EXIT, 0, 0, 0)
	}
	<-served
	return 0
}
