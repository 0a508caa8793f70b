package decision_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
)

func TestExplainNamesWhatIsMissing(t *testing.T) {
	deny := decision.Document{Code: "DUPLEX_CHANNEL_CAPABILITY_DENIED", Message: "Sandbox lease does not grant the duplex command stream capability."}
	tests := []struct {
		name     string
		resolved map[string]any
		facts    map[string]any
		want     []string
		wantNot  []string
	}{
		{
			name:     "sandbox without a provider key",
			resolved: map[string]any{"driver": "sandbox", "providerKey": "", "pluginBacked": false, "pluginId": "", "driverKey": ""},
			want:     []string{`provider key: none (lease.metadata.provider is not a non-empty string`, "plugin-backed false"},
			wantNot:  []string{"driver key", "pinned plugin"},
		},
		{
			name:     "plugin-backed sandbox without a pin",
			resolved: map[string]any{"driver": "sandbox", "providerKey": "daytona", "pluginBacked": true, "pluginId": "", "driverKey": ""},
			want:     []string{`provider key "daytona"`, "pinned plugin: none (lease.metadata.pluginId is not a non-empty string)"},
		},
		{
			name:     "plugin driver without a driver key",
			resolved: map[string]any{"driver": "plugin", "providerKey": "", "pluginBacked": false, "pluginId": "test.plugin", "driverKey": ""},
			want:     []string{`pinned plugin "test.plugin"`, "driver key: none (lease.metadata.driverKey is not a non-empty string)", `no installed plugin has the id "test.plugin"`},
			wantNot:  []string{"provider key"},
		},
		{
			name:     "pinned plugin found",
			resolved: map[string]any{"driver": "sandbox", "providerKey": "daytona", "pluginBacked": true, "pluginId": "test.plugin", "driverKey": ""},
			facts:    map[string]any{"plugin": map[string]any{"id": "test.plugin", "key": "acme.daytona", "status": "ready"}},
			want:     []string{`pinned plugin "test.plugin"`, `plugin "test.plugin": key acme.daytona, status ready`},
			wantNot:  []string{"driver key", "no installed plugin"},
		},
		{
			name:     "local driver",
			resolved: map[string]any{"driver": "local", "providerKey": "", "pluginBacked": false, "pluginId": "", "driverKey": ""},
			want:     []string{`driver "local"`},
			wantNot:  []string{"provider key", "pinned plugin", "driver key"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			facts := tt.facts
			if facts == nil {
				facts = map[string]any{}
			}
			in := snapshot.Input{"operation": "openDuplexChannel", "resolved": tt.resolved, "facts": facts}
			out := decision.Explain(deny, in, nil)
			assert.NotContains(t, out, `""`, "an empty value is explained, never printed as \"\"")
			for _, w := range tt.want {
				assert.Contains(t, out, w)
			}
			for _, w := range tt.wantNot {
				assert.NotContains(t, out, w)
			}
		})
	}
}

func TestExplainNamesTheFailureCode(t *testing.T) {
	doc := decision.FailedDocument("openDuplexChannel")
	err := fmt.Errorf("decide: %w", &coded.Error{Code: coded.EvalTimeout, Err: context.DeadlineExceeded})
	out := decision.Explain(doc, snapshot.Input{"operation": "openDuplexChannel"}, err)
	assert.Contains(t, out, "evaluation failed: EVAL_TIMEOUT: decide: context deadline exceeded")
}
