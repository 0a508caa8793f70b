package api_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deps is what pkg links (go list -deps).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", pkg).Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// TestServerLinksNoBundlePluginNorPluginHost: the HTTP server renders the policy's status and
// hands decisions to OPA's decision log in the API's types: it links neither OPA's bundle
// plugin nor the plugin host.
func TestServerLinksNoBundlePluginNorPluginHost(t *testing.T) {
	t.Parallel()
	got := deps(t, "github.com/authz-dev/authz/internal/server")
	require.Contains(t, got, "github.com/authz-dev/authz/internal/api", "the walk sees the server's imports")
	assert.NotContains(t, got, "github.com/open-policy-agent/opa/v1/plugins/bundle")
	assert.NotContains(t, got, "github.com/authz-dev/authz/internal/pluginhost")
}

// TestPluginHostLinksNoRegoEvaluator: the plugin host checks manifests against the capability
// list (api.CapabilityKeys) without linking the decision engine or OPA's Rego evaluator.
func TestPluginHostLinksNoRegoEvaluator(t *testing.T) {
	t.Parallel()
	got := deps(t, "github.com/authz-dev/authz/internal/pluginhost")
	require.Contains(t, got, "github.com/authz-dev/authz/internal/api", "the walk sees the plugin host's imports")
	for _, p := range []string{
		"github.com/authz-dev/authz/internal/decision",
		"github.com/open-policy-agent/opa/v1/rego",
		"github.com/open-policy-agent/opa/v1/topdown",
	} {
		assert.NotContains(t, got, p)
	}
}
