//go:build linux

package pluginhost

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testdrivers/hostile"
)

// TestDefaultDataLimitHoldsInsideTheDriver: a plugin without limits.dataBytes runs its driver
// with RLIMIT_DATA DefaultDataBytes.
func TestDefaultDataLimitHoldsInsideTheDriver(t *testing.T) {
	out := filepath.Join(sharedDir(t), "limits.json")
	h, rec := startHost(t, testConfig(t, hostilePlugin(t, "data", "limits", out)))
	waitStarted(t, h, rec)
	var res map[string]hostile.Outcome
	require.NoError(t, json.Unmarshal(waitFile(t, out), &res))
	limits := res[hostile.AttemptLimits]
	require.True(t, limits.OK, "%+v", limits)
	var line string
	for l := range strings.SplitSeq(limits.Detail, "\n") {
		if strings.HasPrefix(l, "Max data size") {
			line = l
		}
	}
	f := strings.Fields(strings.TrimPrefix(line, "Max data size"))
	require.Len(t, f, 3, "%q", limits.Detail)
	assert.Equal(t, strconv.Itoa(DefaultDataBytes), f[0], "soft")
	assert.Equal(t, strconv.Itoa(DefaultDataBytes), f[1], "hard")
}
