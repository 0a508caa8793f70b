package server

import (
	"time"

	"github.com/authz-dev/authz/internal/snapshot"
)

// FactsSource is what the service reads the host state from: the facts of every decision (read
// fresh each time), the facts in facts-file shape (GET /v1/facts), the plugin list
// (GET /v1/plugins, metrics) and readiness. The live plugin host is adapted to it in
// cmd/authz; StaticFacts serves a facts file.
type FactsSource interface {
	snapshot.Facts
	// FactsFile renders the current facts in the shape of a facts file (docs/contract.md section 4).
	FactsFile() snapshot.File
	// Plugins lists the configured plugins and their workers as they are now.
	Plugins() []PluginInfo
	// Ready reports whether every enabled plugin has started once.
	Ready() bool
}

// PluginInfo is one plugin as GET /v1/plugins shows it.
type PluginInfo struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Status string `json:"status"`
	// LastError is the reason code of the plugin's last failure (PIN_MISMATCH, START_TIMEOUT,
	// WORKER_EXITED, ...; "" when none). The details are in the service log only: they name
	// paths and digests that callers have no business seeing.
	LastError string `json:"lastError"`
	Restarts  uint64 `json:"restarts"`
	// Worker is the running worker, nil (JSON null) while none runs.
	Worker *WorkerInfo `json:"worker"`
}

// WorkerInfo is a plugin's running worker.
type WorkerInfo struct {
	PID              int       `json:"pid"`
	Generation       uint64    `json:"generation"`
	StartedAt        time.Time `json:"startedAt"`
	SupportedMethods []string  `json:"supportedMethods"`
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
func (s *StaticFacts) Plugins() []PluginInfo {
	out := make([]PluginInfo, 0, len(s.file.Plugins))
	for _, p := range s.file.Plugins {
		id, _ := p["id"].(string)
		key, _ := p["key"].(string)
		status, _ := p["status"].(string)
		info := PluginInfo{ID: id, Key: key, Status: status}
		if w, ok := s.Worker(id); ok {
			methods := w.SupportedMethods
			if methods == nil {
				methods = []string{}
			}
			info.Worker = &WorkerInfo{Generation: w.Generation, StartedAt: s.loadedAt, SupportedMethods: methods}
		}
		out = append(out, info)
	}
	return out
}

// normalizeFile replaces absent sections by empty ones: a rendered facts file never carries a
// null section, which docs/contract.md section 11 calls malformed.
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
