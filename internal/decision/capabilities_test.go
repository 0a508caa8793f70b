package decision

import (
	"context"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/policies"
)

// TestCapabilityListsAgree: the Go list (the fields of Capabilities) and the keys of the policy's
// capability table are the same set; a capability added on one side only fails here.
func TestCapabilityListsAgree(t *testing.T) {
	mods, err := policies.Modules()
	require.NoError(t, err)
	opts := []func(*rego.Rego){rego.Query("object.keys(data.authz.tables.capabilities)")}
	for name, src := range mods {
		opts = append(opts, rego.Module(name, src))
	}
	rs, err := rego.New(opts...).Eval(context.Background())
	require.NoError(t, err)
	require.Len(t, rs, 1)
	var rego []string
	for _, k := range rs[0].Expressions[0].Value.([]any) {
		rego = append(rego, k.(string))
	}
	assert.ElementsMatch(t, CapabilityKeys[:], rego)
	var c Capabilities
	for _, k := range CapabilityKeys {
		require.NotNil(t, c.field(k), k)
		*c.field(k) = true
		assert.True(t, c.Get(k), k)
	}
	assert.Equal(t, Capabilities{true, true, true, true, true, true, true, true, true}, c, "every field is reached by its name")
	assert.Nil(t, c.field("gpuPassthrough"))
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
	e := NewEmpty(Options{})
	require.NoError(t, e.LoadModules(t.Context(), mods, "with-extra"))
	doc, err := e.Evaluate(t.Context(), grantInput())
	assertFailClosed(t, doc, err, coded.EvalBadResult, "openDuplexChannel")
	assert.Contains(t, err.Error(), "gpuPassthrough")
	assert.Contains(t, err.Error(), "needs a release")
}
