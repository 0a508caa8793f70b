package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

const validSHA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestDefaultConfigIsValid(t *testing.T) {
	cfg := server.DefaultConfig()
	require.NoError(t, cfg.Validate())
	assert.Equal(t, "127.0.0.1:8181", cfg.Addr)
	assert.Equal(t, int64(1<<20), cfg.MaxBodyBytes)
	require.Len(t, cfg.Plugins, 1)
	assert.Equal(t, server.PluginConfig{ID: "example.sandbox", Path: server.SelfExecutable, Args: []string{"example-driver"}}, cfg.Plugins[0])
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		check   func(t *testing.T, c server.Config)
		wantErr string
	}{
		{
			name:  "empty file gives the defaults",
			yaml:  "",
			check: func(t *testing.T, c server.Config) { assert.Equal(t, server.DefaultConfig(), c) },
		},
		{
			name: "full file",
			yaml: `
addr: unix:///run/authz.sock
tls: {cert: /etc/authz/tls.crt, key: /etc/authz/tls.key}
plugins:
  - id: acme.daytona
    path: /opt/authz/plugins/daytona
    sha256: ` + validSHA + `
    args: [--region, eu]
  - id: old.plugin
    path: /opt/authz/plugins/old
    sha256: ` + validSHA + `
    enabled: false
builtinProviders:
  fake: {execute: true, supportsReusableLeases: false}
decisionLog:
  path: /var/log/authz/decisions.log
  required: true
  mask: [/input/lease/metadata/token]
maxBodyBytes: 65536
evalTimeout: 2s
configCheckTimeout: 500ms
pluginStartTimeout: 20s
shutdownTimeout: 5s
http: {readHeaderTimeout: 1s, readTimeout: 2s, writeTimeout: 10s, idleTimeout: 1m, maxHeaderBytes: 8192}
log: {level: debug, json: true}
`,
			check: func(t *testing.T, c server.Config) {
				require.NoError(t, c.Validate())
				assert.Equal(t, "unix:///run/authz.sock", c.Addr)
				assert.Equal(t, "/etc/authz/tls.crt", c.TLS.Cert)
				require.Len(t, c.Plugins, 2, "the file's list replaces the default")
				assert.Equal(t, []string{"--region", "eu"}, c.Plugins[0].Args)
				assert.True(t, c.Plugins[0].IsEnabled())
				assert.False(t, c.Plugins[1].IsEnabled())
				assert.Equal(t, map[string]map[string]any{"fake": {"execute": true, "supportsReusableLeases": false}}, c.BuiltinProviders)
				assert.Equal(t, []string{"/input/lease/metadata/token"}, c.DecisionLog.Mask)
				assert.True(t, c.DecisionLog.Required)
				assert.Equal(t, int64(65536), c.MaxBodyBytes)
				assert.Equal(t, 2*time.Second, c.EvalTimeout)
				assert.Equal(t, 500*time.Millisecond, c.ConfigCheckTimeout)
				assert.Equal(t, time.Minute, c.HTTP.IdleTimeout)
				assert.Equal(t, 8192, c.HTTP.MaxHeaderBytes)
				assert.Equal(t, server.LogConfig{Level: "debug", JSON: true}, c.Log)
			},
		},
		{
			name: "a plugin's trust and privilege settings",
			yaml: `
plugins:
  - id: acme.daytona
    path: /opt/authz/plugins/daytona
    sha256: ` + validSHA + `
    allowWritableBinary: true
    user: authz-driver
    group: authz-driver
    noNewPrivileges: true
    limits: {addressSpaceBytes: 1073741824, processes: 64, openFiles: 256, cpuSeconds: 600}
`,
			check: func(t *testing.T, c server.Config) {
				require.Len(t, c.Plugins, 1)
				p := c.Plugins[0]
				assert.True(t, p.AllowWritableBinary)
				assert.True(t, p.NoNewPrivileges)
				assert.Equal(t, "authz-driver", p.User)
				assert.Equal(t, "authz-driver", p.Group)
				assert.Equal(t, server.PluginLimits{AddressSpaceBytes: 1 << 30, Processes: 64, OpenFiles: 256, CPUSeconds: 600}, p.Limits)
			},
		},
		{
			name:  "plugins: [] starts none",
			yaml:  "plugins: []\n",
			check: func(t *testing.T, c server.Config) { assert.Empty(t, c.Plugins) },
		},
		{
			name: "fields left out keep their defaults",
			yaml: "addr: 0.0.0.0:9000\n",
			check: func(t *testing.T, c server.Config) {
				assert.Equal(t, "0.0.0.0:9000", c.Addr)
				assert.Equal(t, server.DefaultEvalTimeout, c.EvalTimeout)
				assert.Len(t, c.Plugins, 1)
			},
		},
		{name: "unknown field", yaml: "adress: 127.0.0.1:1\n", wantErr: "field adress not found"},
		{name: "unknown nested field", yaml: "plugins:\n  - id: a\n    sha: x\n", wantErr: "field sha not found"},
		{name: "duration without unit", yaml: "evalTimeout: 5\n", wantErr: "config: evalTimeout (line 1): cannot unmarshal"},
		{name: "bad duration in a flow mapping", yaml: "http: {readTimeout: 1s, idleTimeout: soon}\n", wantErr: "config: http.idleTimeout (line 1)"},
		{name: "bad type in a list", yaml: "plugins:\n  - id: a\n    args: {x: 1}\n", wantErr: "config: plugins[0].args (line 3)"},
		{name: "list where a string belongs", yaml: "decisionLog:\n  path: [a]\n", wantErr: "decisionLog.path"},
		{name: "not a mapping", yaml: "- a\n- b\n", wantErr: "config"},
		{name: "two documents", yaml: "addr: a:1\n---\naddr: b:2\n", wantErr: "more than one YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := server.ParseConfig(strings.NewReader(tt.yaml))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestValidateNamesTheField(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *server.Config)
		want   string
	}{
		{name: "bad sha256", change: func(c *server.Config) {
			c.Plugins = []server.PluginConfig{{ID: "a", Path: "/x", SHA256: "abc"}}
		}, want: "plugins[0].sha256: must be 64 hex characters"},
		{name: "missing sha256", change: func(c *server.Config) {
			c.Plugins = append(c.Plugins, server.PluginConfig{ID: "a", Path: "/x"})
		}, want: "plugins[1].sha256: must be 64 hex characters"},
		{name: "empty id", change: func(c *server.Config) {
			c.Plugins = []server.PluginConfig{{Path: "/x", SHA256: validSHA}}
		}, want: "plugins[0].id: must be a non-empty string"},
		{name: "duplicate id", change: func(c *server.Config) {
			c.Plugins = append(c.Plugins, server.PluginConfig{ID: "example.sandbox", Path: "/x", SHA256: validSHA})
		}, want: `plugins[1].id: "example.sandbox" is already the id of plugins[0]`},
		{name: "empty path", change: func(c *server.Config) {
			c.Plugins = []server.PluginConfig{{ID: "a", SHA256: validSHA}}
		}, want: "plugins[0].path: must name the driver executable"},
		{name: "addr without port", change: func(c *server.Config) { c.Addr = "localhost" }, want: "addr: "},
		{name: "addr relative unix path", change: func(c *server.Config) { c.Addr = "unix://authz.sock" }, want: "addr: "},
		{name: "addr other scheme", change: func(c *server.Config) { c.Addr = "http://127.0.0.1:8181" }, want: "addr: "},
		{name: "tls cert without key", change: func(c *server.Config) { c.TLS.Cert = "/c.pem" }, want: "tls.key: must be set together with tls.cert"},
		{name: "tls key without cert", change: func(c *server.Config) { c.TLS.Key = "/k.pem" }, want: "tls.cert: must be set together with tls.key"},
		{name: "builtin provider not boolean", change: func(c *server.Config) {
			c.BuiltinProviders = map[string]map[string]any{"fake": {"execute": "yes"}}
		}, want: "builtinProviders.fake.execute: must be true or false"},
		{name: "builtin provider null", change: func(c *server.Config) {
			c.BuiltinProviders = map[string]map[string]any{"fake": nil}
		}, want: "builtinProviders.fake: must be an object"},
		{name: "mask outside input", change: func(c *server.Config) {
			c.DecisionLog.Mask = []string{"/result/allow"}
		}, want: "decisionLog.mask[0]: "},
		{name: "mask with a bad escape", change: func(c *server.Config) {
			c.DecisionLog.Mask = []string{"/input/a~2b"}
		}, want: "decisionLog.mask[0]: "},
		{name: "required log without a path", change: func(c *server.Config) { c.DecisionLog.Required = true }, want: "decisionLog.required: needs decisionLog.path"},
		{name: "zero body limit", change: func(c *server.Config) { c.MaxBodyBytes = 0 }, want: "maxBodyBytes: must be positive"},
		{name: "zero eval timeout", change: func(c *server.Config) { c.EvalTimeout = 0 }, want: "evalTimeout: must be a positive duration"},
		{name: "negative idle timeout", change: func(c *server.Config) { c.HTTP.IdleTimeout = -time.Second }, want: "http.idleTimeout: must be a positive duration"},
		{name: "write timeout shorter than evaluation", change: func(c *server.Config) {
			c.HTTP.WriteTimeout = time.Second
			c.EvalTimeout = 2 * time.Second
		}, want: "http.writeTimeout: must be longer than evalTimeout"},
		{name: "tiny header limit", change: func(c *server.Config) { c.HTTP.MaxHeaderBytes = 10 }, want: "http.maxHeaderBytes: must be at least 1024"},
		{name: "bad log level", change: func(c *server.Config) { c.Log.Level = "loud" }, want: "log.level: must be one of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := server.DefaultConfig()
			tt.change(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := server.DefaultConfig()
	c.Addr = "nope"
	c.MaxBodyBytes = -1
	c.Log.Level = "x"
	err := c.Validate()
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	assert.Len(t, lines, 3)
}

func TestValidateSelfNeedsNoPin(t *testing.T) {
	c := server.DefaultConfig()
	c.Plugins = []server.PluginConfig{{ID: "me", Path: server.SelfExecutable, Args: []string{"example-driver"}}}
	require.NoError(t, c.Validate())
	c.Plugins[0].SHA256 = "short"
	require.ErrorContains(t, c.Validate(), "plugins[0].sha256")
}

func TestExampleConfigIsValid(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "examples", "config.yaml"))
	require.NoError(t, err)
	defer f.Close()
	c, err := server.ParseConfig(f)
	require.NoError(t, err)
	require.NoError(t, c.Validate())
}
