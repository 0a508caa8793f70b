package snapshot

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
)

// stdDecode decodes b as ParseRequest did before decodeFast: encoding/json with UseNumber, one
// value, nothing after it.
func stdDecode(tb testing.TB, b []byte) (any, bool) {
	tb.Helper()
	v, err := decodeOne(bytes.NewReader(b))
	return v, err == nil
}

// requireSameAsStd: whenever decodeFast accepts b, encoding/json accepts it too and decodes the
// same value (types included: json.Number, []any, map[string]any).
//
// It also checks the fastStats decodeFastStats reports against a walk of the decoded value:
// ParseRequestBytes skips the bounds walk on their word, so they must never understate it (they
// may overstate it: a value a later duplicate key replaced was measured too).
func requireSameAsStd(tb testing.TB, b []byte) (fastOK bool) {
	tb.Helper()
	fast, st, ok := decodeFastStats(b)
	std, stdOK := stdDecode(tb, b)
	if !ok {
		return false
	}
	require.True(tb, stdOK, "decodeFast accepts what encoding/json refuses: %q", b)
	require.Equal(tb, std, fast, "decodeFast and encoding/json disagree on %q", b)
	var want fastStats
	walkStats(std, 0, &want)
	require.GreaterOrEqual(tb, st.maxDepth, want.maxDepth, "decodeFastStats understates the depth of %q", b)
	require.GreaterOrEqual(tb, st.maxString, want.maxString, "decodeFastStats understates the strings of %q", b)
	if want.numbers {
		require.True(tb, st.numbers, "decodeFastStats misses the numbers of %q", b)
	}
	return true
}

// walkStats measures v, at nesting level depth, into st.
func walkStats(v any, depth int, st *fastStats) {
	switch t := v.(type) {
	case map[string]any:
		st.maxDepth = max(st.maxDepth, depth+1)
		for k, e := range t {
			st.maxString = max(st.maxString, len(k))
			walkStats(e, depth+1, st)
		}
	case []any:
		st.maxDepth = max(st.maxDepth, depth+1)
		for _, e := range t {
			walkStats(e, depth+1, st)
		}
	case string:
		st.maxString = max(st.maxString, len(t))
	case json.Number:
		st.numbers = true
	}
}

func TestDecodeFast(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		fastOK bool // false: left to encoding/json
	}{
		{name: "request", body: `{"operation": "openDuplexChannel", "environment": {"driver": "sandbox", "config": {"provider": "daytona"}},
			"lease": {"leasePolicy": "ephemeral", "metadata": {"sandboxProviderPlugin": true, "pluginId": "p"}}, "command": ["sh", "-c", "echo hi"]}`, fastOK: true},
		{name: "scalars", body: ` [true, false, null, 0, -0, 1.5, -12e+3, 1E-2, 10, "", "a b"] `, fastOK: true},
		{name: "empty containers", body: `{"a": {}, "b": [], "c": [[], {}]}`, fastOK: true},
		{name: "duplicate keys, last wins", body: `{"a": 1, "a": 2, "b": {"x": 1}, "b": "y"}`, fastOK: true},
		{name: "short escapes", body: `{"s\"k": "a\"b\\c\/d\b\f\n\r\t"}`, fastOK: true},
		{name: "number beyond float64", body: `{"n": 1e40000}`, fastOK: true},
		{name: "whitespace everywhere", body: "\t{\r\n\"a\" :\n[ 1 , 2 ] }\n", fastOK: true},
		{name: "unicode escape", body: `{"a": "\u00e9"}`},
		{name: "lone surrogate", body: `{"a": "\ud800"}`},
		{name: "utf-8", body: `{"a": "é"}`},
		{name: "invalid utf-8", body: "{\"a\": \"\xff\"}"},
		{name: "control character", body: "{\"a\": \"\x01\"}"},
		{name: "delete character", body: "{\"a\": \"\x7f\"}"},
		{name: "invalid escape", body: `{"a": "\x"}`},
		{name: "trailing data", body: `{} {}`},
		{name: "trailing comma", body: `{"a": 1,}`},
		{name: "leading zero", body: `[01]`},
		{name: "bare minus", body: `[-]`},
		{name: "dot without digits", body: `[1.]`},
		{name: "exponent without digits", body: `[1e]`},
		{name: "plus sign", body: `[+1]`},
		{name: "truncated", body: `{"a": [1, 2`},
		{name: "truncated literal", body: `[tru]`},
		{name: "unquoted key", body: `{a: 1}`},
		{name: "missing colon", body: `{"a" 1}`},
		{name: "empty", body: ``},
		{name: "only space", body: `   `},
		{name: "too deep for encoding/json", body: strings.Repeat("[", 10001) + strings.Repeat("]", 10001)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := requireSameAsStd(t, []byte(tt.body))
			assert.Equal(t, tt.fastOK, got, "decodeFast handled it: %v", got)
		})
	}
}

// TestParseRequestErrorsAreEncodingJSONs: a request decodeFast leaves alone gets the error
// encoding/json words.
func TestParseRequestErrorsAreEncodingJSONs(t *testing.T) {
	for _, body := range []string{`{"operation":`, `{} {}`, `[01]`, "{\"a\": \"\x01\"}"} {
		_, err := ParseRequest(strings.NewReader(body))
		require.Error(t, err, body)
		_, stdErr := decodeOne(strings.NewReader(body))
		require.Error(t, stdErr, body)
		assert.Equal(t, coded.BadRequest, coded.CodeOf(err), body)
		assert.Equal(t, "request is not valid JSON: "+stdErr.Error(), err.Error(), body)
	}
}

// FuzzDecodeFast: decodeFast never panics, and never accepts or decodes anything differently
// from encoding/json.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range []string{`{"a": [1, "b", {"c": null}]}`, `"x\ny"`, `-1.5e-3`, `{"a": 1, "a": {}}`, `[true,false]`, `{"\u0041": 1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if requireSameAsStd(t, b) {
			require.True(t, json.Valid(b), "decodeFast accepts invalid JSON: %q", b)
		}
	})
}

// BenchmarkDecodeRequest: the fixture's request decoded by decodeFast, parsed whole by
// ParseRequestBytes (decodeFast and the request's checks), and decoded by encoding/json (as
// ParseRequest decoded every request before decodeFast).
func BenchmarkDecodeRequest(b *testing.B) {
	body := []byte(`{"operation": "openDuplexChannel", "environment": {"id": "env-1", "driver": "sandbox", "config": {"provider": "daytona"}},
		"lease": {"id": "lease-1", "companyId": "company-1", "leasePolicy": "ephemeral", "providerLeaseId": "provider-lease-1",
		"metadata": {"driver": "sandbox", "sandboxProviderPlugin": true, "pluginId": "test.plugin", "provider": "daytona"}},
		"command": ["sh", "-c", "echo hi"]}`)
	b.Run("decodeFast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := decodeFast(body); !ok {
				b.Fatal("not decoded")
			}
		}
	})
	b.Run("ParseRequestBytes", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseRequestBytes(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeOne(bytes.NewReader(body)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
