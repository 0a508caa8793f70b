package snapshot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/require"
)

// largeBodies are requests of about 1 MiB whose size is in what the decoded request is made
// of: one long string, many short strings, many small objects, many empty arrays, many numbers,
// many keys of one object.
func largeBodies() map[string][]byte {
	const size = 1 << 20
	wrap := func(command string) []byte {
		return []byte(`{"operation": "openDuplexChannel", "environment": {"id": "env-1", "driver": "sandbox"}, "lease": {"id": "l", "metadata": {"driver": "sandbox"}}, "command": ` + command + `}`)
	}
	repeat := func(item string) string {
		n := size / (len(item) + 1)
		return "[" + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + "]"
	}
	var keys strings.Builder
	keys.WriteString("{")
	for i := 0; keys.Len() < size; i++ {
		if i > 0 {
			keys.WriteString(",")
		}
		fmt.Fprintf(&keys, `"k%d":0`, i)
	}
	keys.WriteString("}")
	return map[string][]byte{
		"long-strings":  wrap(repeat(`"` + strings.Repeat("x", 60000) + `"`)),
		"short-strings": wrap(repeat(`"ab"`)),
		"small-objects": wrap(repeat(`{"a":"b"}`)),
		"empty-arrays":  wrap(repeat(`[]`)),
		"numbers":       wrap(repeat(`12`)),
		"object-keys":   wrap(keys.String()),
		"empty-objects": wrap(repeat(`{}`)),
		// The costliest: a map of one member for every 7 bytes, by the fast decoder and, with a
		// key that is not ASCII, by encoding/json.
		"one-member-objects":           wrap(repeat(`{"":0}`)),
		"one-member-objects-non-ascii": wrap(repeat(`{"é":0}`)),
		"deep-nests":                   wrap(repeat(strings.Repeat("[", MaxRequestDepth-2) + strings.Repeat("]", MaxRequestDepth-2))),
	}
}

// BenchmarkDecodeLargeRequest: bytes allocated by ParseRequestBytes per byte of a 1 MiB body
// (B/op divided by the body's size is reported as alloc/body), for each shape of largeBodies.
func BenchmarkDecodeLargeRequest(b *testing.B) {
	for name, body := range largeBodies() {
		b.Run(name, func(b *testing.B) {
			if _, err := ParseRequestBytes(body); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := ParseRequestBytes(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDecodeCostWithinTheMemoryBudget: decoding a request allocates at most
// DecodedBytesPerBodyByte bytes per byte of its body, whatever its shape (the costliest: an
// array of one-member objects), the figure the service's memory bound counts for every body
// being decoded.
func TestDecodeCostWithinTheMemoryBudget(t *testing.T) {
	for name, body := range largeBodies() {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		req, err := ParseRequestBytes(body)
		runtime.ReadMemStats(&after)
		require.NoError(t, err, name)
		runtime.KeepAlive(req)
		perByte := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(body))
		t.Logf("%s: %.1f bytes allocated per byte of a %d-byte body", name, perByte, len(body))
		require.LessOrEqual(t, perByte, float64(DecodedBytesPerBodyByte), "%s: the memory bound counts %d bytes per byte of body", name, DecodedBytesPerBodyByte)
	}
}

func TestLargeBodiesParse(t *testing.T) {
	for name, body := range largeBodies() {
		_, err := ParseRequestBytes(bytes.Clone(body))
		if err != nil {
			t.Fatal(name, err)
		}
	}
}

// TestOnlyExponentsAreRewritten: ParseRequestBytes skips the bounds walk (which rewrites the
// numbers the policy engine cannot represent) for a document whose numbers have no exponent,
// so no such number may need rewriting, however long; and the fast decoder reports every
// number with an exponent.
func TestOnlyExponentsAreRewritten(t *testing.T) {
	r := rand.New(rand.NewPCG(28, 3))
	digits := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('0' + r.IntN(10))
		}
		if b[0] == '0' && n > 1 {
			b[0] = '1'
		}
		return string(b)
	}
	for range 2000 {
		n := digits(1 + r.IntN(400))
		if r.IntN(2) == 0 {
			n += "." + digits(1+r.IntN(400))
		}
		if r.IntN(2) == 0 {
			n = "-" + n
		}
		_, err := ast.NumberChecked(n)
		require.NoError(t, err, n)
		require.Equal(t, json.Number(n), boundNumber(json.Number(n)))
		_, st, ok := decodeFastStats([]byte(`[` + n + `]`))
		require.True(t, ok)
		require.False(t, st.exponents, n)
		_, st, ok = decodeFastStats([]byte(`[` + n + `e` + digits(1+r.IntN(6)) + `]`))
		require.True(t, ok)
		require.True(t, st.exponents, n)
	}
	// A number the engine cannot represent is still rewritten, next to plain ones.
	req, err := ParseRequestBytes([]byte(`{"command": [1, 2.5, 1e40000], "lease": {"n": 12}}`))
	require.NoError(t, err)
	require.Equal(t, []any{json.Number("1"), json.Number("2.5"), "1e40000"}, req.Command)
	req, err = ParseRequestBytes([]byte(`{"command": [1, 2.5], "lease": {"n": 12}}`))
	require.NoError(t, err)
	require.Equal(t, []any{json.Number("1"), json.Number("2.5")}, req.Command)
	require.Equal(t, json.Number("12"), req.Lease["n"])
}
