package snapshot

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
