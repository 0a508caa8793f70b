package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/authz-dev/authz/internal/opaplugin"
)

// TestCommands: run is the one command; help goes to stdout (exit 0), a missing or unknown
// command is a usage error (exit 2) that names it.
func TestCommands(t *testing.T) {
	for _, tt := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{name: "help", args: []string{"help"}, wantOut: "authz-opa run [opa run flags]"},
		{name: "-h", args: []string{"-h"}, wantOut: "authz-opa run [opa run flags]"},
		{name: "none", args: nil, wantCode: 2, wantErr: "Usage:"},
		{name: "unknown", args: []string{"eval"}, wantCode: 2, wantErr: `authz-opa: unknown command "eval": the one command is run (OPA's other commands: go tool opa)`},
		{name: "run help", args: []string{"run", "-h"}, wantOut: opaplugin.Usage},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run("authz-opa", tt.args, strings.NewReader(""), &stdout, &stderr)
			assert.Equal(t, tt.wantCode, code, "stderr: %s", stderr.String())
			assert.Contains(t, stdout.String(), tt.wantOut)
			if tt.name == "run help" {
				assert.True(t, strings.HasPrefix(stdout.String(), opaplugin.Usage), "the gate first: %s", stdout.String())
				assert.Contains(t, stdout.String(), "Start an instance of OPA", "then OPA's help")
			}
			assert.Contains(t, stderr.String(), tt.wantErr)
		})
	}
}
