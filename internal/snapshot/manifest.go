package snapshot

import (
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// PluginIndex is a plugin record with its manifest entries indexed by driverKey. It is built once
// per record (the live host: when it publishes a generation; a facts file: when it is parsed), so
// that a decision carries only the entries it can look up and its cost does not grow with the
// number of entries a plugin reports.
//
// The policy only ever reads the object entries of manifest.environmentDrivers whose driverKey
// equals the looked-up key (all of them: two make the entry invalid). For returns the record with
// environmentDrivers cut down to exactly those entries of the requested keys, duplicates
// included, in manifest order; every other field of the record and of the manifest is kept. An
// entry that is not an object, or whose driverKey is not a string, can match no key and is left
// out. A manifest that is not an object, or whose environmentDrivers is not an array, has no
// matching entry whatever the key: the record is then returned as it is.
//
// A PluginIndex is immutable and safe for concurrent use; the maps it returns are shared and
// must not be modified.
type PluginIndex struct {
	record  map[string]any        // the full record
	whole   *rendered             // record, for a manifest that is not indexed
	indexed bool                  // manifest is an object and environmentDrivers an array
	byKey   map[string]keyEntries // driverKey -> its entries
	none    *rendered             // the record with no entries (a key no entry has)
}

// keyEntries are the entries of one driverKey with their positions in the manifest, and the
// record that carries exactly them, rendered once.
type keyEntries struct {
	pos     []int
	entries []any
	record  *rendered
}

// rendered is a record the index hands out, with its parsed form (the value OPA reads), made
// once on first use and shared by every decision that carries the record.
type rendered struct {
	doc   map[string]any
	once  sync.Once
	value ast.Value // nil: doc could not be converted
}

func newRendered(doc map[string]any) *rendered { return &rendered{doc: doc} }

// parsed is ast.InterfaceToValue(r.doc), converted once; nil when it cannot be converted.
func (r *rendered) parsed() ast.Value {
	r.once.Do(func() {
		if v, err := ast.InterfaceToValue(r.doc); err == nil {
			r.value = v
		}
	})
	return r.value
}

// NewPluginIndex indexes a plugin record (JSON values as encoding/json decodes them into any).
// It reads the record once; the record must not be modified afterwards.
func NewPluginIndex(record map[string]any) *PluginIndex {
	x := &PluginIndex{record: record, whole: newRendered(record)}
	manifest, ok := record["manifest"].(map[string]any)
	if !ok {
		return x
	}
	drivers, ok := manifest["environmentDrivers"].([]any)
	if !ok {
		return x
	}
	x.indexed = true
	x.byKey = map[string]keyEntries{}
	for i, e := range drivers {
		obj, ok := e.(map[string]any)
		if !ok {
			continue
		}
		key, ok := obj["driverKey"].(string)
		if !ok {
			continue
		}
		ke := x.byKey[key]
		ke.pos = append(ke.pos, i)
		ke.entries = append(ke.entries, e)
		x.byKey[key] = ke
	}
	for k, ke := range x.byKey {
		ke.record = newRendered(x.with(ke.entries))
		x.byKey[k] = ke
	}
	x.none = newRendered(x.with([]any{}))
	return x
}

// Record is the full record the index was built from.
func (x *PluginIndex) Record() map[string]any { return x.record }

// For returns the record a decision that may look up the driver keys a and b carries ("" stands
// for no key). With at most one distinct key it returns a record rendered when the index was
// built, without allocating; with two distinct keys that both have entries it merges them in
// manifest order.
func (x *PluginIndex) For(a, b string) map[string]any {
	doc, _ := x.forRendered(a, b)
	return doc
}

// forRendered is For, and also the rendered record when the index holds it (nil for two
// merged keys, whose record is made for the call).
func (x *PluginIndex) forRendered(a, b string) (map[string]any, *rendered) {
	if !x.indexed {
		return x.record, x.whole
	}
	if a == "" || a == b {
		a, b = b, ""
	}
	ea, okA := x.byKey[a]
	eb, okB := x.byKey[b]
	okA = okA && a != ""
	okB = okB && b != ""
	switch {
	case okA && okB:
		merged := make([]any, 0, len(ea.entries)+len(eb.entries))
		i, j := 0, 0
		for i < len(ea.pos) || j < len(eb.pos) {
			if j == len(eb.pos) || (i < len(ea.pos) && ea.pos[i] < eb.pos[j]) {
				merged = append(merged, ea.entries[i])
				i++
			} else {
				merged = append(merged, eb.entries[j])
				j++
			}
		}
		return x.with(merged), nil
	case okA:
		return ea.record.doc, ea.record
	case okB:
		return eb.record.doc, eb.record
	default:
		return x.none.doc, x.none
	}
}

// with is the record with manifest.environmentDrivers replaced by entries (shallow copies of the
// record and the manifest; the entries themselves are shared).
func (x *PluginIndex) with(entries []any) map[string]any {
	manifest := x.record["manifest"].(map[string]any)
	m := make(map[string]any, len(manifest))
	for k, v := range manifest {
		m[k] = v
	}
	m["environmentDrivers"] = entries
	return shallowWith(x.record, "manifest", m)
}
