package snapshot

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeJSON decodes a JSON document as the facts file does.
func decodeJSON(tb testing.TB, s string) map[string]any {
	tb.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v map[string]any
	require.NoError(tb, dec.Decode(&v))
	return v
}

// TestPluginIndexFor: the record a decision carries holds exactly the object entries whose
// driverKey is one of its keys, duplicates included, in manifest order; every other field stays;
// a malformed manifest is carried as it is.
func TestPluginIndexFor(t *testing.T) {
	const manifest = `{"id": "p", "key": "k", "status": "ready", "lastError": "x", "manifest": {"version": 2, "environmentDrivers": [
		{"driverKey": "a", "kind": "sandbox_provider", "n": 0},
		"a",
		{"driverKey": "b", "kind": "environment_driver", "n": 2},
		null,
		{"driverKey": 1, "n": 4},
		["a"],
		{"driverKey": "a", "kind": "environment_driver", "n": 6},
		{"driverKey": "c", "n": 7},
		{"driverKey": "b", "n": 8},
		{"driverKey": "", "n": 9},
		{"kind": "sandbox_provider", "n": 10}
	]}}`
	tests := []struct {
		name   string
		record string
		a, b   string
		want   []int // the n of the entries carried; nil: the record as it is
	}{
		{name: "one key, duplicates kept in order", record: manifest, a: "a", want: []int{0, 6}},
		{name: "second key only", record: manifest, b: "b", want: []int{2, 8}},
		{name: "one entry", record: manifest, a: "c", want: []int{7}},
		{name: "same key twice", record: manifest, a: "c", b: "c", want: []int{7}},
		{name: "two keys merged in manifest order", record: manifest, a: "b", b: "a", want: []int{0, 2, 6, 8}},
		{name: "two keys, one absent", record: manifest, a: "zz", b: "c", want: []int{7}},
		{name: "absent key", record: manifest, a: "zz", want: []int{}},
		{name: "no key", record: manifest, want: []int{}},
		{name: "key is case-sensitive", record: manifest, a: "A", want: []int{}},
		{name: "manifest absent", record: `{"id": "p", "status": "ready"}`, a: "a"},
		{name: "manifest not an object", record: `{"id": "p", "manifest": "m"}`, a: "a"},
		{name: "environmentDrivers absent", record: `{"id": "p", "manifest": {}}`, a: "a"},
		{name: "environmentDrivers an object", record: `{"id": "p", "manifest": {"environmentDrivers": {"x": {"driverKey": "a"}}}}`, a: "a"},
		{name: "environmentDrivers null", record: `{"id": "p", "manifest": {"environmentDrivers": null}}`, a: "a"},
		{name: "no entries", record: `{"id": "p", "manifest": {"environmentDrivers": []}}`, a: "a", want: []int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			record := decodeJSON(t, tt.record)
			got := NewPluginIndex(record).For(tt.a, tt.b)
			if tt.want == nil {
				assert.Equal(t, decodeJSON(t, tt.record), got, "a malformed manifest is carried as it is")
				return
			}
			drivers, ok := got["manifest"].(map[string]any)["environmentDrivers"].([]any)
			require.True(t, ok, "environmentDrivers stays an array")
			ns := []int{}
			for _, e := range drivers {
				n, err := e.(map[string]any)["n"].(json.Number).Int64()
				require.NoError(t, err)
				ns = append(ns, int(n))
			}
			assert.Equal(t, tt.want, ns)
			// Everything else of the record and of the manifest stays as it was.
			want := decodeJSON(t, tt.record)
			delete(want["manifest"].(map[string]any), "environmentDrivers")
			delete(got["manifest"].(map[string]any), "environmentDrivers")
			assert.Equal(t, want, got)
			assert.Equal(t, decodeJSON(t, tt.record), record, "the record is not modified")
		})
	}
}

// TestPluginIndexDoesNotModifyRecord: indexing and looking up leave the record untouched.
func TestPluginIndexDoesNotModifyRecord(t *testing.T) {
	record := decodeJSON(t, `{"id": "p", "manifest": {"environmentDrivers": [{"driverKey": "a"}, {"driverKey": "b"}, 3]}}`)
	x := NewPluginIndex(record)
	_ = x.For("a", "b")
	_ = x.For("a", "")
	assert.Equal(t, decodeJSON(t, `{"id": "p", "manifest": {"environmentDrivers": [{"driverKey": "a"}, {"driverKey": "b"}, 3]}}`), record)
	assert.Equal(t, record, x.Record())
}

// bigRecord is a plugin record with n entries of distinct keys k0…k(n-1).
func bigRecord(n int) map[string]any {
	entries := make([]any, n)
	for i := range entries {
		entries[i] = map[string]any{"driverKey": fmt.Sprintf("k%d", i), "kind": "sandbox_provider",
			"sandboxCapabilities": map[string]any{"environmentExecute": true}}
	}
	return map[string]any{"id": "big", "key": "big", "status": "ready", "manifest": map[string]any{"environmentDrivers": entries}}
}

// TestPluginIndexLookupAllocatesNothing: with one key (every decision of the built-in policy),
// the lookup is a map read of a record rendered once, whatever the manifest's size.
func TestPluginIndexLookupAllocatesNothing(t *testing.T) {
	x := NewPluginIndex(bigRecord(256))
	for _, keys := range [][2]string{{"k200", ""}, {"", "k3"}, {"k7", "k7"}, {"missing", ""}, {"", ""}} {
		allocs := testing.AllocsPerRun(100, func() { _ = x.For(keys[0], keys[1]) })
		assert.Zero(t, allocs, "keys %q", keys)
	}
}

// TestBuildCarriesOnlyTheLookedUpEntries: Build puts in facts.plugin only the entries of the
// provider key and the lease's driverKey, from the Facts' index when it gives one and from the
// record otherwise.
func TestBuildCarriesOnlyTheLookedUpEntries(t *testing.T) {
	record := bigRecord(256)
	req := mustRequest(t, `{"environment": {"driver": "sandbox"}, "lease": {"metadata": {"driver": "sandbox",
		"sandboxProviderPlugin": true, "pluginId": "big", "provider": "k250", "driverKey": "k3"}}}`)
	tests := []struct {
		name  string
		facts Facts
	}{
		{name: "index given", facts: &listFacts{id: "big", record: record, index: NewPluginIndex(record)}},
		{name: "record only", facts: &listFacts{id: "big", record: record}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Build(t.Context(), req, tt.facts, Options{})
			p := in["facts"].(map[string]any)["plugin"].(map[string]any)
			drivers := p["manifest"].(map[string]any)["environmentDrivers"].([]any)
			require.Len(t, drivers, 2)
			assert.Equal(t, "k3", drivers[0].(map[string]any)["driverKey"])
			assert.Equal(t, "k250", drivers[1].(map[string]any)["driverKey"])
			assert.Equal(t, "ready", p["status"])
			assert.Len(t, record["manifest"].(map[string]any)["environmentDrivers"], 256, "the record is not modified")
		})
	}
}

// listFacts holds one plugin, with or without an index, and no worker.
type listFacts struct {
	id     string
	record map[string]any
	index  *PluginIndex
}

func (l *listFacts) Plugin(id string) (PluginFacts, bool) {
	if id != l.id {
		return PluginFacts{}, false
	}
	return PluginFacts{Record: l.record, Index: l.index}, true
}

func (l *listFacts) BuiltinProvider(string) (map[string]any, bool) { return nil, false }

func (l *listFacts) ConfigValid(context.Context, string, *Worker, string, any) (bool, error) {
	return true, nil
}
