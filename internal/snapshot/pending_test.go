package snapshot

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// preparingFacts offer every config check ahead (ConfigCheckPreparer) and count the checks
// Build makes itself.
type preparingFacts struct {
	countingFacts
	prepared []string // pluginID/driverKey of each prepared check
	answer   bool
	err      error
}

func (p *preparingFacts) PrepareConfigCheck(pluginID string, w *Worker, driverKey string, config any) func(context.Context) (bool, error) {
	p.prepared = append(p.prepared, pluginID+"/"+driverKey)
	return func(context.Context) (bool, error) { return p.answer, p.err }
}

// TestPendingConfigCheck: the check Build would make is offered ahead only where Build
// consults it, and its answer then serves Build without a second check.
func TestPendingConfigCheck(t *testing.T) {
	const backed = `{"environment":{"driver":"sandbox","config":{"provider":"daytona"}},"lease":{"metadata":{"sandboxProviderPlugin":true,"pluginId":"test.plugin","provider":"daytona"}}}`
	tests := []struct {
		name    string
		request string
		want    bool
	}{
		{name: "plugin-backed sandbox", request: backed, want: true},
		{name: "not plugin-backed", request: `{"environment":{"driver":"sandbox","config":{"provider":"daytona"}},"lease":{"metadata":{"pluginId":"test.plugin","provider":"daytona"}}}`},
		{name: "unknown plugin", request: `{"environment":{"driver":"sandbox","config":{"provider":"daytona"}},"lease":{"metadata":{"sandboxProviderPlugin":true,"pluginId":"nope","provider":"daytona"}}}`},
		{name: "another driver", request: `{"lease":{"metadata":{"driver":"plugin","sandboxProviderPlugin":true,"pluginId":"test.plugin","driverKey":"k"}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			facts := &preparingFacts{countingFacts: countingFacts{FileFacts: mustFacts(t, fixtureFacts)}}
			wait := PendingConfigCheck(mustRequest(t, tt.request), facts)
			if !tt.want {
				assert.Nil(t, wait)
				assert.Empty(t, facts.prepared)
				return
			}
			require.NotNil(t, wait)
			assert.Equal(t, []string{"test.plugin/daytona"}, facts.prepared)
		})
	}

	t.Run("facts that prepare nothing", func(t *testing.T) {
		assert.Nil(t, PendingConfigCheck(mustRequest(t, backed), mustFacts(t, fixtureFacts)))
	})

	for _, answer := range []struct {
		name   string
		valid  bool
		err    error
		failed bool
	}{
		{name: "valid", valid: true},
		{name: "not valid", valid: false, failed: true},
		{name: "failed", err: errors.New("shed"), failed: true},
	} {
		t.Run("the answer serves Build: "+answer.name, func(t *testing.T) {
			facts := &preparingFacts{countingFacts: countingFacts{FileFacts: mustFacts(t, fixtureFacts), valid: !answer.valid}, answer: answer.valid, err: answer.err}
			wait := PendingConfigCheck(mustRequest(t, backed), facts)
			require.NotNil(t, wait)
			checked := wait(t.Context())
			in := Build(t.Context(), mustRequest(t, backed), checked, Options{})
			assert.Zero(t, facts.calls, "no second check")
			assert.Equal(t, answer.failed, in["narrowing"].(map[string]any)["configResolutionFailed"])
		})
	}
}
