package policy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBoundOPA: bundles without size_limit_bytes and a decision-log buffer without a bound get
// authz's defaults; what the operator set stays, and raises the bound of one downloaded file.
func TestBoundOPA(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        string
		want      string
		wantEntry int64
	}{
		{"defaults", `{"bundles":{"a":{"resource":"x"}},"decision_logs":{"console":true}}`,
			`{"bundles":{"a":{"resource":"x","size_limit_bytes":8388608}},"decision_logs":{"console":true,"reporting":{"buffer_size_limit_bytes":16777216}}}`, DefaultBundleEntryBytes},
		{"operator's values stay", `{"bundles":{"a":{"size_limit_bytes":104857600},"b":{}},"decision_logs":{"reporting":{"buffer_size_limit_bytes":1000}}}`,
			`{"bundles":{"a":{"size_limit_bytes":104857600},"b":{"size_limit_bytes":8388608}},"decision_logs":{"reporting":{"buffer_size_limit_bytes":1000}}}`, 100 << 20},
		{"event buffer and rate limit are bounds of their own", `{"decision_logs":{"reporting":{"buffer_type":"event"}},"x":{"reporting":1}}`,
			`{"decision_logs":{"reporting":{"buffer_type":"event"}},"x":{"reporting":1}}`, DefaultBundleEntryBytes},
		{"rate limited", `{"decision_logs":{"reporting":{"max_decisions_per_second":5.5}}}`,
			`{"decision_logs":{"reporting":{"max_decisions_per_second":5.5}}}`, DefaultBundleEntryBytes},
		{"no decision logs", `{"services":{"s":{"url":"http://x"}}}`, `{"services":{"s":{"url":"http://x"}}}`, DefaultBundleEntryBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, lim, err := boundOPA([]byte(tc.in))
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(out))
			assert.Equal(t, tc.wantEntry, lim.entryBytes)
			assert.GreaterOrEqual(t, lim.totalBytes, lim.entryBytes)
			var v any
			require.NoError(t, json.Unmarshal(out, &v))
		})
	}
}
