package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestExampleDriverRefusesFaultFlags: the example driver the binary ships takes its honest keys
// and no fault flag (those live in the test-only internal/testdrivers/faults). A flag it takes
// ends at the "not meant to be run by hand" check (exit 1); one it does not take is a usage
// error (exit 2).
func TestExampleDriverRefusesFaultFlags(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
	}{
		{name: "no flags", args: nil, wantCode: 1},
		{name: "honest keys", args: []string{"-plugin-key", "acme.sandbox", "-driver-key", "acme"}, wantCode: 1},
		{name: "crash-after", args: []string{"-crash-after", "1"}, wantCode: 2},
		{name: "hang-at-start", args: []string{"-hang-at-start"}, wantCode: 2},
		{name: "declare", args: []string{"-declare", `duplexCommandStream="true"`}, wantCode: 2},
		{name: "stdout-noise", args: []string{"-stdout-noise"}, wantCode: 2},
		{name: "reject-config", args: []string{"-reject-config"}, wantCode: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, _ := runCLI(t, "", append([]string{"example-driver"}, tt.args...)...)
			assert.Equal(t, tt.wantCode, code)
			assert.Empty(t, stdout)
		})
	}
}
