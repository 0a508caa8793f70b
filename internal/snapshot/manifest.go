package snapshot

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
	indexed bool                  // manifest is an object and environmentDrivers an array
	byKey   map[string]keyEntries // driverKey -> its entries
	none    map[string]any        // the record with no entries (a key no entry has)
}

// keyEntries are the entries of one driverKey with their positions in the manifest, and the
// record that carries exactly them, rendered once.
type keyEntries struct {
	pos     []int
	entries []any
	record  map[string]any
}

// NewPluginIndex indexes a plugin record (JSON values as encoding/json decodes them into any).
// It reads the record once; the record must not be modified afterwards.
func NewPluginIndex(record map[string]any) *PluginIndex {
	x := &PluginIndex{record: record}
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
		ke.record = x.with(ke.entries)
		x.byKey[k] = ke
	}
	x.none = x.with([]any{})
	return x
}

// Record is the full record the index was built from.
func (x *PluginIndex) Record() map[string]any { return x.record }

// For returns the record a decision that may look up the driver keys a and b carries ("" stands
// for no key). With at most one distinct key it returns a record rendered when the index was
// built, without allocating; with two distinct keys that both have entries it merges them in
// manifest order.
func (x *PluginIndex) For(a, b string) map[string]any {
	if !x.indexed {
		return x.record
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
		return x.with(merged)
	case okA:
		return ea.record
	case okB:
		return eb.record
	default:
		return x.none
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
