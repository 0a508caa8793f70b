// Package faults is a test-only authz driver plugin: the example driver of examples/exampledriver
// with flags that make it misbehave, so that the plugin host is tested against a real subprocess
// that crashes, hangs, lies about its manifest, rejects or stalls config checks, or prints
// garbage before the handshake. Without flags it is the example driver. The authz command never
// links it (TestNotInTheShippedBinary); the host's tests run it by re-executing their own binary.
package faults

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/examples/exampledriver"
)

// Marker is the first argument that makes a test binary run as this driver (see Main). The
// host starts drivers without the parent's environment, so the marker travels as an argument.
const Marker = "--as-faults-driver"

// CrashExitCode is the exit status of a driver that crashes on purpose (-crash-after).
const CrashExitCode = 3

// Options say how the driver misbehaves; the zero value behaves like the example driver.
type Options struct {
	PluginKey    string         // reported by Describe (empty: the manifest is invalid)
	DriverKey    string         // driverKey of the manifest entry (empty: invalid)
	Kind         string         // kind of the manifest entry
	OmitMethods  []string       // left out of SupportedMethods
	Declare      map[string]any // overrides of the example's sandboxCapabilities
	RejectConfig bool           // reject every config
	ConfigDelay  time.Duration  // wait this long (or until the caller gives up) in CheckConfig
	CrashAfter   int            // exit(CrashExitCode) on the RPC after this many; 0: never
}

// DefaultOptions returns the options of a driver that behaves like the example driver.
func DefaultOptions() Options {
	return Options{
		PluginKey: exampledriver.DefaultPluginKey,
		DriverKey: exampledriver.DefaultDriverKey,
		Kind:      driverplugin.KindSandboxProvider,
	}
}

// Driver is the example driver wrapped with the faults its Options ask for.
type Driver struct {
	opts  Options
	inner *exampledriver.Driver
	log   hclog.Logger
	rpcs  atomic.Int64
	exit  func(code int)
}

var _ driverplugin.Driver = (*Driver)(nil)

// New returns the driver with opts as given (start from DefaultOptions).
func New(opts Options, log hclog.Logger) *Driver {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	inner := exampledriver.New(exampledriver.Options{PluginKey: opts.PluginKey, DriverKey: opts.DriverKey})
	return &Driver{opts: opts, inner: inner, log: log, exit: os.Exit}
}

// rpc counts one call and crashes the process when -crash-after says so.
func (d *Driver) rpc(name string) {
	n := d.rpcs.Add(1)
	if d.opts.CrashAfter > 0 && n > int64(d.opts.CrashAfter) {
		d.log.Warn("crashing on purpose", "rpc", name, "after", d.opts.CrashAfter)
		d.exit(CrashExitCode)
	}
}

// Describe implements driverplugin.Driver.
func (d *Driver) Describe(ctx context.Context) (driverplugin.Description, error) {
	d.rpc("Describe")
	desc, err := d.inner.Describe(ctx)
	if err != nil {
		return desc, err
	}
	for i := range desc.EnvironmentDrivers {
		e := &desc.EnvironmentDrivers[i]
		e.Kind = d.opts.Kind
		maps.Copy(e.SandboxCapabilities, d.opts.Declare)
	}
	return desc, nil
}

// SupportedMethods implements driverplugin.Driver.
func (d *Driver) SupportedMethods(ctx context.Context) ([]string, error) {
	d.rpc("SupportedMethods")
	methods, err := d.inner.SupportedMethods(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(methods, func(m string) bool { return slices.Contains(d.opts.OmitMethods, m) }), nil
}

// CheckConfig implements driverplugin.Driver.
func (d *Driver) CheckConfig(ctx context.Context, driverKey string, config map[string]any) (bool, string, error) {
	d.rpc("CheckConfig")
	if d.opts.ConfigDelay > 0 {
		t := time.NewTimer(d.opts.ConfigDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false, "", ctx.Err()
		}
	}
	if d.opts.RejectConfig && driverKey == d.opts.DriverKey {
		return false, "every config is rejected (-reject-config)", nil
	}
	return d.inner.CheckConfig(ctx, driverKey, config)
}

// Main runs the driver with command-line args (without the program name or the marker) and
// returns the process exit status. It serves until the host closes the connection.
func Main(args []string) int {
	return run(args, os.Stdout, os.Stderr)
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("faults-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		opts        = DefaultOptions()
		omit        listFlag
		declare     = declareFlag{}
		hangAtStart = fs.Bool("hang-at-start", false, "sleep forever instead of serving (tests the host's start timeout)")
		stdoutNoise = fs.Bool("stdout-noise", false, "print a line to stdout before the handshake (tests the host's error)")
	)
	fs.StringVar(&opts.PluginKey, "plugin-key", opts.PluginKey, "plugin key reported by Describe")
	fs.StringVar(&opts.DriverKey, "driver-key", opts.DriverKey, "driverKey of the manifest entry")
	fs.StringVar(&opts.Kind, "kind", opts.Kind, "kind of the manifest entry")
	fs.Var(&omit, "omit-method", "leave this method out of SupportedMethods (repeatable)")
	fs.Var(declare, "declare", "KEY=JSONVALUE: declare sandboxCapabilities[KEY] (repeatable), e.g. 'duplexCommandStream=\"true\"'")
	fs.BoolVar(&opts.RejectConfig, "reject-config", false, "reject every config")
	fs.DurationVar(&opts.ConfigDelay, "config-delay", 0, "wait this long in CheckConfig")
	fs.IntVar(&opts.CrashAfter, "crash-after", 0, "exit(3) on the RPC after N RPCs (0: never)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "faults-driver: unexpected arguments %q\n", fs.Args())
		return 2
	}
	opts.OmitMethods = omit
	opts.Declare = declare

	hs := driverplugin.Handshake
	if os.Getenv(hs.MagicCookieKey) != hs.MagicCookieValue {
		_, _ = fmt.Fprintln(stderr, "faults-driver is a test driver plugin: the host starts it, it is not meant to be run by hand.")
		return 1
	}

	// Logs go to stderr as JSON, which the host parses; stdout carries the handshake.
	log := hclog.New(&hclog.LoggerOptions{Name: "faults-driver", Level: hclog.Info, Output: stderr, JSONFormat: true})
	if *hangAtStart {
		log.Warn("hanging before the handshake on purpose (-hang-at-start)")
		for {
			time.Sleep(time.Hour)
		}
	}
	if *stdoutNoise {
		_, _ = fmt.Fprintln(stdout, "faults-driver: hello from stdout (-stdout-noise)")
	}
	driverplugin.Serve(New(opts, log))
	return 0
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// declareFlag is a repeatable KEY=JSONVALUE flag.
type declareFlag map[string]any

func (d declareFlag) String() string {
	b, _ := json.Marshal(map[string]any(d))
	return string(b)
}

func (d declareFlag) Set(s string) error {
	key, raw, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return fmt.Errorf("want KEY=JSONVALUE, got %q", s)
	}
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return fmt.Errorf("value of %s is not JSON: %w", key, err)
	}
	d[key] = v
	return nil
}
