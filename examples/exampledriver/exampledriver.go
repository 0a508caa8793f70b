// Package exampledriver is an example sandbox provider served as an authz driver plugin. It
// shows the shape of a driver built on the driverplugin SDK, and it only behaves: the faults
// the plugin host is tested against live in a test-only driver (internal/testdrivers/faults).
//
// The authz binary serves it from a hidden subcommand (`authz example-driver`), and
// examples/exampledriver/cmd/example-driver builds it as a standalone binary.
package exampledriver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/authz-dev/authz/driverplugin"
)

// Defaults of the example driver.
const (
	DefaultPluginKey = "example.sandbox"
	DefaultDriverKey = "example"
)

// DefaultMethods are the runtime methods the example driver reports.
var DefaultMethods = []string{"duplexChannelOpen", "environmentExecute", "environmentSyncIn", "environmentSyncOut"}

// Options configure the example driver. Flags set them in Main.
type Options struct {
	PluginKey string // the plugin key Describe reports
	DriverKey string // the driverKey of its one manifest entry
}

// Driver is the example sandbox provider.
type Driver struct {
	opts Options
}

var _ driverplugin.Driver = (*Driver)(nil)

// DefaultOptions returns the options of the example driver the default config starts.
func DefaultOptions() Options {
	return Options{PluginKey: DefaultPluginKey, DriverKey: DefaultDriverKey}
}

// New returns the example driver with opts as given (start from DefaultOptions).
func New(opts Options) *Driver {
	return &Driver{opts: opts}
}

// Describe implements driverplugin.Driver.
func (d *Driver) Describe(context.Context) (driverplugin.Description, error) {
	return driverplugin.Description{
		Key: d.opts.PluginKey,
		EnvironmentDrivers: []driverplugin.EnvironmentDriver{{
			DriverKey:           d.opts.DriverKey,
			Kind:                driverplugin.KindSandboxProvider,
			SandboxCapabilities: map[string]any{"duplexCommandStream": true, "incrementalSessionOutput": true},
		}},
	}, nil
}

// SupportedMethods implements driverplugin.Driver.
func (d *Driver) SupportedMethods(context.Context) ([]string, error) {
	return slices.Clone(DefaultMethods), nil
}

// CheckConfig implements driverplugin.Driver: any config of its own driver key is fine except
// one with "reject": true.
func (d *Driver) CheckConfig(_ context.Context, driverKey string, config map[string]any) (bool, string, error) {
	switch {
	case driverKey != d.opts.DriverKey:
		return false, fmt.Sprintf("unknown driver key %q: this plugin serves %q", driverKey, d.opts.DriverKey), nil
	case config["reject"] == true:
		return false, `config sets "reject": true`, nil
	}
	return true, "", nil
}

// Main runs the example driver with command-line args (without the program name) and returns
// the process exit status. It serves until the host closes the connection.
func Main(args []string) int {
	return run(args, os.Stderr)
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("example-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := DefaultOptions()
	fs.StringVar(&opts.PluginKey, "plugin-key", opts.PluginKey, "plugin key reported by Describe")
	fs.StringVar(&opts.DriverKey, "driver-key", opts.DriverKey, "driverKey of the manifest entry")
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
	if opts.PluginKey == "" || opts.DriverKey == "" {
		_, _ = fmt.Fprintln(stderr, "example-driver: -plugin-key and -driver-key must not be empty")
		return 2
	}

	hs := driverplugin.Handshake
	if os.Getenv(hs.MagicCookieKey) != hs.MagicCookieValue {
		_, _ = fmt.Fprintln(stderr, "example-driver is an authz driver plugin: authz starts it, it is not meant to be run by hand.")
		return 1
	}
	driverplugin.Serve(New(opts))
	return 0
}
