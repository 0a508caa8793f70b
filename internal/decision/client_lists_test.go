package decision

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTypeScriptClientCapabilityList: the TypeScript client's CAPABILITY_KEYS are the Go list,
// in the contract's order; a capability added on one side only fails here.
func TestTypeScriptClientCapabilityList(t *testing.T) {
	src, err := os.ReadFile("../../clients/typescript/src/index.ts")
	require.NoError(t, err)
	block := regexp.MustCompile(`(?s)export const CAPABILITY_KEYS = \[(.*?)\] as const;`).FindSubmatch(src)
	require.NotNil(t, block, "clients/typescript/src/index.ts has no CAPABILITY_KEYS list")
	var ts []string
	for _, m := range regexp.MustCompile(`"([A-Za-z]+)"`).FindAllSubmatch(block[1], -1) {
		ts = append(ts, string(m[1]))
	}
	assert.Equal(t, CapabilityKeys[:], ts)
}
