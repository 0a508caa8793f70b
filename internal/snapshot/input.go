package snapshot

import (
	"context"
	"time"
)

// Input is the document the policy decides on; docs/input-document.md describes every field.
type Input map[string]any

// Options tune Build. The zero value is usable.
type Options struct {
	// Now is the clock passed to the policy as now_ns; time.Now when nil.
	Now func() time.Time
	// ConfigTimeout bounds the driver's config check; no extra bound when zero (ctx still applies).
	ConfigTimeout time.Duration
}

// Build assembles the input document of one decision from a checked request and the facts as they
// are now. It never fails: what cannot be looked up is left out, and the policy denies on it.
func Build(ctx context.Context, req *Request, facts Facts, opts Options) Input {
	md := req.Metadata
	driver := nonEmpty(md["driver"])
	if driver == "" {
		driver = nonEmpty(req.Environment["driver"])
	}
	if driver == "" {
		driver = "sandbox"
	}
	providerKey := nonEmpty(md["provider"])
	if providerKey == "" && req.Environment["driver"] == "sandbox" {
		if cfg, ok := req.Environment["config"].(map[string]any); ok {
			providerKey = nonEmpty(cfg["provider"])
		}
	}
	pluginBacked := md["sandboxProviderPlugin"] == true
	pluginID := nonEmpty(md["pluginId"])
	driverKey := nonEmpty(md["driverKey"])

	factsDoc := map[string]any{}
	// The plugin record and its worker come from one snapshot of one generation.
	var plugin map[string]any
	var worker *Worker
	if pluginID != "" {
		if p, ok := facts.Plugin(pluginID); ok && p.Record != nil {
			plugin = p.Record
			// The policy reads only the manifest entries whose driverKey is the key it looks
			// up (the provider key, or the lease's driverKey on the plugin driver): the input
			// carries those, all of them and in manifest order, and none of the others.
			idx := p.Index
			if idx == nil {
				idx = NewPluginIndex(p.Record)
			}
			factsDoc["plugin"] = idx.For(providerKey, driverKey)
			if p.Worker != nil {
				worker = p.Worker
				factsDoc["worker"] = worker.Document()
			}
		}
	}
	if providerKey != "" {
		if b, ok := facts.BuiltinProvider(providerKey); ok {
			factsDoc["builtinProvider"] = b
		}
	}

	// The config check is the one fact that may cost a call into a driver: ask only where the
	// contract consults it (docs/contract.md section 6: the plugin-backed sandbox path with a
	// ready plugin and a worker).
	configFailed := false
	if driver == "sandbox" && pluginBacked && providerKey != "" && worker != nil && plugin["status"] == "ready" {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if opts.ConfigTimeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, opts.ConfigTimeout)
		}
		ok, err := facts.ConfigValid(cctx, pluginID, worker, providerKey, req.Environment["config"])
		cancel()
		configFailed = err != nil || !ok
	}
	// Last, after its methods were read and its config checked: is the worker still running?
	// A decision on a generation that has ended carries no worker, so the policy denies
	// (worker_not_running) however recently the process died.
	if worker != nil && !worker.Alive() {
		delete(factsDoc, "worker")
		configFailed = false
	}

	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	lease := req.Lease
	if _, ok := lease["metadata"]; !ok {
		lease = shallowWith(lease, "metadata", md)
	}
	in := Input{
		"operation":   req.Operation,
		"environment": req.Environment,
		"lease":       lease,
		"now_ns":      now().UnixNano(),
		"resolved": map[string]any{
			"driver":       driver,
			"providerKey":  providerKey,
			"pluginBacked": pluginBacked,
			"pluginId":     pluginID,
			"driverKey":    driverKey,
		},
		"facts": factsDoc,
		"narrowing": map[string]any{
			"leasePolicyNotReusable": req.Lease["leasePolicy"] != "reuse_by_environment",
			"nativeSyncUnavailable":  md["backend"] == "job" || md["nativeFileSyncUnsupported"] == true,
			"configResolutionFailed": configFailed,
		},
	}
	if req.HasCommand {
		in["command"] = req.Command
	}
	return in
}

// nonEmpty returns v when it is a string of length at least one, else "".
func nonEmpty(v any) string {
	s, _ := v.(string)
	return s
}

func shallowWith(m map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for mk, mv := range m {
		out[mk] = mv
	}
	out[k] = v
	return out
}
