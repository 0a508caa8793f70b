package snapshot

import (
	"context"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Facts is the host state one decision reads (docs/contract.md, "The facts (host state)"). Implementations answer from their
// state at the moment of the call, are safe for concurrent use, and never cache a capability: a
// worker that restarted without a method must lose it at the next call.
type Facts interface {
	// Plugin returns one immutable snapshot of the plugin whose id equals id exactly: its record
	// and, when one runs, its worker, both of one generation. A decision reads a plugin through
	// this one call, so it never mixes the manifest of one worker with the methods of another.
	Plugin(id string) (PluginFacts, bool)
	// BuiltinProvider returns builtinProviders[key].
	BuiltinProvider(key string) (map[string]any, bool)
	// ConfigValid reports whether worker w of the plugin accepts config for the driver key.
	// The caller treats an error (including a time-out of ctx) as "not valid".
	ConfigValid(ctx context.Context, pluginID string, w *Worker, driverKey string, config any) (bool, error)
}

// PluginFacts is one immutable snapshot of a plugin. Its maps and slices are shared between
// decisions: readers must not modify them.
type PluginFacts struct {
	// Record is the plugin record with the JSON fields id, key, status and manifest (values as
	// encoding/json decodes them into any).
	Record map[string]any
	// Index is Record indexed by the driverKey of its manifest entries (NewPluginIndex(Record)),
	// built once per record so that a decision's cost does not grow with the manifest. A
	// decision carries Index.For(its keys), not Record. Nil: Build indexes Record itself, which
	// costs a scan of the manifest per decision.
	Index *PluginIndex
	// Worker is the plugin's running worker of the same generation as Record; nil when none runs.
	Worker *Worker
}

// Worker is what a running driver process reported when it started. It never changes; create
// it with NewWorker.
type Worker struct {
	// Generation counts the starts of the plugin's worker; it grows with every restart.
	Generation uint64
	// SupportedMethods are the method names the worker implements. Read-only.
	SupportedMethods []string

	alive       func() bool
	doc         map[string]any // facts.worker, rendered once
	value       ast.Value      // doc as OPA reads it, converted once (nil: convert doc)
	configValid any            // the facts file's answer to ConfigValid (nil: absent, so valid)
}

// NewWorker returns the facts of one worker. alive reports whether the worker's process still
// runs; it must be cheap and must not block (a decision calls it once, after reading the
// worker). A nil alive means the worker is always running (a facts file).
func NewWorker(generation uint64, methods []string, alive func() bool) *Worker {
	w := &Worker{Generation: generation, SupportedMethods: methods, alive: alive}
	docMethods := make([]any, len(methods))
	for i, m := range methods {
		docMethods[i] = m
	}
	w.doc = map[string]any{"generation": generation, "supportedMethods": docMethods}
	w.value, _ = ast.InterfaceToValue(w.doc) // strings and a uint64: it cannot fail
	return w
}

// Alive reports whether the worker's process still runs at the moment of the call.
func (w *Worker) Alive() bool {
	return w != nil && (w.alive == nil || w.alive())
}

// Document is the worker as the input document's facts.worker carries it. It is shared:
// readers must not modify it.
func (w *Worker) Document() map[string]any { return w.doc }

// CopyDocument is a deep copy of a JSON-shaped value (maps, slices, scalars) that shares no map
// or slice with it, for a reader that may modify what it is given. Values of other types are
// kept as they are (the documents hold none that a reader could modify in place).
func CopyDocument(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = CopyDocument(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = CopyDocument(e)
		}
		return out
	default:
		return v
	}
}
