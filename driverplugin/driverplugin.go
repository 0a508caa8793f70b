// Package driverplugin is the public SDK for authz driver plugins: the go-plugin handshake, the
// versioned plugin set, the Driver interface and its gRPC transport. The authz plugin host
// (internal/pluginhost) and every driver, in this repository or out of it, import this one
// package, so both sides always agree on the contract.
//
// A driver is a separate program. authz starts it as a subprocess over go-plugin (gRPC only,
// automatic mTLS, the binary pinned by its SHA-256), calls Describe and SupportedMethods every
// time it starts a worker, and CheckConfig when a decision needs to know whether the worker
// accepts an environment's provider configuration. A driver writes logs to stderr only: stdout
// carries the go-plugin handshake.
//
// An out-of-tree driver is a main package:
//
//	package main
//
//	import (
//		"context"
//
//		"github.com/authz-dev/authz/driverplugin"
//	)
//
//	type daytona struct{}
//
//	func (daytona) Describe(context.Context) (driverplugin.Description, error) {
//		return driverplugin.Description{
//			Key: "acme.daytona",
//			EnvironmentDrivers: []driverplugin.EnvironmentDriver{{
//				DriverKey:           "daytona",
//				Kind:                driverplugin.KindSandboxProvider,
//				SandboxCapabilities: map[string]any{"duplexCommandStream": true},
//			}},
//		}, nil
//	}
//
//	func (daytona) SupportedMethods(context.Context) ([]string, error) {
//		return []string{"duplexChannelOpen", "environmentExecute"}, nil
//	}
//
//	func (daytona) CheckConfig(_ context.Context, driverKey string, config map[string]any) (bool, string, error) {
//		if _, ok := config["apiUrl"].(string); !ok {
//			return false, "config.apiUrl must be a string", nil
//		}
//		return true, "", nil
//	}
//
//	func main() { driverplugin.Serve(daytona{}) }
//
// See docs/drivers.md for pinning, status and restart rules.
package driverplugin

//go:generate ./generate.sh

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// ProtocolVersion is the version of the driver protocol this package speaks. A host and a driver
// built against different versions refuse each other at the handshake.
const ProtocolVersion = 1

// PluginName is the name under which the driver is dispensed from a plugin set.
const PluginName = "driver"

// Manifest entry kinds (docs/contract.md, "The facts (host state)").
const (
	KindSandboxProvider   = "sandbox_provider"
	KindEnvironmentDriver = "environment_driver"
)

// Handshake is the go-plugin handshake shared by the host and every driver. The magic cookie is
// not a secret: it only stops a driver binary from doing anything when run by hand.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "AUTHZ_DRIVER_PLUGIN",
	MagicCookieValue: "f3c1d8a2-authz-driver-plugin-v1",
}

// PluginSets is the versioned plugin set the host hands to go-plugin (ClientConfig.VersionedPlugins).
// It carries no implementation; drivers use Serve. Treat it as read-only.
var PluginSets = map[int]plugin.PluginSet{
	ProtocolVersion: {PluginName: &DriverPlugin{}},
}

// Driver is what a driver plugin implements. Every method takes the caller's context: the host
// bounds each call in time and cancels it when the decision that asked for it goes away.
type Driver interface {
	// Describe returns the plugin key and the manifest's environmentDrivers entries.
	Describe(ctx context.Context) (Description, error)
	// SupportedMethods returns the runtime methods this worker implements (for example
	// "duplexChannelOpen"). The host reads them again every time it starts a worker.
	SupportedMethods(ctx context.Context) ([]string, error)
	// CheckConfig reports whether the driver accepts config for driverKey; reason says why not.
	// An error means the driver could not tell, which the host counts as "not valid".
	CheckConfig(ctx context.Context, driverKey string, config map[string]any) (ok bool, reason string, err error)
}

// Description is a plugin's key and manifest.
type Description struct {
	// Key is the plugin key, e.g. "acme.daytona".
	Key string
	// EnvironmentDrivers are the manifest's environmentDrivers entries.
	EnvironmentDrivers []EnvironmentDriver
}

// EnvironmentDriver is one manifest entry.
type EnvironmentDriver struct {
	// DriverKey is the provider key the entry serves, e.g. "daytona".
	DriverKey string
	// Kind is KindSandboxProvider or KindEnvironmentDriver.
	Kind string
	// SandboxCapabilities is the declaration: capability key to JSON value. nil means absent.
	// The host accepts only boolean values; anything else makes the whole manifest invalid.
	SandboxCapabilities map[string]any
	// SupportsReusableLeases is the legacy field standing for sandboxCapabilities.reusableLeases
	// when that key is absent. nil means absent.
	SupportsReusableLeases *bool
}

// Serve serves d as a driver plugin over gRPC and returns when the host closes the connection.
// Call it from main. It never speaks go-plugin's legacy net/rpc protocol.
//
// Serve logs go-plugin's own messages as JSON to stderr, which the host forwards to its log.
// Do not write to stdout before Serve: stdout carries the handshake.
func Serve(d Driver) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			ProtocolVersion: {PluginName: &DriverPlugin{Impl: d}},
		},
		GRPCServer: plugin.DefaultGRPCServer,
		Logger: hclog.New(&hclog.LoggerOptions{
			Name:       "driverplugin",
			Level:      hclog.Info,
			Output:     os.Stderr,
			JSONFormat: true,
		}),
	})
}
