// Package checks is a test-only authz driver plugin whose config check the test controls from
// outside the process: the example driver's manifest, and a CheckConfig that counts its calls in
// a file, hangs while a file exists, fails, or answers with a text of any size. The host's tests
// run it by re-executing their own binary; the authz command never links it.
package checks

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/examples/exampledriver"
)

// Marker is the first argument that makes a test binary run as this driver (see Main).
const Marker = "--as-checks-driver"

// Files in the control directory (-dir).
const (
	// CountFile gets one line per CheckConfig call, written when the call arrives.
	CountFile = "calls"
	// HoldFile makes every CheckConfig wait while it exists (or until the caller gives up).
	HoldFile = "hold"
)

// Options say how the config check behaves.
type Options struct {
	PluginKey  string        // reported by Describe
	Dir        string        // control directory: CountFile and HoldFile
	Delay      time.Duration // take this long over every check (or until the caller gives up)
	Fail       bool          // answer every check with an error
	ErrorText  string        // answer every check with an error of this text
	ErrorBytes int           // answer every check with an error whose text is this long
	// ReasonBytes answers every check "not valid" with a reason this long.
	ReasonBytes int
}

// Driver is the example driver with a controlled config check.
type Driver struct {
	opts  Options
	inner *exampledriver.Driver
	mu    sync.Mutex // serialises writes of CountFile
}

var _ driverplugin.Driver = (*Driver)(nil)

// New returns the driver.
func New(opts Options) *Driver {
	return &Driver{opts: opts, inner: exampledriver.New(exampledriver.Options{PluginKey: opts.PluginKey, DriverKey: exampledriver.DefaultDriverKey})}
}

// Describe implements driverplugin.Driver.
func (d *Driver) Describe(ctx context.Context) (driverplugin.Description, error) {
	return d.inner.Describe(ctx)
}

// SupportedMethods implements driverplugin.Driver.
func (d *Driver) SupportedMethods(ctx context.Context) ([]string, error) {
	return d.inner.SupportedMethods(ctx)
}

// CheckConfig implements driverplugin.Driver.
func (d *Driver) CheckConfig(ctx context.Context, driverKey string, config map[string]any) (bool, string, error) {
	if d.opts.Dir != "" {
		d.count()
		if err := d.hold(ctx); err != nil {
			return false, "", err
		}
	}
	if d.opts.Delay > 0 {
		t := time.NewTimer(d.opts.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false, "", ctx.Err()
		}
	}
	switch {
	case d.opts.ErrorBytes > 0:
		return false, "", errors.New(strings.Repeat("e", d.opts.ErrorBytes))
	case d.opts.ErrorText != "":
		return false, "", errors.New(d.opts.ErrorText)
	case d.opts.Fail:
		return false, "", errors.New("the provider's API is unreachable (-fail)")
	case d.opts.ReasonBytes > 0:
		return false, strings.Repeat("r", d.opts.ReasonBytes), nil
	}
	return d.inner.CheckConfig(ctx, driverKey, config)
}

// count appends a line to CountFile.
func (d *Driver) count() {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(d.opts.Dir, CountFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	_, _ = f.WriteString("call\n")
	_ = f.Close()
}

// hold waits while HoldFile exists.
func (d *Driver) hold(ctx context.Context) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		if _, err := os.Stat(filepath.Join(d.opts.Dir, HoldFile)); err != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Calls returns how many CheckConfig calls the driver with control directory dir received.
func Calls(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, CountFile))
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// Main runs the driver with command-line args (without the program name or the marker) and
// returns the process exit status. It serves until the host closes the connection.
func Main(args []string) int {
	return run(args, os.Stderr)
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("checks-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := Options{PluginKey: "checks.sandbox"}
	fs.StringVar(&opts.PluginKey, "plugin-key", opts.PluginKey, "plugin key reported by Describe")
	fs.StringVar(&opts.Dir, "dir", "", "control directory: count calls in DIR/"+CountFile+", hold while DIR/"+HoldFile+" exists")
	fs.DurationVar(&opts.Delay, "delay", 0, "take this long over every config check")
	fs.BoolVar(&opts.Fail, "fail", false, "answer every config check with an error")
	fs.StringVar(&opts.ErrorText, "error-text", "", "answer every config check with an error of this text")
	fs.IntVar(&opts.ErrorBytes, "error-bytes", 0, "answer every config check with an error text of N bytes")
	fs.IntVar(&opts.ReasonBytes, "reason-bytes", 0, "answer every config check not valid with a reason of N bytes")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "checks-driver: unexpected arguments %q\n", fs.Args())
		return 2
	}
	hs := driverplugin.Handshake
	if os.Getenv(hs.MagicCookieKey) != hs.MagicCookieValue {
		_, _ = fmt.Fprintln(stderr, "checks-driver is a test driver plugin: the host starts it, it is not meant to be run by hand.")
		return 1
	}
	driverplugin.Serve(New(opts))
	return 0
}
