package snapshot

import (
	"context"
)

// Facts is the host state one decision reads (SPEC section 4). Implementations answer from their
// state at the moment of the call, are safe for concurrent use, and never cache a capability: a
// worker that restarted without a method must lose it at the next call.
type Facts interface {
	// Plugin returns the record of the plugin whose id equals id exactly, with the JSON fields
	// id, key, status and manifest (values as encoding/json decodes them into any).
	Plugin(id string) (map[string]any, bool)
	// Worker returns the pinned plugin's running worker, or false when none runs.
	Worker(pluginID string) (Worker, bool)
	// BuiltinProvider returns builtinProviders[key].
	BuiltinProvider(key string) (map[string]any, bool)
	// ConfigValid reports whether worker w of the plugin accepts config for the driver key.
	// The caller treats an error (including a time-out of ctx) as "not valid".
	ConfigValid(ctx context.Context, pluginID string, w Worker, driverKey string, config any) (bool, error)
}

// Worker is what a running driver process reported when it started.
type Worker struct {
	// Generation counts the starts of the plugin's worker; it grows with every restart.
	Generation uint64
	// SupportedMethods are the method names the worker implements.
	SupportedMethods []string
	// configValid is the facts file's answer to ConfigValid (nil: absent, so valid).
	configValid any
}
