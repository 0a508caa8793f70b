package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/authz-dev/authz/internal/coded"
)

// File is the facts-file shape of docs/contract.md, "The facts (host state)". The live plugin host renders its state in the
// same shape (GET /v1/facts), so any decision can be replayed with `authz decide --facts`.
type File struct {
	Plugins          []map[string]any          `json:"plugins"`
	Workers          map[string]map[string]any `json:"workers"`
	BuiltinProviders map[string]map[string]any `json:"builtinProviders"`
}

// FileFacts is a Facts view over a parsed facts file. It never changes after parsing.
type FileFacts struct {
	plugins  map[string]*PluginIndex // each plugin record indexed once, when the file is parsed
	workers  map[string]*Worker
	builtins map[string]map[string]any
	// file is the document the three views above were read from, for File.
	file File
}

var _ Facts = (*FileFacts)(nil)

// LoadFacts reads and parses a facts file.
func LoadFacts(path string) (*FileFacts, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, coded.Errorf(coded.BadFacts, "read facts file: %w", err)
	}
	return ParseFacts(bytes.NewReader(b))
}

// ParseFacts parses a facts document and checks its shape (docs/contract.md, "Precise rules", "Facts file"): an
// object; plugins an array of objects with distinct non-empty string ids; workers and
// builtinProviders objects whose values are objects. Absent sections are empty; null ones are not.
func ParseFacts(r io.Reader) (*FileFacts, error) {
	doc, err := decodeOne(r)
	if err != nil {
		return nil, badFacts("facts are not valid JSON: %v", err)
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, badFacts("facts must be a JSON object with plugins, workers and builtinProviders, got %s", typeName(doc))
	}
	if where, n, bad := unrepresentableNumber(top); bad {
		// Every decision on these facts would fail to convert for the policy engine: refuse
		// the file at load instead of denying each decision with an evaluation failure.
		return nil, badFacts("facts%s: the number %s is out of the range the policy engine accepts", where, n)
	}
	f := &FileFacts{
		plugins:  map[string]*PluginIndex{},
		workers:  map[string]*Worker{},
		builtins: map[string]map[string]any{},
		file:     File{Plugins: []map[string]any{}},
	}
	if raw, present := top["plugins"]; present {
		list, ok := raw.([]any)
		if !ok {
			return nil, badFacts("facts.plugins must be an array of plugin objects, got %s", typeName(raw))
		}
		for i, item := range list {
			p, ok := item.(map[string]any)
			if !ok {
				return nil, badFacts("facts.plugins[%d] must be an object, got %s", i, typeName(item))
			}
			id, ok := p["id"].(string)
			if !ok || id == "" {
				return nil, badFacts("facts.plugins[%d].id must be a non-empty string", i)
			}
			if _, dup := f.plugins[id]; dup {
				return nil, badFacts("facts.plugins[%d].id %q is a duplicate: plugin ids must be unique", i, id)
			}
			f.plugins[id] = NewPluginIndex(p)
			f.file.Plugins = append(f.file.Plugins, p)
		}
	}
	workers, err := objectOfObjects(top, "workers")
	if err != nil {
		return nil, err
	}
	f.file.Workers = workers
	for id, w := range workers {
		cv, hasCV := w["configValid"]
		if !hasCV {
			cv = nil
		} else if cv == nil {
			cv = json.RawMessage("null") // present but null: not the literal true, so not valid
		}
		fw := NewWorker(0, stringsOnly(w["supportedMethods"]), nil)
		fw.configValid = cv
		f.workers[id] = fw
	}
	if f.builtins, err = objectOfObjects(top, "builtinProviders"); err != nil {
		return nil, err
	}
	f.file.BuiltinProviders = f.builtins
	return f, nil
}

// File is the facts exactly as this FileFacts decides on them, in facts-file shape: the
// sections it read (and only those: a key that differs from "plugins", "workers" or
// "builtinProviders" in case only is not read, and not shown), with every value as parsed.
// Rendered and parsed again, it gives the same decisions. The values are shared with f: do
// not modify them.
func (f *FileFacts) File() File { return f.file }

func objectOfObjects(top map[string]any, field string) (map[string]map[string]any, error) {
	out := map[string]map[string]any{}
	raw, present := top[field]
	if !present {
		return out, nil
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return nil, badFacts("facts.%s must be an object keyed by id, got %s", field, typeName(raw))
	}
	for k, v := range obj {
		vo, ok := v.(map[string]any)
		if !ok {
			return nil, badFacts("facts.%s[%q] must be an object, got %s", field, k, typeName(v))
		}
		out[k] = vo
	}
	return out, nil
}

// Plugin implements Facts. A worker is reported only for a plugin the file lists.
func (f *FileFacts) Plugin(id string) (PluginFacts, bool) {
	p, ok := f.plugins[id]
	if !ok {
		return PluginFacts{}, false
	}
	return PluginFacts{Record: p.Record(), Index: p, Worker: f.workers[id]}, true
}

// Worker returns the file's worker of the plugin id, or false when the file has none.
func (f *FileFacts) Worker(pluginID string) (*Worker, bool) {
	w, ok := f.workers[pluginID]
	return w, ok
}

// BuiltinProvider implements Facts.
func (f *FileFacts) BuiltinProvider(key string) (map[string]any, bool) {
	b, ok := f.builtins[key]
	return b, ok
}

// ConfigValid implements Facts: configValid absent means valid; present and not the literal true
// means not valid.
func (f *FileFacts) ConfigValid(_ context.Context, _ string, w *Worker, _ string, _ any) (bool, error) {
	if w == nil {
		return false, nil
	}
	if w.configValid == nil {
		return true, nil
	}
	v, ok := w.configValid.(bool)
	return ok && v, nil
}

func badFacts(format string, args ...any) error {
	return coded.Errorf(coded.BadFacts, format, args...)
}

// stringsOnly keeps the string elements of a JSON array; anything else gives none.
func stringsOnly(v any) []string {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(list))
	for _, e := range list {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// unrepresentableNumber finds a number in v that the policy engine cannot represent, and says
// where it is (".plugins[0].manifest" style).
func unrepresentableNumber(v any) (where string, n json.Number, found bool) {
	switch t := v.(type) {
	case json.Number:
		if _, err := ast.NumberChecked(string(t)); err != nil {
			return "", t, true
		}
	case map[string]any:
		for k, e := range t {
			if w, n, bad := unrepresentableNumber(e); bad {
				return "." + k + w, n, true
			}
		}
	case []any:
		for i, e := range t {
			if w, n, bad := unrepresentableNumber(e); bad {
				return "[" + strconv.Itoa(i) + "]" + w, n, true
			}
		}
	}
	return "", "", false
}
