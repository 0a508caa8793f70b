package opaplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/authz-dev/authz/internal/policy"
)

// activatorID names the gate's bundle activator among OPA's.
const activatorID = "authz"

// RegisterActivator makes every bundle OPA activates in this process (--bundle, the bundles
// section, --watch) pass through the gate's activator first: it keeps a copy of each bundle's
// modules and data, then activates the bundle into OPA's store as OPA's own activator does. The
// gate compiles its policy from these copies only, so what OPA's APIs write into OPA's store
// never reaches it. Call it once, before OPA's runtime starts (`authz run` does).
func RegisterActivator() {
	registerOnce.Do(func() {
		bundle.RegisterActivator(activatorID, bundles)
		bundle.RegisterDefaultBundleActivator(activatorID)
		// With an activator registered, OPA's rego package takes the store of a query that
		// names none from the registered store function: the in-memory store, as without.
		if bundle.BundleExtStore == nil {
			bundle.RegisterStoreFunc(func() storage.Store { return inmem.New() })
		}
		registered.Store(true)
	})
}

var (
	registerOnce sync.Once
	registered   atomic.Bool
)

func activatorRegistered() bool { return registered.Load() }

// bundles is the activator: the bundles activated in each store.
var bundles = &activator{stores: map[storage.Store]*storeBundles{}}

// activator records the bundles activated into each store.
type activator struct {
	mu     sync.Mutex
	stores map[storage.Store]*storeBundles
}

// storeBundles are the bundles of one store: those of transactions not yet committed, and
// those committed (the active ones), by name.
type storeBundles struct {
	mu        sync.Mutex
	trigger   bool
	pending   map[uint64]map[string]*bundleCopy
	active    map[string]*bundleCopy
	gen       uint64 // counts commits that changed active
	listeners map[any]func()
}

// bundleCopy is what the gate keeps of an activated bundle: copies, never shared with OPA's
// store or compiler.
type bundleCopy struct {
	name     string
	revision string // the manifest revision, "" when it has none
	roots    []string
	modules  map[string]*ast.Module // by the module's path in the bundle
	sources  map[string]string      // the modules' sources, for a content revision
	data     map[string]any
	delta    bool   // a delta bundle: patches, not content
	signed   bool   // OPA verified its signature (only a verified bundle keeps one): ordered
	iat      int64  // its signature's issue time (iat claim), 0 when it has none
	err      string // why the copy could not be made ("" when it could)
	// activatedAt is when the activation committed.
	activatedAt time.Time
}

var _ bundle.Activator = (*activator)(nil)

// Activate copies the bundles, activates them into OPA's store with OPA's own activator, and
// holds the copies until the transaction commits.
func (a *activator) Activate(opts *bundle.ActivateOpts) error {
	// A bundle the rule of the store refuses (policy.BundleRule) is not activated at all.
	if err := policy.AdmitActivation(opts); err != nil {
		return err
	}
	copies := make(map[string]*bundleCopy, len(opts.Bundles))
	for name, b := range opts.Bundles {
		copies[name] = copyBundle(name, b) // before OPA's activation, which may change b
	}
	if err := (&bundle.DefaultActivator{}).Activate(opts); err != nil {
		return err
	}
	sb := a.forStore(opts.Store)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if !sb.trigger {
		// Registered inside the activation's write transaction: it sees this commit too.
		if _, err := opts.Store.Register(opts.Ctx, opts.Txn, storage.TriggerConfig{OnCommit: sb.onCommit}); err != nil {
			return fmt.Errorf("authz: watch the store's commits: %w", err)
		}
		sb.trigger = true
	}
	if prev, ok := sb.pending[opts.Txn.ID()]; ok {
		maps.Copy(prev, copies)
	} else {
		sb.pending[opts.Txn.ID()] = copies
	}
	return nil
}

func (a *activator) forStore(s storage.Store) *storeBundles {
	a.mu.Lock()
	defer a.mu.Unlock()
	sb, ok := a.stores[s]
	if !ok {
		sb = &storeBundles{pending: map[uint64]map[string]*bundleCopy{}, active: map[string]*bundleCopy{}, listeners: map[any]func(){}}
		a.stores[s] = sb
	}
	return sb
}

// drop forgets the bundles of a store that is no longer used.
func (a *activator) drop(s storage.Store) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.stores, s)
}

// onCommit makes the copies of a committed transaction active. Write transactions commit one
// at a time, in order: copies of an earlier transaction still pending were aborted. Every
// listener hears of every commit (a bundle may also have been deactivated).
func (sb *storeBundles) onCommit(_ context.Context, txn storage.Transaction, _ storage.TriggerEvent) {
	sb.mu.Lock()
	id := txn.ID()
	if copies, ok := sb.pending[id]; ok {
		now := time.Now().UTC()
		for name, c := range copies {
			c.activatedAt = now
			sb.active[name] = c
		}
		sb.gen++
	}
	for pid := range sb.pending {
		if pid <= id {
			delete(sb.pending, pid)
		}
	}
	ls := make([]func(), 0, len(sb.listeners))
	for _, l := range sb.listeners {
		ls = append(ls, l)
	}
	sb.mu.Unlock()
	for _, l := range ls {
		l()
	}
}

// snapshot returns the active copies and the generation they are of.
func (sb *storeBundles) snapshot() (map[string]*bundleCopy, uint64) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return maps.Clone(sb.active), sb.gen
}

func (sb *storeBundles) listen(key any, f func()) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.listeners[key] = f
}

func (sb *storeBundles) unlisten(key any) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	delete(sb.listeners, key)
}

// copyBundle copies the modules and data of b. A bundle read lazily (as OPA reads downloaded
// bundles) holds its data as raw data.json and data.yaml files; they are decoded here.
func copyBundle(name string, b *bundle.Bundle) *bundleCopy {
	c := &bundleCopy{name: name, revision: b.Manifest.Revision, modules: map[string]*ast.Module{}, sources: map[string]string{},
		delta: b.Type() == bundle.DeltaBundleType}
	if len(b.Signatures.Signatures) > 0 {
		iat, err := policy.SignatureIAT(b.Signatures)
		if err != nil {
			c.err = err.Error()
			return c
		}
		c.signed, c.iat = true, iat
	}
	if b.Manifest.Roots != nil {
		c.roots = append([]string(nil), *b.Manifest.Roots...)
	}
	for _, mf := range b.Modules {
		if mf.Parsed == nil {
			c.err = fmt.Sprintf("module %s was not parsed", mf.Path)
			return c
		}
		c.modules[mf.Path] = mf.Parsed.Copy()
		c.sources[mf.Path] = string(mf.Raw)
	}
	data, err := bundleData(b)
	if err != nil {
		c.err = err.Error()
		return c
	}
	c.data = data
	return c
}

// bundleData is a deep copy of the data of b.
func bundleData(b *bundle.Bundle) (map[string]any, error) {
	out := map[string]any{}
	if len(b.Data) > 0 {
		raw, err := json.Marshal(b.Data)
		if err != nil {
			return nil, fmt.Errorf("copy the data: %w", err)
		}
		if err := util.UnmarshalJSON(raw, &out); err != nil {
			return nil, fmt.Errorf("copy the data: %w", err)
		}
	}
	for _, f := range b.Raw {
		p := strings.Trim(path.Clean("/"+strings.ReplaceAll(f.Path, "\\", "/")), "/")
		base := path.Base(p)
		if base != "data.json" && !bundle.IsYAMLDataFile(p) {
			continue
		}
		var v any
		if err := util.Unmarshal(f.Value, &v); err != nil {
			return nil, fmt.Errorf("decode %s: %w", f.Path, err)
		}
		var keys []string
		if dir := path.Dir(p); dir != "." && dir != "" {
			keys = strings.Split(dir, "/")
		}
		if err := mergeAt(out, keys, v); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
	}
	return out, nil
}

// mergeAt merges v into doc at keys (objects merge, anything else conflicts).
func mergeAt(doc map[string]any, keys []string, v any) error {
	if len(keys) == 0 {
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("the data at the bundle's root must be an object")
		}
		for k, x := range obj {
			if err := mergeAt(doc, []string{k}, x); err != nil {
				return err
			}
		}
		return nil
	}
	cur, ok := doc[keys[0]]
	if !ok {
		if len(keys) == 1 {
			doc[keys[0]] = v
			return nil
		}
		next := map[string]any{}
		doc[keys[0]] = next
		return mergeAt(next, keys[1:], v)
	}
	obj, ok := cur.(map[string]any)
	if !ok {
		return fmt.Errorf("data conflict at %s", keys[0])
	}
	if len(keys) == 1 {
		in, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("data conflict at %s", keys[0])
		}
		return mergeAt(obj, nil, in)
	}
	return mergeAt(obj, keys[1:], v)
}
