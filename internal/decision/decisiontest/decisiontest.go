// Package decisiontest holds the helpers that tests of other packages use with the decision
// engine. Only test files import it, so nothing here reaches the shipped binary.
package decisiontest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/decision"
)

// EmbeddedEngine returns decision.New(opts) with decision.EmbeddedPolicy active, and fails the
// test when the embedded policy does not compile or activate.
func EmbeddedEngine(tb testing.TB, opts decision.Options) *decision.Engine {
	tb.Helper()
	p, err := decision.EmbeddedPolicy()
	require.NoError(tb, err)
	e := decision.New(opts)
	require.NoError(tb, e.Activate(tb.Context(), p))
	return e
}

// CapabilityMap returns c keyed by capability name, every capability present: the shape of the
// capabilities of an oracle's decision.
func CapabilityMap(c api.Capabilities) map[string]bool {
	m := make(map[string]bool, len(api.CapabilityKeys))
	for _, k := range api.CapabilityKeys {
		m[k] = c.Get(k)
	}
	return m
}
