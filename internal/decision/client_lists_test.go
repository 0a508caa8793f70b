package decision

import (
	"github.com/authz-dev/authz/internal/api"

	"bytes"
	"flag"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

//go:generate go test -run ^TestTypeScriptClientCapabilityList$ -update-clients .

// updateClients rewrites the clients' capability lists from the Go list (go generate).
var updateClients = flag.Bool("update-clients", false, "rewrite the TypeScript client's CAPABILITY_KEYS from api.CapabilityKeys")

// typeScriptClient is the TypeScript client's source, which holds its list of capabilities.
const typeScriptClient = "../../clients/typescript/src/contract.ts"

// typeScriptCapabilityList matches the TypeScript client's CAPABILITY_KEYS declaration.
var typeScriptCapabilityList = regexp.MustCompile(`(?s)export const CAPABILITY_KEYS = \[\n.*?\] as const;`)

// typeScriptCapabilityKeys writes the CAPABILITY_KEYS declaration of the TypeScript client:
// keys, in order, one a line.
func typeScriptCapabilityKeys(keys []string) []byte {
	var b bytes.Buffer
	b.WriteString("export const CAPABILITY_KEYS = [\n")
	for _, k := range keys {
		b.WriteString("  " + strconv.Quote(k) + ",\n")
	}
	b.WriteString("] as const;")
	return b.Bytes()
}

// TestTypeScriptClientCapabilityList: the TypeScript client's CAPABILITY_KEYS are the Go list, in
// the contract's order, written as go generate writes them; a capability added on one side only
// fails here. With -update-clients (go generate ./internal/decision) it rewrites the list.
func TestTypeScriptClientCapabilityList(t *testing.T) {
	src, err := os.ReadFile(typeScriptClient)
	require.NoError(t, err)
	found := typeScriptCapabilityList.FindAllIndex(src, -1)
	require.Len(t, found, 1, "%s must declare CAPABILITY_KEYS exactly once, as a list of strings, one a line", typeScriptClient)
	want := typeScriptCapabilityKeys(api.CapabilityKeys)
	if *updateClients {
		out := append(append(append([]byte{}, src[:found[0][0]]...), want...), src[found[0][1]:]...)
		require.NoError(t, os.WriteFile(typeScriptClient, out, 0o644))
		return
	}
	assert.Equal(t, string(want), string(src[found[0][0]:found[0][1]]),
		"the TypeScript client's CAPABILITY_KEYS differ from api.CapabilityKeys: run go generate ./internal/decision")
}
