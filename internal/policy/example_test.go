package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestExampleOPASectionIsValid uncomments the opa section of examples/config.yaml and checks it
// with the configuration's own validation.
func TestExampleOPASectionIsValid(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "config.yaml"))
	require.NoError(t, err)
	_, section, found := strings.Cut(string(b), "\n# opa:\n")
	require.True(t, found, "examples/config.yaml has a commented opa section")
	var lines []string
	for _, l := range strings.Split(section, "\n") {
		if !strings.HasPrefix(l, "# ") {
			break
		}
		lines = append(lines, strings.TrimPrefix(l, "# "))
	}
	var cfg Config
	require.NoError(t, yaml.Unmarshal([]byte("opa:\n"+strings.Join(lines, "\n")), &cfg))
	require.NoError(t, cfg.Validate())
	assert.Equal(t, OriginRemote, cfg.Kind())
	oc, err := cfg.opaConfig()
	require.NoError(t, err)
	assert.Equal(t, "/var/lib/authz/opa", *oc.PersistenceDirectory)
	assert.Contains(t, string(oc.DecisionLogs), `"service":"bundles"`)
	// The example binds its bundle to its key, the form that stays valid with several keys.
	var bundles map[string]struct {
		Signing map[string]any `json:"signing"`
	}
	require.NoError(t, json.Unmarshal(oc.Bundles, &bundles))
	require.NotEmpty(t, bundles)
	for n, b := range bundles {
		assert.NotEmpty(t, b.Signing["keyid"], "bundles.%s.signing names its key", n)
	}
}
