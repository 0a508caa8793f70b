package main

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServeLinksNoOTelHTTP: `authz serve` traces OPA's HTTP clients with its own client spans
// (internal/tracing.NewClientTransport); it links neither otelhttp, its httpsnoop (seconds of
// the first build), nor OPA's features/tracing that registers them. authz-opa, which runs
// OPA's runtime and server, traces them with otelhttp as OPA does.
func TestServeLinksNoOTelHTTP(t *testing.T) {
	t.Parallel()
	deps := func(pkg string) []string {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "list", "-deps", pkg).Output()
		require.NoError(t, err)
		return strings.Fields(string(out))
	}
	const otelhttp = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	got := deps("github.com/authz-dev/authz/cmd/authz")
	require.Contains(t, got, "go.opentelemetry.io/otel/sdk/trace", "the walk sees what authz links")
	for _, p := range []string{otelhttp, "github.com/felixge/httpsnoop", "github.com/open-policy-agent/opa/v1/features/tracing"} {
		assert.False(t, slices.Contains(got, p), "authz links %s", p)
	}
	assert.True(t, slices.Contains(deps("github.com/authz-dev/authz/cmd/authz-opa"), otelhttp), "authz-opa traces OPA's runtime with otelhttp")
}
