// Package bounds is a hostile driver plugin for tests, written against the public SDK
// (driverplugin) the way an outside author would. Its flags make it report more than the host
// accepts (methods, manifest entries, capability keys, string lengths, message bytes), repeat
// methods, flood its stderr, write control characters into its log lines, flood go-plugin's
// broker, or report another plugin's key.
//
// It is a test fixture only: the pluginhost tests re-execute their test binary as this driver.
// Nothing in the shipped authz binary imports it.
package bounds

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/authz-dev/authz/driverplugin"
)

// Defaults of the driver: an honest sandbox provider that grants duplex.
const (
	DefaultPluginKey = "bounds.sandbox"
	DefaultDriverKey = "bounds"
)

// Options select the misbehaviour.
type Options struct {
	PluginKey   string
	Methods     int           // extra distinct methods beyond duplexChannelOpen
	DupMethods  int           // copies of duplexChannelOpen appended to the list
	Entries     int           // extra manifest entries beyond the first
	UnknownCaps int           // unknown capability keys in the first entry
	BadCaps     int           // non-boolean capability values in every entry
	StringLen   int           // pad the plugin key, driver keys, method names and capability keys to this length
	StartDelay  time.Duration // wait this long in Describe
}

// Driver is the hostile driver.
type Driver struct{ opts Options }

var _ driverplugin.Driver = (*Driver)(nil)

func pad(s string, n int) string {
	if len(s) >= n {
		return s
	}
	return s + strings.Repeat("x", n-len(s))
}

// Describe implements driverplugin.Driver.
func (d *Driver) Describe(ctx context.Context) (driverplugin.Description, error) {
	if d.opts.StartDelay > 0 {
		select {
		case <-time.After(d.opts.StartDelay):
		case <-ctx.Done():
			return driverplugin.Description{}, ctx.Err()
		}
	}
	n := d.opts.StringLen
	caps := map[string]any{"duplexCommandStream": true}
	for i := range d.opts.UnknownCaps {
		caps[pad(fmt.Sprintf("unknownCapability%d", i), n)] = true
	}
	entries := []driverplugin.EnvironmentDriver{{
		DriverKey: pad(DefaultDriverKey, n), Kind: driverplugin.KindSandboxProvider, SandboxCapabilities: caps,
	}}
	for i := range d.opts.Entries {
		entries = append(entries, driverplugin.EnvironmentDriver{
			DriverKey:           pad(fmt.Sprintf("extra%d", i), n),
			Kind:                driverplugin.KindEnvironmentDriver,
			SandboxCapabilities: map[string]any{"duplexCommandStream": true},
		})
	}
	for i := range entries {
		for j := range d.opts.BadCaps {
			entries[i].SandboxCapabilities[fmt.Sprintf("bad%d", j)] = strings.Repeat("not a boolean ", 8)
		}
	}
	return driverplugin.Description{Key: pad(d.opts.PluginKey, n), EnvironmentDrivers: entries}, nil
}

// SupportedMethods implements driverplugin.Driver.
func (d *Driver) SupportedMethods(context.Context) ([]string, error) {
	methods := []string{"duplexChannelOpen"}
	for i := range d.opts.Methods {
		methods = append(methods, pad(fmt.Sprintf("method%d", i), d.opts.StringLen))
	}
	for range d.opts.DupMethods {
		methods = append(methods, "duplexChannelOpen")
	}
	return methods, nil
}

// CheckConfig implements driverplugin.Driver: every config is fine.
func (d *Driver) CheckConfig(context.Context, string, map[string]any) (bool, string, error) {
	return true, "", nil
}

// brokerFlooder serves the driver and, as soon as go-plugin hands it the broker, asks the host
// to broker connections in a tight loop.
type brokerFlooder struct {
	driverplugin.DriverPlugin
	log hclog.Logger
}

func (p *brokerFlooder) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	go func() {
		for i := 0; ; i++ {
			l, err := broker.Accept(broker.NextId())
			if err != nil {
				if i%1000 == 0 {
					p.log.Warn("broker accept failed", "error", err)
				}
				time.Sleep(time.Millisecond)
				continue
			}
			_ = l.Close()
		}
	}()
	return p.DriverPlugin.GRPCServer(broker, s)
}

// Main runs the driver with command-line args (without the program name) and returns the exit
// status.
func Main(args []string) int {
	fs := flag.NewFlagSet("bounds-driver", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	opts := Options{}
	fs.StringVar(&opts.PluginKey, "key", DefaultPluginKey, "plugin key reported by Describe")
	fs.IntVar(&opts.Methods, "methods", 0, "report this many extra distinct methods")
	fs.IntVar(&opts.DupMethods, "dup-methods", 0, "report duplexChannelOpen this many more times")
	fs.IntVar(&opts.Entries, "entries", 0, "report this many extra manifest entries")
	fs.IntVar(&opts.UnknownCaps, "unknown-caps", 0, "declare this many unknown capability keys")
	fs.IntVar(&opts.BadCaps, "bad-caps", 0, "declare this many non-boolean capability values in every entry")
	fs.IntVar(&opts.StringLen, "string-len", 0, "pad every key and method name to this many bytes")
	fs.DurationVar(&opts.StartDelay, "start-delay", 0, "wait this long in Describe")
	stderrFlood := fs.Bool("stderr-flood", false, "write log lines to stderr as fast as possible")
	controlChars := fs.Bool("control-chars", false, "write log lines holding \\r, \\n and ANSI escapes")
	brokerFlood := fs.Bool("broker-flood", false, "call broker.Accept in a loop")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// The raw stderr: go-plugin redirects os.Stderr into its gRPC stdio stream once Serve runs.
	stderr := os.Stderr
	log := hclog.New(&hclog.LoggerOptions{Name: "bounds-driver", Level: hclog.Info, Output: stderr, JSONFormat: true})
	if *controlChars {
		log.Error("forged\r2026-01-01T00:00:00.000Z [ERROR] host: \x1b[31mFORGED HOST LINE\x1b[0m")
		_, _ = fmt.Fprint(stderr, "[ERROR] plain\rFORGED PLAIN LINE \x1b]0;title\x07 \u202eevil\n")
		log.Warn("value", "k\rforged", "v\x1b[2Kforged\nsecond")
	}
	if *stderrFlood {
		go flood(stderr)
	}
	d := &Driver{opts: opts}
	if !*brokerFlood {
		driverplugin.Serve(d)
		return 0
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: driverplugin.Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			driverplugin.ProtocolVersion: {driverplugin.PluginName: &brokerFlooder{DriverPlugin: driverplugin.DriverPlugin{Impl: d}, log: log}},
		},
		GRPCServer: plugin.DefaultGRPCServer,
		Logger:     log,
	})
	return 0
}

// flood writes hclog JSON error lines, plain lines and one very long line, forever.
func flood(w io.Writer) {
	log := hclog.New(&hclog.LoggerOptions{Name: "flood", Level: hclog.Info, Output: w, JSONFormat: true})
	long := "[ERROR] " + strings.Repeat("y", 200_000) + "\n"
	for i := 0; ; i++ {
		log.Error("flooding the host log", "i", i, "padding", strings.Repeat("z", 200))
		_, _ = fmt.Fprintf(w, "[ERROR] plain flood line %d\n", i)
		if i%1000 == 0 {
			_, _ = io.WriteString(w, long)
		}
	}
}
