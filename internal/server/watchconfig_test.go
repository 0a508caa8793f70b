package server_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/authz-dev/authz/internal/server"
)

// TestWatchSettingsLiveUnderWatches: every watch setting is a key of watches:, and the old
// limits.maxWatch* keys are still read, for one release, with a WARN naming the new key.
func TestWatchSettingsLiveUnderWatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml, warn string
	}{
		{"watches", "watches:\n  max: 1\n  maxBytes: 1048576\n  maxPerCaller: 1\n  maxBytesPerCaller: 1048576\n", ""},
		{"deprecated limits", "limits:\n  maxWatches: 1\n", "limits.maxWatches is deprecated: write watches.max instead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			dec := yaml.NewDecoder(bytes.NewReader([]byte(tc.yaml)))
			dec.KnownFields(true)
			require.NoError(t, dec.Decode(&cfg))
			var logs lockedBuffer
			s, err := server.New(cfg, testEngine(t), newChangingFacts(t), server.Options{
				Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, s.Close()) })
			if tc.warn != "" {
				assert.Contains(t, logs.String(), tc.warn)
			} else {
				assert.NotContains(t, logs.String(), "deprecated")
			}
			url := startHTTP(t, s)
			resp, stream := openWatch(t, url, fixture(t, nil))
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "decision", stream.next(t).kind)
			over, _ := openWatch(t, url, fixture(t, nil))
			require.Equal(t, http.StatusServiceUnavailable, over.StatusCode, "the second watch passes the limit of 1")
			require.Equal(t, "WATCH_LIMIT", over.Header.Get("X-Authz-Error"))
		})
	}
	bad := testConfig()
	bad.Watch.MaxBytes = 0
	assert.ErrorContains(t, bad.Validate(), "watches.maxBytes")
	bad = testConfig()
	bad.Limits.MaxWatchBytes = -1
	assert.ErrorContains(t, bad.Validate(), "limits.maxWatchBytes", "a deprecated key is named as it is written")
}
