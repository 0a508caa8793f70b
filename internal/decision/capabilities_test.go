package decision

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/policies"
)

// policyStrings evaluates query, a set or array of strings, against the shipped policy.
func policyStrings(t *testing.T, query string) []string {
	t.Helper()
	mods, err := policies.Modules()
	require.NoError(t, err)
	opts := []func(*rego.Rego){rego.Query(query)}
	for name, src := range mods {
		opts = append(opts, rego.Module(name, src))
	}
	rs, err := rego.New(opts...).Eval(t.Context())
	require.NoError(t, err)
	require.Len(t, rs, 1)
	var out []string
	for _, k := range rs[0].Expressions[0].Value.([]any) {
		out = append(out, k.(string))
	}
	return out
}

// TestCapabilityListsAgree: the Go list (the fields of Capabilities) and the keys of the policy's
// capability table are the same set; a capability added on one side only fails here.
func TestCapabilityListsAgree(t *testing.T) {
	assert.ElementsMatch(t, api.CapabilityKeys, policyStrings(t, "object.keys(data.authz.tables.capabilities)"),
		"api.Capabilities and the capability table of policies/authz/tables/tables.rego must list the same capabilities")
	var c api.Capabilities
	for _, k := range api.CapabilityKeys {
		require.True(t, c.Set(k, true), k) // the field that holds k exists (was: c.field(k) not nil)
		assert.True(t, c.Get(k), k)
	}
	v := reflect.ValueOf(c)
	require.Len(t, api.CapabilityKeys, v.NumField())
	for i := range v.NumField() {
		assert.True(t, v.Field(i).Bool(), "field %s is reached by its name", v.Type().Field(i).Name)
	}
	assert.False(t, c.Set("gpuPassthrough", true), "an unknown key has no field") // was: c.field(...) nil
}

// TestNarrowingFlagsAgree: the flags the host computes (snapshot.NarrowingFlags) and the policy's
// narrowing flags (data.authz.tables.narrowing_flags, the flags a capability's narrowedBy can
// name) are the same set. A flag only in the policy would never narrow; a flag only in the host
// would narrow nothing.
func TestNarrowingFlagsAgree(t *testing.T) {
	assert.ElementsMatch(t, snapshot.NarrowingFlags, policyStrings(t, "[f | some f in data.authz.tables.narrowing_flags]"),
		"the flags of input.narrowing (internal/snapshot) and narrowing_flags of policies/authz/tables/tables.rego must be the same")
	in := snapshot.Build(t.Context(), &snapshot.Request{}, &snapshot.FileFacts{}, snapshot.Options{})
	narrowing, ok := in["narrowing"].(map[string]any)
	require.True(t, ok)
	assert.ElementsMatch(t, snapshot.NarrowingFlags, slices.Collect(maps.Keys(narrowing)), "the input carries every flag")
}

// TestUnknownCapabilityIsABadResult: a capability added to the policy's table without a release
// is not dropped silently: the result is malformed and the decision fails closed.
func TestUnknownCapabilityIsABadResult(t *testing.T) {
	mods, err := policies.Modules()
	require.NoError(t, err)
	const table = "policies/authz/tables/tables.rego"
	src, ok := mods[table]
	require.True(t, ok)
	row := "capabilities := {\n\t\"gpuPassthrough\": {\"methods\": {\"duplexChannelOpen\"}, \"optIn\": false, \"narrowedBy\": set()},\n"
	mods[table] = strings.Replace(src, "capabilities := {\n", row, 1)
	require.NotEqual(t, src, mods[table])
	e := New(Options{})
	require.NoError(t, e.LoadModules(t.Context(), mods, "with-extra"))
	doc, err := e.Evaluate(t.Context(), grantInput())
	assertFailClosed(t, doc, err, coded.EvalBadResult, "openDuplexChannel")
	assert.Contains(t, err.Error(), "gpuPassthrough")
	assert.Contains(t, err.Error(), "needs a release")
}
