package server

import (
	"time"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/snapshot"
)

// FactsSource is what the service reads the host state from: the facts of every decision (read
// fresh each time), the facts in facts-file shape (GET /v1/facts), the plugin list
// (GET /v1/plugins, metrics) and readiness. The live plugin host (internal/pluginhost) is one;
// StaticFacts serves a facts file.
type FactsSource interface {
	snapshot.Facts
	// FactsFile renders the current facts in the shape of a facts file.
	FactsFile() snapshot.File
	// Plugins lists the configured plugins and their workers as they are now. GET /v1/plugins
	// shows them in their JSON shape, which carries the reason code of a plugin's last error
	// but not the error itself.
	Plugins() []api.PluginState
	// Ready reports whether every enabled plugin has started once.
	Ready() bool
}

// StaticFacts is a FactsSource over a facts file: it never changes and is always ready. Its
// workers have no process: pid 0, generation 0, startedAt the time the file was loaded.
type StaticFacts struct {
	*snapshot.FileFacts
	file     snapshot.File
	loadedAt time.Time
}

var _ FactsSource = (*StaticFacts)(nil)

// LoadStaticFacts reads a facts file and checks it as `authz decide` does. The file is parsed
// once: GET /v1/facts and /v1/plugins show exactly the values the decisions read, so a replay
// of GET /v1/facts with `authz decide` reproduces every decision.
func LoadStaticFacts(path string) (*StaticFacts, error) {
	ff, err := snapshot.LoadFacts(path)
	if err != nil {
		return nil, err
	}
	return &StaticFacts{FileFacts: ff, file: normalizeFile(ff.File()), loadedAt: time.Now().UTC()}, nil
}

// FactsFile implements FactsSource.
func (s *StaticFacts) FactsFile() snapshot.File { return s.file }

// Ready implements FactsSource: a facts file is ready once loaded.
func (s *StaticFacts) Ready() bool { return true }

// Plugins implements FactsSource from the file's plugins and workers.
func (s *StaticFacts) Plugins() []api.PluginState {
	out := make([]api.PluginState, 0, len(s.file.Plugins))
	for _, p := range s.file.Plugins {
		id, _ := p["id"].(string)
		key, _ := p["key"].(string)
		status, _ := p["status"].(string)
		info := api.PluginState{ID: id, Key: key, Status: status}
		if w, ok := s.Worker(id); ok {
			methods := w.SupportedMethods
			if methods == nil {
				methods = []string{}
			}
			info.Worker = &api.WorkerState{Generation: w.Generation, StartedAt: s.loadedAt, SupportedMethods: methods}
		}
		out = append(out, info)
	}
	return out
}

// normalizeFile replaces absent sections by empty ones: a rendered facts file never carries a
// null section, which docs/contract.md, "Precise rules" calls malformed.
func normalizeFile(f snapshot.File) snapshot.File {
	if f.Plugins == nil {
		f.Plugins = []map[string]any{}
	}
	if f.Workers == nil {
		f.Workers = map[string]map[string]any{}
	}
	if f.BuiltinProviders == nil {
		f.BuiltinProviders = map[string]map[string]any{}
	}
	return f
}
