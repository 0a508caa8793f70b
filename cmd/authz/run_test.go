package main

import (
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/service"
	"github.com/authz-dev/authz/internal/testutil"
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
	eng := decisiontest.EmbeddedEngine(t, decision.Options{})
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runCLI(t, "", args...)
		require.Equal(t, 0, code, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, out)
		assert.True(t, strings.HasPrefix(lines[0], "authz "), out)
		assert.Equal(t, "policy "+eng.Revision(), lines[1])
	}
}

// TestCommands: every command the usage lists is found in the one table of commands, each
// answers -h, and a name the table does not hold is a usage error (exit 2).
func TestCommands(t *testing.T) {
	listed := regexp.MustCompile(`(?m)^  authz (\w+)`).FindAllStringSubmatch(usage, -1)
	require.Len(t, listed, 7, "serve, check, decide, run, replay, version, help")
	for _, m := range listed {
		assert.Contains(t, commands, m[1], "the usage lists %q", m[1])
	}
	for _, name := range []string{"serve", "check", "decide", "run", "replay", "version", "--version", "help", "-h", "-help", "--help", "example-driver"} {
		assert.Contains(t, commands, name)
	}
	assert.Len(t, commands, 12, "a new command is added to this test and, unless hidden, to the usage")

	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{name: "serve help", args: []string{"serve", "-h"}, wantOut: "Usage: authz serve"},
		{name: "check help", args: []string{"check", "-h"}, wantOut: "Usage: authz check"},
		{name: "decide help", args: []string{"decide", "-h"}, wantOut: "Usage: authz decide"},
		{name: "replay help", args: []string{"replay", "-h"}, wantOut: "Usage: authz replay"},
		{name: "version", args: []string{"version"}, wantOut: "policy "},
		{name: "help", args: []string{"help"}, wantOut: "authz serve  [flags]"},
		{name: "unknown", args: []string{"serv"}, wantCode: 2, wantErr: `unknown command "serv"`},
		{name: "none", args: nil, wantCode: 2, wantErr: "Usage:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", tt.args...)
			assert.Equal(t, tt.wantCode, code, "stderr: %s", errOut)
			assert.Contains(t, out, tt.wantOut)
			assert.Contains(t, errOut, tt.wantErr)
		})
	}
}

// TestServeFlagsOverrideTheFile: a flag given overrides the file's value of its field, a flag
// not given leaves it, and a list flag replaces the configured list.
func TestServeFlagsOverrideTheFile(t *testing.T) {
	dir := t.TempDir()
	file := testutil.WriteFile(t, dir, "config.yaml", "addr: 127.0.0.1:9\nmaxBodyBytes: 2048\nevalTimeout: 3s\n"+
		"decisionLog: {path: /tmp/d.log, mask: [/input/a, /input/b]}\nauthentication: {allowedHosts: [a.example]}\n")
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, c service.Config)
	}{
		{name: "defaults", args: nil, check: func(t *testing.T, c service.Config) {
			assert.Equal(t, service.DefaultConfig(), c)
		}},
		{name: "file only", args: []string{"--config", file}, check: func(t *testing.T, c service.Config) {
			assert.Equal(t, "127.0.0.1:9", c.Server.Addr)
			assert.Equal(t, int64(2048), c.Server.MaxBodyBytes)
			assert.Equal(t, 3*time.Second, c.Decision.EvalTimeout)
			assert.Equal(t, []string{"/input/a", "/input/b"}, c.Server.DecisionLog.Mask)
		}},
		{name: "flags over the file", args: []string{"--addr", "127.0.0.1:10", "--config", file, "--eval-timeout", "4s",
			"--decision-log-mask", "/input/c", "--decision-log-mask", "/input/d,/input/e", "--allowed-host", "", "--log-json", "--decision-cache", "off"},
			check: func(t *testing.T, c service.Config) {
				assert.Equal(t, "127.0.0.1:10", c.Server.Addr)
				assert.Equal(t, int64(2048), c.Server.MaxBodyBytes, "not given: the file's value")
				assert.Equal(t, 4*time.Second, c.Decision.EvalTimeout)
				assert.Equal(t, []string{"/input/c", "/input/d", "/input/e"}, c.Server.DecisionLog.Mask)
				assert.Equal(t, []string{}, c.Server.Authentication.AllowedHosts)
				assert.Equal(t, "/tmp/d.log", c.Server.DecisionLog.Path)
				assert.True(t, c.Log.JSON)
				assert.Equal(t, "off", c.Decision.Cache)
			}},
		{name: "every field flag", args: []string{"--tls-cert", "c", "--tls-key", "k", "--facts", "f", "--decision-log", "-",
			"--decision-log-required", "--max-body-bytes", "9", "--log-level", "debug", "--authentication", "token",
			"--authentication-tokens-file", "t", "--tls-ca-cert-file", "ca"},
			check: func(t *testing.T, c service.Config) {
				want := service.DefaultConfig()
				want.Server.TLS = server.TLSConfig{Cert: "c", Key: "k"}
				want.Facts = "f"
				want.Server.DecisionLog.Path = "-"
				want.Server.DecisionLog.Required = true
				want.Server.MaxBodyBytes = 9
				want.Log.Level = "debug"
				want.Server.Authentication = server.AuthConfig{Mode: "token", TokensFile: "t", ClientCAFile: "ca"}
				assert.Equal(t, want, c)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, serve, err := serveConfig(tt.args, io.Discard)
			require.NoError(t, err)
			require.True(t, serve)
			tt.check(t, c)
		})
	}
}
