package server_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/server"
)

// TestNewMasker masks as the decision log does: the value at the pointer, its copies in the
// input and in the message, and leaves its arguments alone.
func TestNewMasker(t *testing.T) {
	_, err := server.NewMasker([]string{"/result/allow"})
	require.Error(t, err, "a pointer outside /input is refused")

	mask, err := server.NewMasker([]string{"/input/environment/config"})
	require.NoError(t, err)
	input := map[string]any{
		"environment": map[string]any{"config": map[string]any{"provider": "daytona"}},
		"resolved":    map[string]any{"providerKey": "daytona"},
	}
	doc := decision.Document{Code: "X", Message: `provider "daytona" is not usable`}
	gotIn, gotDoc := mask(input, doc)
	assert.Equal(t, map[string]any{
		"environment": map[string]any{"config": masked},
		"resolved":    map[string]any{"providerKey": masked},
	}, gotIn)
	assert.Equal(t, `provider "`+masked+`" is not usable`, gotDoc.Message)
	assert.Equal(t, "daytona", input["resolved"].(map[string]any)["providerKey"], "the input is not modified")
	assert.Contains(t, doc.Message, "daytona")
}
