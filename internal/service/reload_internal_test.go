package service

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/authz-dev/authz/internal/pluginhost"
)

// TestChangedAtRestartOnly: a SIGHUP applies the plugins and builtinProviders; every other
// changed setting is named, so that the log says it waits for the next start.
func TestChangedAtRestartOnly(t *testing.T) {
	running := DefaultConfig()
	next := DefaultConfig()
	next.Host.Plugins = append(next.Host.Plugins, pluginhost.PluginConfig{ID: "other", Path: "/bin/driver"})
	next.Host.BuiltinProviders = map[string]map[string]any{"fake": {"execute": true}}
	assert.Empty(t, changedAtRestartOnly(running, next), "plugins and builtinProviders are applied by SIGHUP")

	next.Server.Addr = "127.0.0.1:9999"
	next.Policy.Bundle = "/srv/bundle.tar.gz"
	next.Decision.Cache = "off"
	next.Facts = "/srv/facts.json"
	assert.Equal(t, []string{
		"server (addr, tls, authentication, limits, decisionLog, http, ...)",
		"policy (bundle, opa, ...)",
		"decision (evalTimeout, decisionCache)",
		"facts",
	}, changedAtRestartOnly(running, next))
	assert.Equal(t, ExamplePluginID, running.Host.Plugins[0].ID, "the running configuration is left alone")
	assert.Len(t, running.Host.Plugins, 1)
}
