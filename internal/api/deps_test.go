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

// TestPluginHostLinksNoRegoEvaluator: the plugin host checks manifests against the capability
// list (api.CapabilityKeys) without linking the decision engine or OPA's Rego evaluator.
func TestPluginHostLinksNoRegoEvaluator(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", "github.com/authz-dev/authz/internal/pluginhost").Output()
	require.NoError(t, err)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/authz-dev/authz/internal/api", "the walk sees the plugin host's imports")
	for _, p := range []string{
		"github.com/authz-dev/authz/internal/decision",
		"github.com/open-policy-agent/opa/v1/rego",
		"github.com/open-policy-agent/opa/v1/topdown",
	} {
		assert.NotContains(t, deps, p)
	}
}
