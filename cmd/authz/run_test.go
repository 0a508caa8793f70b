package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
)

// TestHelpGoesToStdout: asked-for help is output (stdout, exit 0), for the program and for each
// command, however it is asked for.
func TestHelpGoesToStdout(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "help", args: []string{"help"}, want: "authz serve  [flags]"},
		{name: "--help", args: []string{"--help"}, want: "authz serve  [flags]"},
		{name: "-h", args: []string{"-h"}, want: "authz serve  [flags]"},
		{name: "serve --help", args: []string{"serve", "--help"}, want: "Usage: authz serve"},
		{name: "serve -h after another flag", args: []string{"serve", "--addr", "127.0.0.1:0", "-h"}, want: "-eval-timeout"},
		{name: "decide -h", args: []string{"decide", "-h"}, want: "Usage: authz decide"},
		{name: "help serve", args: []string{"help", "serve"}, want: "Usage: authz serve"},
		{name: "help decide", args: []string{"help", "decide"}, want: "Usage: authz decide"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", tt.args...)
			assert.Equal(t, 0, code, "stderr: %s", errOut)
			assert.Contains(t, out, tt.want)
			assert.Empty(t, errOut)
		})
	}
	t.Run("a mistake still goes to stderr with exit 2", func(t *testing.T) {
		code, out, errOut := runCLI(t, "", "serve", "--nope")
		assert.Equal(t, 2, code)
		assert.Empty(t, out)
		assert.Contains(t, errOut, "Usage: authz serve")
	})
	t.Run("-h after -- is an argument, not a request for help", func(t *testing.T) {
		assert.False(t, wantsHelp([]string{"--", "-h"}))
		assert.True(t, wantsHelp([]string{"-x", "--help", "--"}))
	})
}

// TestVersionPrintsThePolicyRevision: the revision `authz version` prints is the one decisions
// carry.
func TestVersionPrintsThePolicyRevision(t *testing.T) {
	eng, err := decision.New(context.Background(), decision.Options{})
	require.NoError(t, err)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runCLI(t, "", args...)
		require.Equal(t, 0, code, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, out)
		assert.True(t, strings.HasPrefix(lines[0], "authz "), out)
		assert.Equal(t, "policy "+eng.Revision(), lines[1])
	}
}
