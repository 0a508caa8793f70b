package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

// builtinProviders has a closed schema: a key the facts do not give a built-in provider is a
// configuration error naming it, so a secret pasted there never reaches /v1/facts or the log.
func TestBuiltinProvidersSchemaIsClosed(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr []string // each must appear; nil: valid
	}{
		{name: "the two fields", yaml: "builtinProviders:\n  fake: {execute: true, supportsReusableLeases: false}\n"},
		{name: "one field", yaml: "builtinProviders:\n  fake: {execute: false}\n"},
		{name: "a secret", yaml: "builtinProviders:\n  fake: {execute: true, apiToken: s3cret}\n",
			wantErr: []string{"builtinProviders.fake.apiToken: unknown field: a built-in provider has only execute and supportsReusableLeases"}},
		{name: "a case variant", yaml: "builtinProviders:\n  fake: {Execute: true}\n",
			wantErr: []string{"builtinProviders.fake.Execute: unknown field"}},
		{name: "a nested object", yaml: "builtinProviders:\n  fake: {execute: true, auth: {key: k}}\n",
			wantErr: []string{"builtinProviders.fake.auth: unknown field"}},
		{name: "a quoted boolean", yaml: "builtinProviders:\n  fake: {execute: \"true\"}\n",
			wantErr: []string{`builtinProviders.fake.execute: must be true or false (unquoted), got the string "true"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := server.ParseConfig(strings.NewReader(tt.yaml))
			require.NoError(t, err)
			err = c.Validate()
			if tt.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.wantErr {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "s3cret", "the error names the field, not its value")
		})
	}
}

// A value that was refused is quoted as the file wrote it: "true" is a string, not a boolean.
func TestConfigErrorsQuoteValuesAsWritten(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{name: "double-quoted boolean", yaml: "plugins:\n  - id: a\n    enabled: \"true\"\n",
			want: "config: plugins[0].enabled (line 3): cannot unmarshal !!str \"true\" into bool"},
		{name: "single-quoted boolean", yaml: "decisionLog: {required: 'false'}\n",
			want: "config: decisionLog.required (line 1): cannot unmarshal !!str 'false' into bool"},
		{name: "plain number", yaml: "evalTimeout: 5\n",
			want: "config: evalTimeout (line 1): cannot unmarshal !!int `5` into time.Duration"},
		{name: "quoted number", yaml: "maxBodyBytes: \"1024\"\n",
			want: "config: maxBodyBytes (line 1): cannot unmarshal !!str \"1024\" into int64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := server.ParseConfig(strings.NewReader(tt.yaml))
			require.Error(t, err)
			assert.Equal(t, tt.want, err.Error())
		})
	}
}

// The driver's config check runs inside the decision: a bound not shorter than the decision's
// own would let one slow driver turn every decision into EVAL_TIMEOUT.
func TestConfigCheckTimeoutShorterThanEvalTimeout(t *testing.T) {
	tests := []struct {
		name        string
		check, eval time.Duration
		wantErr     bool
	}{
		{name: "shorter", check: time.Second, eval: 5 * time.Second},
		{name: "equal", check: 5 * time.Second, eval: 5 * time.Second, wantErr: true},
		{name: "longer", check: 10 * time.Second, eval: 5 * time.Second, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := server.DefaultConfig()
			c.ConfigCheckTimeout, c.EvalTimeout = tt.check, tt.eval
			c.HTTP.WriteTimeout = time.Minute
			err := c.Validate()
			if !tt.wantErr {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, "configCheckTimeout: must be shorter than evalTimeout ("+tt.eval.String()+")")
		})
	}
}
