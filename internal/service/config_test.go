package service_test

import (
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/examples/exampledriver"
	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/service"
)

const validSHA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// resolvedAndValid resolves c and validates it, as Run does.
func resolvedAndValid(t testing.TB, c service.Config) error {
	t.Helper()
	c, err := c.Resolve()
	require.NoError(t, err)
	return c.Validate()
}

func TestDefaultConfigIsValid(t *testing.T) {
	cfg := service.DefaultConfig()
	require.NoError(t, resolvedAndValid(t, cfg))
	assert.Equal(t, "127.0.0.1:8181", cfg.Server.Addr)
	assert.Equal(t, int64(1<<20), cfg.Server.MaxBodyBytes)
	require.Len(t, cfg.Host.Plugins, 1)
	assert.Equal(t, pluginhost.PluginConfig{ID: "example.sandbox", Path: pluginhost.SelfExecutable, Key: "example.sandbox", Args: []string{"example-driver"}}, cfg.Host.Plugins[0])
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		check   func(t *testing.T, c service.Config)
		wantErr string
	}{
		{
			name:  "empty file gives the defaults",
			yaml:  "",
			check: func(t *testing.T, c service.Config) { assert.Equal(t, service.DefaultConfig(), c) },
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
			check: func(t *testing.T, c service.Config) {
				require.NoError(t, c.Validate())
				assert.Equal(t, "unix:///run/authz.sock", c.Server.Addr)
				assert.Equal(t, "/etc/authz/tls.crt", c.Server.TLS.Cert)
				require.Len(t, c.Host.Plugins, 2, "the file's list replaces the default")
				assert.Equal(t, []string{"--region", "eu"}, c.Host.Plugins[0].Args)
				assert.True(t, c.Host.Plugins[0].IsEnabled())
				assert.False(t, c.Host.Plugins[1].IsEnabled())
				assert.Equal(t, map[string]map[string]any{"fake": {"execute": true, "supportsReusableLeases": false}}, c.Host.BuiltinProviders)
				assert.Equal(t, []string{"/input/lease/metadata/token"}, c.Server.DecisionLog.Mask)
				assert.True(t, c.Server.DecisionLog.Required)
				assert.Equal(t, int64(65536), c.Server.MaxBodyBytes)
				assert.Equal(t, 2*time.Second, c.Decision.EvalTimeout)
				assert.Equal(t, 500*time.Millisecond, c.Host.ConfigCheckTimeout)
				assert.Equal(t, 20*time.Second, c.Host.StartTimeout)
				assert.Equal(t, 5*time.Second, c.Server.ShutdownTimeout)
				assert.Equal(t, time.Minute, c.Server.HTTP.IdleTimeout)
				assert.Equal(t, 8192, c.Server.HTTP.MaxHeaderBytes)
				assert.Equal(t, service.LogConfig{Level: "debug", JSON: true}, c.Log)
			},
		},
		{
			name: "a plugin's trust and privilege settings",
			yaml: `
plugins:
  - id: acme.daytona
    path: /opt/authz/plugins/daytona
    sha256: ` + validSHA + `
    key: acme.daytona
    allowWritableBinary: true
    user: authz-driver
    group: authz-driver
    noNewPrivileges: true
    limits: {addressSpaceBytes: 1073741824, processes: 64, openFiles: 256, cpuSeconds: 600}
`,
			check: func(t *testing.T, c service.Config) {
				require.Len(t, c.Host.Plugins, 1)
				p := c.Host.Plugins[0]
				assert.Equal(t, "acme.daytona", p.Key)
				assert.True(t, p.AllowWritableBinary)
				assert.True(t, p.NoNewPrivileges)
				assert.Equal(t, "authz-driver", p.User)
				assert.Equal(t, "authz-driver", p.Group)
				assert.Equal(t, pluginhost.ResourceLimits{AddressSpaceBytes: 1 << 30, Processes: 64, OpenFiles: 256, CPUSeconds: 600}, p.ResourceLimits)
			},
		},
		{
			name:  "plugins: [] starts none",
			yaml:  "plugins: []\n",
			check: func(t *testing.T, c service.Config) { assert.Empty(t, c.Host.Plugins) },
		},
		{
			name: "fields left out keep their defaults",
			yaml: "addr: 0.0.0.0:9000\n",
			check: func(t *testing.T, c service.Config) {
				assert.Equal(t, "0.0.0.0:9000", c.Server.Addr)
				assert.Equal(t, service.DefaultEvalTimeout, c.Decision.EvalTimeout)
				assert.Equal(t, pluginhost.DefaultStartTimeout, c.Host.StartTimeout)
				assert.Len(t, c.Host.Plugins, 1)
			},
		},
		{name: "unknown field", yaml: "adress: 127.0.0.1:1\n", wantErr: "field adress not found"},
		{name: "unknown nested field", yaml: "plugins:\n  - id: a\n    sha: x\n", wantErr: "field sha not found"},
		{name: "host field not in the file", yaml: "minBackoff: 1s\n", wantErr: "field minBackoff not found"},
		{name: "duration without unit", yaml: "evalTimeout: 5\n", wantErr: "config: evalTimeout (line 1): cannot unmarshal"},
		{name: "bad duration in a flow mapping", yaml: "http: {readTimeout: 1s, idleTimeout: soon}\n", wantErr: "config: http.idleTimeout (line 1)"},
		{name: "bad type in a list", yaml: "plugins:\n  - id: a\n    args: {x: 1}\n", wantErr: "config: plugins[0].args (line 3)"},
		{name: "list where a string belongs", yaml: "decisionLog:\n  path: [a]\n", wantErr: "decisionLog.path"},
		{name: "not a mapping", yaml: "- a\n- b\n", wantErr: "config"},
		{name: "two documents", yaml: "addr: a:1\n---\naddr: b:2\n", wantErr: "more than one YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := service.ParseConfig(strings.NewReader(tt.yaml))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

// TestParseConfigErrorsWhole: each error of ParseConfig, whole: told with the name config,
// naming the field and line when the file tells them, one per line.
func TestParseConfigErrorsWhole(t *testing.T) {
	tests := []struct {
		name string
		r    io.Reader
		want string
	}{
		{name: "unreadable", r: iotest.ErrReader(errors.New("disk on fire")), want: "config: disk on fire"},
		{name: "not YAML", r: strings.NewReader("addr: [\n"), want: "config: yaml: line 1: did not find expected node content"},
		{name: "two documents", r: strings.NewReader("addr: a:1\n---\naddr: b:2\n"), want: "config: more than one YAML document: write one mapping"},
		{name: "a field", r: strings.NewReader("addr: a:1\nevalTimeout: 5\n"), want: "config: evalTimeout (line 2): cannot unmarshal !!int `5` into time.Duration"},
		{name: "a value at two fields of one line", r: strings.NewReader("{evalTimeout: 5, configCheckTimeout: 5}\n"),
			want: "config: evalTimeout or configCheckTimeout (line 1): cannot unmarshal !!int `5` into time.Duration\n" +
				"config: evalTimeout or configCheckTimeout (line 1): cannot unmarshal !!int `5` into time.Duration"},
		{name: "a line that names no field", r: strings.NewReader("5\n"), want: "config: line 1: cannot unmarshal !!int `5` into service.Config"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := service.ParseConfig(tt.r)
			require.Error(t, err)
			assert.Equal(t, tt.want, err.Error())
		})
	}
}

// TestValidateNamesTheField: the problems of the file's plugin host, decision engine and log
// parts, and of their relations; the server's own are tested in internal/server.
func TestValidateNamesTheField(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *service.Config)
		want   string
	}{
		{name: "bad sha256", change: func(c *service.Config) {
			c.Host.Plugins = []pluginhost.PluginConfig{{ID: "a", Path: "/x", SHA256: "abc"}}
		}, want: "plugins[0].sha256: must be 64 hex characters"},
		{name: "missing sha256", change: func(c *service.Config) {
			c.Host.Plugins = append(c.Host.Plugins, pluginhost.PluginConfig{ID: "a", Path: "/x"})
		}, want: "plugins[1].sha256: must be 64 hex characters"},
		{name: "empty id", change: func(c *service.Config) {
			c.Host.Plugins = []pluginhost.PluginConfig{{Path: "/x", SHA256: validSHA}}
		}, want: "plugins[0].id: must not be empty"},
		{name: "id with white space", change: func(c *service.Config) {
			c.Host.Plugins = []pluginhost.PluginConfig{{ID: " a", Path: "/x", SHA256: validSHA}}
		}, want: `plugins[0].id: must not start or end with white space: " a"`},
		{name: "duplicate id", change: func(c *service.Config) {
			c.Host.Plugins = append(c.Host.Plugins, pluginhost.PluginConfig{ID: "example.sandbox", Path: "/x", SHA256: validSHA})
		}, want: `plugins[1].id: "example.sandbox" is already the id of plugins[0]`},
		{name: "empty path", change: func(c *service.Config) {
			c.Host.Plugins = []pluginhost.PluginConfig{{ID: "a", SHA256: validSHA}}
		}, want: `plugins[0].path: must not be empty: name the driver executable (or "@self" for authz itself)`},
		{name: "builtin provider not boolean", change: func(c *service.Config) {
			c.Host.BuiltinProviders = map[string]map[string]any{"fake": {"execute": "yes"}}
		}, want: "builtinProviders.fake.execute: must be true or false"},
		{name: "builtin provider null", change: func(c *service.Config) {
			c.Host.BuiltinProviders = map[string]map[string]any{"fake": nil}
		}, want: "builtinProviders.fake: must be an object"},
		{name: "server problem", change: func(c *service.Config) { c.Server.MaxBodyBytes = 0 }, want: "maxBodyBytes: must be positive"},
		{name: "zero eval timeout", change: func(c *service.Config) { c.Decision.EvalTimeout = 0 }, want: "evalTimeout: must be a positive duration"},
		{name: "negative plugin start timeout", change: func(c *service.Config) { c.Host.StartTimeout = -time.Second }, want: "pluginStartTimeout: must not be negative"},
		{name: "write timeout shorter than evaluation", change: func(c *service.Config) {
			c.Server.HTTP.WriteTimeout = time.Second
			c.Decision.EvalTimeout = 2 * time.Second
		}, want: "http.writeTimeout: must be longer than evalTimeout"},
		{name: "bad log level", change: func(c *service.Config) { c.Log.Level = "loud" }, want: "log.level: must be one of"},
		{name: "bad decision cache", change: func(c *service.Config) { c.Decision.Cache = "maybe" }, want: "decisionCache: must be on or off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := service.DefaultConfig()
			tt.change(&c)
			err := resolvedAndValid(t, c)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := service.DefaultConfig()
	c.Server.Addr = "nope"
	c.Server.MaxBodyBytes = -1
	c.Log.Level = "x"
	c.Host.Plugins[0].ID = ""
	err := resolvedAndValid(t, c)
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	assert.Len(t, lines, 4, err.Error())
}

func TestValidateSelfNeedsNoPin(t *testing.T) {
	c := service.DefaultConfig()
	c.Host.Plugins = []pluginhost.PluginConfig{{ID: "me", Path: pluginhost.SelfExecutable, Args: []string{"example-driver"}}}
	require.NoError(t, resolvedAndValid(t, c))
	c.Host.Plugins[0].SHA256 = "short"
	require.ErrorContains(t, resolvedAndValid(t, c), "plugins[0].sha256")
}

// TestExampleConfig: examples/config.yaml is valid and says what it documents.
func TestExampleConfig(t *testing.T) {
	c, err := service.LoadConfig(filepath.Join("..", "..", "examples", "config.yaml"))
	require.NoError(t, err)
	require.NoError(t, resolvedAndValid(t, c))
	require.NotEmpty(t, c.Host.Plugins)
	assert.Equal(t, pluginhost.PluginConfig{ID: "example.sandbox", Path: pluginhost.SelfExecutable, Key: "example.sandbox", Args: []string{"example-driver"}}, c.Host.Plugins[0])
	assert.Equal(t, map[string]map[string]any{"fake": {"execute": true, "supportsReusableLeases": false}}, c.Host.BuiltinProviders)
	assert.Equal(t, "127.0.0.1:8181", c.Server.Addr)
	assert.Equal(t, "-", c.Server.DecisionLog.Path)
	assert.Equal(t, 2*time.Second, c.Host.ConfigCheckTimeout)
	assert.Equal(t, 5*time.Second, c.Decision.EvalTimeout)
	assert.Equal(t, "on", c.Decision.Cache)
}

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
			c, err := service.ParseConfig(strings.NewReader(tt.yaml))
			require.NoError(t, err)
			err = resolvedAndValid(t, c)
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
			_, err := service.ParseConfig(strings.NewReader(tt.yaml))
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
		{name: "the default, longer", check: 0, eval: time.Second, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := service.DefaultConfig()
			c.Host.ConfigCheckTimeout, c.Decision.EvalTimeout = tt.check, tt.eval
			c.Server.HTTP.WriteTimeout = time.Minute
			err := resolvedAndValid(t, c)
			if !tt.wantErr {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, "configCheckTimeout: must be shorter than evalTimeout ("+tt.eval.String()+")")
		})
	}
}

func TestDecisionCacheConfig(t *testing.T) {
	for _, tt := range []struct {
		name, yaml, want, err string
	}{
		{name: "default", yaml: "", want: "on"},
		{name: "off", yaml: "decisionCache: off\n", want: "off"},
		{name: "on", yaml: "decisionCache: on\n", want: "on"},
		{name: "other", yaml: "decisionCache: maybe\n", err: "decisionCache: must be on or off"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := service.ParseConfig(strings.NewReader(tt.yaml))
			require.NoError(t, err)
			if tt.err != "" {
				require.ErrorContains(t, resolvedAndValid(t, cfg), tt.err)
				return
			}
			assert.Equal(t, tt.want, cfg.Decision.Cache)
		})
	}
}

func TestAuthenticationInTheFile(t *testing.T) {
	c, err := service.ParseConfig(strings.NewReader("authentication:\n  mode: token\n  tokensFile: /etc/authz/tokens\n  allowedHosts: [authz.internal]\n"))
	require.NoError(t, err)
	assert.Equal(t, server.AuthConfig{Mode: "token", TokensFile: "/etc/authz/tokens", AllowedHosts: []string{"authz.internal"}}, c.Server.Authentication)
	_, err = service.ParseConfig(strings.NewReader("authentication:\n  tokens: x\n"))
	require.ErrorContains(t, err, "field tokens not found")
}

// TestEveryPluginHasAKey: the default plugin list and examples/config.yaml configure the plugin
// key of every plugin, so that a driver of another plugin cannot take it.
func TestEveryPluginHasAKey(t *testing.T) {
	example, err := service.LoadConfig(filepath.Join("..", "..", "examples", "config.yaml"))
	require.NoError(t, err)
	for name, plugins := range map[string][]pluginhost.PluginConfig{"default": service.DefaultConfig().Host.Plugins, "examples/config.yaml": example.Host.Plugins} {
		require.NotEmpty(t, plugins, name)
		for _, p := range plugins {
			assert.NotEmpty(t, p.Key, "%s: plugin %s has no key", name, p.ID)
		}
	}
	assert.Equal(t, exampledriver.DefaultPluginKey, service.DefaultConfig().Host.Plugins[0].Key, "the key the example driver reports")
}
