package opaplugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConfigured: plugins.authz counts as configured from the configuration file or from an
// override (--set, --set-file) of the section or one of its fields; discovery is reported
// beside it, since it may bring the section later.
func TestConfigured(t *testing.T) {
	for _, tt := range []struct {
		name                string
		file                string
		overrides           []string
		wantGate, wantDisco bool
	}{
		{name: "nothing"},
		{name: "other plugins only", file: "plugins:\n  envoy_ext_authz_grpc: {}\n"},
		{name: "the section", file: "plugins:\n  authz:\n    addr: 127.0.0.1:8182\n", wantGate: true},
		{name: "an empty section", file: "plugins:\n  authz: {}\n", wantGate: true},
		{name: "JSON", file: `{"plugins": {"authz": {}}}`, wantGate: true},
		{name: "--set a field", overrides: []string{"plugins.authz.addr=127.0.0.1:0"}, wantGate: true},
		{name: "--set-file a field", overrides: []string{"plugins.authz.facts=facts.json"}, wantGate: true},
		{name: "--set another plugin", overrides: []string{"plugins.authzz.addr=x", "decision_logs.console=true"}},
		{name: "discovery", file: "discovery:\n  resource: /d\n", wantDisco: true},
		{name: "discovery by --set", overrides: []string{"discovery.resource=/d"}, wantDisco: true},
		{name: "unreadable YAML", file: "plugins: [\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gate, disco := Configured([]byte(tt.file), tt.overrides)
			assert.Equal(t, tt.wantGate, gate, "configured")
			assert.Equal(t, tt.wantDisco, disco, "discovery")
		})
	}
}

// TestFollowLogFormat: the gate's log takes OPA's format unless the section sets log.json.
func TestFollowLogFormat(t *testing.T) {
	facts := specFactsFile(t)
	for _, tt := range []struct {
		name    string
		section string
		opaJSON bool
		want    bool
	}{
		{name: "OPA json", section: `{"facts": "` + facts + `"}`, opaJSON: true, want: true},
		{name: "OPA text", section: `{"facts": "` + facts + `"}`},
		{name: "section json, OPA text", section: `{"facts": "` + facts + `", "log": {"json": true}}`, want: true},
		{name: "section text, OPA json", section: `{"facts": "` + facts + `", "log": {"json": false}}`, opaJSON: true},
		{name: "section level only, OPA json", section: `{"facts": "` + facts + `", "log": {"level": "debug"}}`, opaJSON: true, want: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseConfig([]byte(tt.section), false)
			require.NoError(t, err)
			cfg.FollowLogFormat(tt.opaJSON)
			assert.Equal(t, tt.want, cfg.Log.JSON)
		})
	}
}

// TestParseConfigNamesFieldsBelowSection: every problem of the section names its field below
// plugins.authz, a value refused at several fields names each of them there, and a problem of
// the section as a whole follows "plugins.authz: ".
func TestParseConfigNamesFieldsBelowSection(t *testing.T) {
	facts := specFactsFile(t)
	for _, tt := range []struct {
		name string
		raw  string
		want string
	}{
		{name: "a value refused at two fields of one line", raw: `{"facts": "` + facts + `", "evalTimeout": 5, "configCheckTimeout": 5}`,
			want: "plugins.authz.evalTimeout or plugins.authz.configCheckTimeout (line 1): cannot unmarshal !!int `5` into time.Duration"},
		{name: "a second YAML document", raw: "facts: " + facts + "\n---\naddr: 127.0.0.1:0\n",
			want: "plugins.authz: more than one YAML document: write one mapping"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tt.raw), false)
			require.Error(t, err)
			for line := range strings.SplitSeq(err.Error(), "\n") {
				assert.Equal(t, tt.want, line)
			}
		})
	}
}

// TestParseConfigNamesThePluginPathBelowSection: a plugin path that cannot be made absolute
// (the working directory is gone) is named below plugins.authz.
func TestParseConfigNamesThePluginPathBelowSection(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gone")
	require.NoError(t, os.Mkdir(dir, 0o700))
	t.Chdir(dir)
	require.NoError(t, os.Remove(dir))
	_, err := parseConfig([]byte(`{"plugins": [{"id": "x", "path": "drivers/x", "sha256": "`+strings.Repeat("0", 64)+`"}]}`), true)
	require.Error(t, err)
	assert.Regexp(t, `^plugins\.authz\.plugins\[0\]\.path: \S`, err.Error())
}
