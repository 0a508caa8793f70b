package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// runCLI runs the program in-process and returns its exit code, stdout and stderr.
func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), args, strings.NewReader(stdin), &stdout, &stderr)
	code := 0
	if err != nil {
		code = 1
		if ee := (*exitError)(nil); errors.As(err, &ee) {
			code = ee.code
		}
		if msg := err.Error(); msg != "" {
			stderr.WriteString("authz: " + msg + "\n") // as main prints it
		}
	}
	return code, stdout.String(), stderr.String()
}

// TestDecideSpecExamples answers every docs/contract.md, "Worked examples" example through the CLI.
func TestDecideSpecExamples(t *testing.T) {
	for _, ex := range specexamples.Rows() {
		t.Run(ex.Name, func(t *testing.T) {
			reqJSON, factsJSON := ex.Fixture().JSON()
			factsPath := testutil.WriteFile(t, t.TempDir(), "facts.json", string(factsJSON))
			code, out, errOut := runCLI(t, string(reqJSON), "decide", "--facts", factsPath)
			require.Equal(t, 0, code, errOut)
			assert.Empty(t, errOut)
			var doc decision.Document
			require.NoError(t, json.Unmarshal([]byte(out), &doc))
			assert.Equal(t, ex.Allow, doc.Allow)
			assert.Equal(t, ex.Code, doc.Code)
			assert.Equal(t, ex.Message, doc.Message)
			for k, v := range ex.Also {
				assert.Equal(t, v, doc.Capabilities.Get(k), k)
			}
			assert.NotEmpty(t, doc.DecisionID)
			assert.NotEmpty(t, doc.Revision)
		})
	}
}

func TestDecideRequestFromFile(t *testing.T) {
	reqJSON, factsJSON := specexamples.NewFixture().JSON()
	code, out, errOut := runCLI(t, "not read", "decide", "--facts", testutil.WriteFile(t, t.TempDir(), "f.json", string(factsJSON)),
		"--request", testutil.WriteFile(t, t.TempDir(), "r.json", string(reqJSON)))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"allow": true`)
}

// TestDecideBadInput: exit 2, exactly one line on stderr, nothing on stdout.
func TestDecideBadInput(t *testing.T) {
	reqJSON, factsJSON := specexamples.NewFixture().JSON()
	good := testutil.WriteFile(t, t.TempDir(), "facts.json", string(factsJSON))
	bad := testutil.WriteFile(t, t.TempDir(), "bad.json", string([]byte(`{"plugins": null}`)))
	tests := []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{name: "not JSON", stdin: `{`, args: []string{"--facts", good}, want: "bad request"},
		{name: "not an object", stdin: `[1]`, args: []string{"--facts", good}, want: "must be a JSON object"},
		{name: "lease null", stdin: `{"lease": null}`, args: []string{"--facts", good}, want: "lease must be an object"},
		{name: "unknown operation", stdin: `{"operation": "x"}`, args: []string{"--facts", good}, want: "operation must be"},
		{name: "empty stdin", stdin: ``, args: []string{"--facts", good}, want: "empty document"},
		{name: "bad facts", stdin: string(reqJSON), args: []string{"--facts", bad}, want: "facts.plugins must be an array"},
		{name: "missing facts file", stdin: string(reqJSON), args: []string{"--facts", good + ".nope"}, want: "bad facts"},
		{name: "both bad: request reported", stdin: `[]`, args: []string{"--facts", bad}, want: "bad request"},
		{name: "no --facts", stdin: string(reqJSON), args: nil, want: "--facts FILE is required"},
		{name: "stray argument", stdin: string(reqJSON), args: []string{"--facts", good, "extra"}, want: "unexpected argument"},
		{name: "missing request file", stdin: ``, args: []string{"--facts", good, "--request", good + ".nope"}, want: "bad request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tt.stdin, append([]string{"decide"}, tt.args...)...)
			assert.Equal(t, 2, code)
			assert.Empty(t, out)
			assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line on stderr: %q", errOut)
			assert.Contains(t, errOut, tt.want)
		})
	}
}

// TestDecidePrintInputReproduces: the printed input, evaluated on its own, gives the decision.
func TestDecidePrintInputReproduces(t *testing.T) {
	eng := decisiontest.EmbeddedEngine(t, decision.Options{})
	for _, ex := range specexamples.Rows() {
		t.Run(ex.Name, func(t *testing.T) {
			reqJSON, factsJSON := ex.Fixture().JSON()
			factsPath := testutil.WriteFile(t, t.TempDir(), "facts.json", string(factsJSON))
			code, out, errOut := runCLI(t, string(reqJSON), "decide", "--facts", factsPath, "--print-input")
			require.Equal(t, 0, code, errOut)
			var in map[string]any
			dec := json.NewDecoder(strings.NewReader(out))
			dec.UseNumber()
			require.NoError(t, dec.Decode(&in))
			assert.Contains(t, in, "resolved")
			doc, err := eng.Evaluate(t.Context(), in)
			require.NoError(t, err)
			assert.Equal(t, ex.Allow, doc.Allow)
			assert.Equal(t, ex.Code, doc.Code)
		})
	}
}

func TestDecideExplain(t *testing.T) {
	ex := specexamples.Rows()[12] // built-in fake: two reasons
	reqJSON, factsJSON := ex.Fixture().JSON()
	code, out, errOut := runCLI(t, string(reqJSON), "decide", "--explain", "--facts", testutil.WriteFile(t, t.TempDir(), "f.json", string(factsJSON)))
	require.Equal(t, 0, code)
	assert.Contains(t, out, `"allow": false`)
	assert.Contains(t, errOut, "DENY openDuplexChannel: DUPLEX_CHANNEL_CAPABILITY_DENIED")
	assert.Contains(t, errOut, "because method_not_verified:")
	assert.Contains(t, errOut, "because capability_not_declared:")
	assert.Contains(t, errOut, "capabilities: persistentProcessSessions, independentControlCommands")
}

func TestUsageAndUnknownCommand(t *testing.T) {
	code, _, errOut := runCLI(t, "")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "Usage:")
	code, _, errOut = runCLI(t, "", "frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown command "frobnicate"`)
	code, out, _ := runCLI(t, "", "version")
	assert.Equal(t, 0, code)
	assert.True(t, strings.HasPrefix(out, "authz "))
}
