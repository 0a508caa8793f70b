//go:build unix

package pluginhost

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
)

// BenchmarkPluginStart measures one plugin's start: pin check, process start, go-plugin
// handshake with AutoMTLS, Describe and SupportedMethods; and the Close that follows. The driver
// is the test driver (driverBinary), built without the race detector.
func BenchmarkPluginStart(b *testing.B) {
	cfg := testConfig(b, driverPlugin(b, "bench"))
	cfg.Logger = hclog.NewNullLogger()
	b.ReportAllocs()
	for b.Loop() {
		h, err := New(cfg)
		require.NoError(b, err)
		require.NoError(b, h.Start(b.Context()))
		ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
		err = h.WaitStarted(ctx)
		cancel()
		require.NoError(b, err)
		require.NoError(b, h.Close())
	}
}
