package snapshot

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/specexamples"
)

// TestParseRequestBytesOwnsItsMemory: the request shares no memory with the body it was parsed
// from, so a caller may reuse the body (a server's buffer) at once.
func TestParseRequestBytesOwnsItsMemory(t *testing.T) {
	body := []byte(`{"operation":"openDuplexChannel","environment":{"driver":"sandbox","config":{"provider":"daytona","n":7}},
		"lease":{"leasePolicy":"reuse_by_environment","metadata":{"pluginId":"p","esc":"a\tb"}},"command":["sh","-c","echo hi"]}`)
	want, ok := stdDecode(t, body)
	require.True(t, ok)
	req, err := ParseRequestBytes(body)
	require.NoError(t, err)
	for i := range body {
		body[i] = 'x'
	}
	got := map[string]any{"operation": req.Operation, "environment": req.Environment, "lease": req.Lease, "command": req.Command}
	assert.Equal(t, want, got)
}

// TestParseRequestBytesIndependent: requests parsed one after the other, and at the same time
// (run with -race), are each what encoding/json decodes, however the decoder reuses its
// scratch space between documents; a refused document leaves nothing behind for the next.
func TestParseRequestBytesIndependent(t *testing.T) {
	bodies := make([][]byte, 0, 40)
	for i := range 40 {
		list := func(n int) []byte { return bytes.TrimSuffix(bytes.Repeat([]byte(`"x",`), n), []byte(",")) }
		bodies = append(bodies, fmt.Appendf(nil, `{"environment":{"id":"env-%d","config":{"k%d":[%d,{"a":"v%d"},[]],"e":{}}},
			"lease":{"id":"l-%d","metadata":{"pluginId":"p%d","list":[%s]}},"command":[%s]}`,
			i, i, i, i, i, i, list(i%9), list(i)))
	}
	check := func(t *testing.T, body []byte) bool { // safe to call from any goroutine
		t.Helper()
		want, err := decodeOne(bytes.NewReader(body))
		if !assert.NoError(t, err, "%s", body) {
			return false
		}
		req, err := ParseRequestBytes(body)
		if !assert.NoError(t, err, "%s", body) {
			return false
		}
		got := map[string]any{"environment": req.Environment, "lease": req.Lease, "command": req.Command}
		return assert.Equal(t, want, got, "%s", body)
	}
	t.Run("in turn", func(t *testing.T) {
		kept := make([]*Request, len(bodies))
		for i, b := range bodies {
			require.True(t, check(t, b))
			// A malformed document between two good ones.
			_, err := ParseRequestBytes(b[:len(b)/2])
			require.Error(t, err)
			kept[i], err = ParseRequestBytes(b)
			require.NoError(t, err)
		}
		// Every request is still what its body says after all the parses that followed it.
		for i, req := range kept {
			want, err := decodeOne(bytes.NewReader(bodies[i]))
			require.NoError(t, err)
			assert.Equal(t, want, map[string]any{"environment": req.Environment, "lease": req.Lease, "command": req.Command}, "request %d", i)
		}
	})
	t.Run("at once", func(t *testing.T) {
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range bodies {
					check(t, bodies[(i+g*7)%len(bodies)])
				}
			})
		}
		wg.Wait()
	})
}

// FuzzParseRequestBytes: ParseRequestBytes (the fast decoder, which may build no map of the
// top-level object and skip the bounds walk) answers every body as the plain path does
// (encoding/json, the bounds walk, the checks of a decoded value): the same request, or a bad
// request with the same message. Bound messages are compared by code only: with more than one
// violation, which one a map walk meets first is not fixed.
func FuzzParseRequestBytes(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `null`, `1`, `"x"`, `{"input": {}}`, `{"operation": "getRunnerIngressEndpoint"}`, `{"operation": "x"}`,
		`{"lease": 1, "lease": {}}`, `{"lease": {}, "lease": 1}`, `{"lease": "x", "lease": {}}`, `{"lease": {}, "lease": "x"}`,
		`{"operation": "x", "operation": "openDuplexChannel"}`, `{"environment": true, "environment": {}}`,
		`{"command": 1, "command": ["a"]}`, `{"command": "a", "command": ["b"]}`, `{"lease": {"metadata": null}}`, `{"lease": {"metadata": {"a": "b"}, "metadata": 2}}`,
		`{"environment": {"config": {"provider": "p"}}, "environment": {"driver": "sandbox"}}`, `{"x": 1e40000, "lease": {}}`,
		`{"command": [1e40000, "a\tb"], "lease": {"metadata": {"pluginId": "p"}}}`, `{"a": "é", "lease": []}`,
		`{"command": ` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, `{"k": {}} `, ` {"lease": {}} x`,
	} {
		f.Add([]byte(s))
	}
	reqJSON, _ := specexamples.NewFixture().JSON()
	f.Add(reqJSON)
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gotErr := ParseRequestBytes(b)
		var want *Request
		doc, wantErr := decodeOne(bytes.NewReader(b))
		if wantErr != nil {
			wantErr = badRequest("request is not valid JSON: %v", wantErr)
		} else {
			want, wantErr = requestFromValue(doc)
		}
		if wantErr != nil {
			require.Error(t, gotErr, "the plain path refuses %q: %v", b, wantErr)
			require.Equal(t, coded.BadRequest, coded.CodeOf(gotErr))
			if !strings.Contains(wantErr.Error(), "the limit") {
				require.Equal(t, wantErr.Error(), gotErr.Error(), "%q", b)
			}
			return
		}
		require.NoError(t, gotErr, "the plain path accepts %q", b)
		require.Equal(t, want, got, "%q", b)
	})
}
