package docs_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/testutil"
)

// markedSection returns the lines of drivers.md after the marker `<!-- plugins-status: NAME -->`
// up to the first blank line after the block or table that follows it.
func markedSection(t testing.TB, doc, name string) string {
	t.Helper()
	marker := "<!-- plugins-status: " + name + " -->\n"
	i := strings.Index(doc, marker)
	require.GreaterOrEqual(t, i, 0, "docs/drivers.md lost its %q marker", name)
	rest := doc[i+len(marker):]
	if end := strings.Index(rest, "\n\n"); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

// tableFirstColumn returns the back-quoted names of the first column of a Markdown table's
// rows (not its header).
func tableFirstColumn(table string) []string {
	var names []string
	for i, row := range strings.Split(table, "\n") {
		cells := strings.Split(row, "|")
		if i < 2 || len(cells) < 3 {
			continue // the header and the separator
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[1], -1) {
			names = append(names, m[1])
		}
	}
	return names
}

// pluginFailureCodes are the codes internal/coded defines for a plugin's last failure: the
// string constants of its const block documented "Codes of a plugin's last failure".
func pluginFailureCodes(t testing.TB) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "internal", "coded", "codes.go"), nil, parser.ParseComments)
	require.NoError(t, err)
	var codes []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST || g.Doc == nil || !strings.HasPrefix(g.Doc.Text(), "Codes of a plugin's last failure") {
			continue
		}
		for _, spec := range g.Specs {
			for _, v := range spec.(*ast.ValueSpec).Values {
				lit, ok := v.(*ast.BasicLit)
				require.True(t, ok && lit.Kind == token.STRING, "a plugin failure code is a string literal")
				s, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				codes = append(codes, s)
			}
		}
	}
	require.NotEmpty(t, codes, "internal/coded/codes.go lost its block of plugin failure codes")
	slices.Sort(codes)
	return codes
}

func keysOf(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestPluginStatusDocumentedAsServed compares docs/drivers.md "Status and errors" with what
// GET /v1/plugins of a running `authz serve` answers, with one plugin ready and one refused at
// start (its pin is not its binary's): the example's fields and the fields table are the
// answer's fields, every lastError is a documented code (never a text), and the table of codes
// lists exactly the codes internal/coded defines for a plugin's failure.
func TestPluginStatusDocumentedAsServed(t *testing.T) {
	b, err := os.ReadFile("drivers.md")
	require.NoError(t, err)
	doc := string(b)

	var documented struct {
		Plugins []map[string]any `json:"plugins"`
	}
	example := markedSection(t, doc, "example")
	example = strings.TrimSuffix(strings.TrimPrefix(example, "```json\n"), "\n```")
	require.NoError(t, json.Unmarshal([]byte(example), &documented), "the documented answer is JSON:\n%s", example)
	require.Len(t, documented.Plugins, 2)
	fields := tableFirstColumn(markedSection(t, doc, "fields"))
	slices.Sort(fields)
	codes := tableFirstColumn(markedSection(t, doc, "codes"))
	slices.Sort(codes)
	assert.Equal(t, pluginFailureCodes(t), codes, "the table of lastError codes lists exactly the plugin failure codes of internal/coded")
	assert.Equal(t, []string{pluginhost.StatusInstalled, pluginhost.StatusReady, pluginhost.StatusDisabled, pluginhost.StatusError},
		tableFirstColumn(markedSection(t, doc, "statuses")), "the statuses, in the documented order")

	// A running host: the example driver, and the same binary under a pin that is not its own.
	authz := authzBinary(t)
	cfg := testutil.WriteFile(t, t.TempDir(), "authz.yaml", `plugins:
  - id: example.sandbox
    path: "@self"
    key: example.sandbox
    args: [example-driver]
  - id: acme.daytona
    path: `+strconv.Quote(authz)+`
    sha256: `+strings.Repeat("0", 64)+`
    key: acme.daytona
    args: [example-driver]
`)
	srv, addr := startServe(t, authz, "--config", cfg, "--addr", "127.0.0.1:0")
	c := &http.Client{Timeout: 5 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	var served struct {
		Plugins []map[string]any `json:"plugins"`
	}
	require.Eventually(t, func() bool {
		status, body := testutil.GetJSON(t, c, "http://"+addr+"/v1/plugins")
		if status != http.StatusOK {
			return false
		}
		raw, err := json.Marshal(body)
		if err != nil || json.Unmarshal(raw, &served) != nil || len(served.Plugins) != 2 {
			return false
		}
		return served.Plugins[0]["status"] == pluginhost.StatusReady && served.Plugins[1]["status"] == pluginhost.StatusError
	}, 60*time.Second, 50*time.Millisecond, "the plugins never became ready and error; log:\n%s", srv.Stderr)

	for i, p := range served.Plugins {
		assert.Equal(t, keysOf(documented.Plugins[i]), keysOf(p), "the fields of plugin %v as documented", p["id"])
		assert.Equal(t, fields, keysOf(p), "the fields table names every field of the answer")
		code, ok := p["lastError"].(string)
		require.True(t, ok, "lastError is a string: %v", p["lastError"])
		assert.Regexp(t, `^[A-Z_]*$`, code, "lastError is a code, never the failure's text")
		if code != "" {
			assert.Contains(t, codes, code, "lastError %s is documented", code)
		}
	}
	assert.Equal(t, "", served.Plugins[0]["lastError"])
	assert.Equal(t, "PIN_MISMATCH", served.Plugins[1]["lastError"], "as the documented example shows for a binary that is not the pinned one")
	assert.Nil(t, served.Plugins[1]["worker"])

	worker, ok := served.Plugins[0]["worker"].(map[string]any)
	require.True(t, ok, "the ready plugin has a worker: %v", served.Plugins[0])
	docWorker := documented.Plugins[0]["worker"].(map[string]any)
	assert.Equal(t, keysOf(docWorker), keysOf(worker), "the worker's fields as documented")
	if cont, ok := worker["containment"].(map[string]any); ok {
		got := slices.DeleteFunc(keysOf(cont), func(k string) bool { return k == "missing" }) // only when something is missing
		assert.Equal(t, keysOf(docWorker["containment"].(map[string]any)), got, "the containment's fields as documented")
	}
	// The failure's text is the service log's, under the plugin's id, with the code.
	testutil.WaitLogged(t, srv.Stderr, regexp.MustCompile(`"@message":"plugin failed to start"[^\n]*"code":"(PIN_MISMATCH)"`), 10*time.Second)
	assert.Contains(t, srv.Stderr.String(), "sha256 mismatch for ", "the documented start of the logged text")
}
