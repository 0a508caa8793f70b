package decisiontest_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
)

// TestEmbeddedEngine: the engine has the embedded policy current, under its revision, and was
// made with the options given.
func TestEmbeddedEngine(t *testing.T) {
	p, err := decision.EmbeddedPolicy()
	require.NoError(t, err)
	e := decisiontest.EmbeddedEngine(t, decision.Options{})
	assert.Equal(t, p.Revision(), e.Revision())
	assert.Empty(t, e.CacheStatus(), "the embedded policy keeps the decision cache on")

	off := decisiontest.EmbeddedEngine(t, decision.Options{Cache: decision.CacheOptions{Disabled: true}})
	assert.Equal(t, p.Revision(), off.Revision())
	assert.Contains(t, off.CacheStatus(), "turned off")
}

// TestCapabilityMap: every capability is a key, with its field's value.
func TestCapabilityMap(t *testing.T) {
	for _, key := range api.CapabilityKeys {
		var c api.Capabilities
		require.NoError(t, json.Unmarshal([]byte(`{"`+key+`": true}`), &c))
		m := decisiontest.CapabilityMap(c)
		require.Len(t, m, len(api.CapabilityKeys))
		for k, v := range m {
			assert.Equal(t, k == key, v, "%s with only %s set", k, key)
		}
	}
}
