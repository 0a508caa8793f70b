// Package exampledriver is an example sandbox provider served as an authz driver plugin. It
// shows the shape of a driver built on the driverplugin SDK and, through its flags, misbehaves
// on request so that the plugin host can be tested against a real subprocess that crashes,
// hangs, lies about its capabilities or prints garbage before the handshake.
//
// The authz binary serves it from a hidden subcommand (`authz example-driver`), and
// examples/exampledriver/cmd/example-driver builds it as a standalone binary.
package exampledriver

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/driverplugin"
)

// Defaults of the example driver.
const (
	DefaultPluginKey = "example.sandbox"
	DefaultDriverKey = "example"
)

// DefaultMethods are the runtime methods the example driver reports.
var DefaultMethods = []string{"duplexChannelOpen", "environmentExecute", "environmentSyncIn", "environmentSyncOut"}

// CrashExitCode is the exit status of a driver that crashes on purpose (-crash-after).
const CrashExitCode = 3

// Options configure the example driver. Flags set them in Main.
type Options struct {
	PluginKey    string
	DriverKey    string
	Kind         string
	OmitMethods  []string
	Declare      map[string]any // overrides of the default sandboxCapabilities
	RejectConfig bool           // reject every config
	ConfigDelay  time.Duration  // wait this long (or until the caller gives up) in CheckConfig
	CrashAfter   int            // exit(CrashExitCode) on the RPC after this many; 0: never
}

// Driver is the example sandbox provider.
type Driver struct {
	opts Options
	log  hclog.Logger
	rpcs atomic.Int64
	exit func(code int)
}

var _ driverplugin.Driver = (*Driver)(nil)

// DefaultOptions returns the options of a well-behaved example driver.
func DefaultOptions() Options {
	return Options{PluginKey: DefaultPluginKey, DriverKey: DefaultDriverKey, Kind: driverplugin.KindSandboxProvider}
}

// New returns the example driver with opts as given (start from DefaultOptions): an empty key
// or kind is reported as such, which is how tests make the driver lie.
func New(opts Options, log hclog.Logger) *Driver {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Driver{opts: opts, log: log, exit: os.Exit}
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
func (d *Driver) Describe(context.Context) (driverplugin.Description, error) {
	d.rpc("Describe")
	caps := map[string]any{"duplexCommandStream": true, "incrementalSessionOutput": true}
	for k, v := range d.opts.Declare {
		caps[k] = v
	}
	return driverplugin.Description{
		Key: d.opts.PluginKey,
		EnvironmentDrivers: []driverplugin.EnvironmentDriver{{
			DriverKey:           d.opts.DriverKey,
			Kind:                d.opts.Kind,
			SandboxCapabilities: caps,
		}},
	}, nil
}

// SupportedMethods implements driverplugin.Driver.
func (d *Driver) SupportedMethods(context.Context) ([]string, error) {
	d.rpc("SupportedMethods")
	out := make([]string, 0, len(DefaultMethods))
	for _, m := range DefaultMethods {
		if !slices.Contains(d.opts.OmitMethods, m) {
			out = append(out, m)
		}
	}
	return out, nil
}

// CheckConfig implements driverplugin.Driver: any config is fine except one with "reject": true
// (or every config under -reject-config).
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
	switch {
	case driverKey != d.opts.DriverKey:
		return false, fmt.Sprintf("unknown driver key %q: this plugin serves %q", driverKey, d.opts.DriverKey), nil
	case d.opts.RejectConfig:
		return false, "every config is rejected (-reject-config)", nil
	case config["reject"] == true:
		return false, `config sets "reject": true`, nil
	}
	return true, "", nil
}

// Main runs the example driver with command-line args (without the program name) and returns
// the process exit status. It serves until the host closes the connection.
func Main(args []string) int {
	return run(args, os.Stdout, os.Stderr)
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("example-driver", flag.ContinueOnError)
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
		_, _ = fmt.Fprintf(stderr, "example-driver: unexpected arguments %q\n", fs.Args())
		return 2
	}
	opts.OmitMethods = omit
	opts.Declare = declare

	hs := driverplugin.Handshake
	if os.Getenv(hs.MagicCookieKey) != hs.MagicCookieValue {
		_, _ = fmt.Fprintln(stderr, "example-driver is an authz driver plugin: authz starts it, it is not meant to be run by hand.")
		return 1
	}

	// Logs go to stderr as JSON, which the host parses; stdout carries the handshake.
	log := hclog.New(&hclog.LoggerOptions{Name: "example-driver", Level: hclog.Info, Output: stderr, JSONFormat: true})
	if *hangAtStart {
		log.Warn("hanging before the handshake on purpose (-hang-at-start)")
		for {
			time.Sleep(time.Hour)
		}
	}
	if *stdoutNoise {
		_, _ = fmt.Fprintln(stdout, "example-driver: hello from stdout (-stdout-noise)")
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
