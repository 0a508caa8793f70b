package main

import (
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLogMaskDefault: the default mask is written where OPA's decision log reads its masks
// only while the user configured none: decision logs on, no mask_decision, no data and no rule
// at data.system.log.mask.
func TestLogMaskDefault(t *testing.T) {
	const logs = `{"decision_logs": {"console": true}}`
	for _, tt := range []struct {
		name   string
		config string
		data   map[string]any
		rule   string
		off    bool
		want   any // the data at system/log/mask; nil: none
	}{
		{name: "OPA's write APIs open", config: logs, off: true},
		{name: "decision logs, no masks", config: logs, want: defaultLogMask},
		{name: "no decision logs", config: `{}`},
		{name: "mask_decision configured", config: `{"decision_logs": {"console": true, "mask_decision": "/my/mask"}}`},
		{name: "mask data of the user's", config: logs,
			data: map[string]any{"system": map[string]any{"log": map[string]any{"mask": []any{"/input/a"}}}}, want: []any{"/input/a"}},
		{name: "a mask rule of the user's", config: logs, rule: "package system.log\nmask contains \"/input/a\"\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store := inmem.New()
			if tt.data != nil {
				store = inmem.NewFromObject(tt.data)
			}
			m, err := plugins.New([]byte(tt.config), "test", store)
			require.NoError(t, err)
			require.NoError(t, m.Init(t.Context()))
			if tt.rule != "" {
				// A policy written to the store becomes the manager's compiler on commit.
				require.NoError(t, storage.Txn(t.Context(), store, storage.WriteParams, func(txn storage.Transaction) error {
					return store.UpsertPolicy(t.Context(), txn, "mask.rego", []byte(tt.rule))
				}))
				require.NotEmpty(t, m.GetCompiler().GetRulesWithPrefix(logMaskRef))
			}
			(&logMasking{m: m, off: tt.off, log: hclog.NewNullLogger()}).start(t.Context())
			got, err := storage.ReadOne(t.Context(), store, logMaskPath)
			if tt.want == nil {
				assert.True(t, storage.IsNotFound(err), "nothing written: %v, %v", got, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
