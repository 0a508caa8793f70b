package policy

import (
	"crypto/rand"
	"encoding/base64"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/decision"
)

// TestDecisionLogBufferBoundedWhileCollectorDown logs 600 decisions, each with a 22 KB field
// that does not compress (about 6 MiB once compressed), while the collector is unreachable:
// OPA's decision-log buffer stays within its bound, so the live heap grows by about the bound,
// not by the size of the decisions. The bound is set to 1 MiB here, so that a few hundred
// decisions exceed it several times over; TestBoundOPA checks that an unset bound becomes
// DefaultDecisionLogBufferBytes.
func TestDecisionLogBufferBoundedWhileCollectorDown(t *testing.T) {
	const bound = 1 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there any more

	eng := decision.New(decision.Options{})
	src, err := New(Config{OPA: map[string]any{
		"services": map[string]any{"collector": map[string]any{"url": down}},
		"decision_logs": map[string]any{"service": "collector", "reporting": map[string]any{"min_delay_seconds": 300, "max_delay_seconds": 600,
			"buffer_size_limit_bytes": bound}},
	}}, eng, Options{})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	defer src.Close(t.Context())
	require.True(t, src.DecisionLogs())

	pool := make([]byte, 3<<20)
	_, _ = rand.Read(pool)
	text := base64.StdEncoding.EncodeToString(pool) // does not compress below 3/4
	const decisions, field = 600, 22 << 10

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range decisions {
		off := (i * 7919) % (len(text) - field)
		in := map[string]any{"operation": "openDuplexChannel", "lease": map[string]any{"metadata": map[string]any{"blob": text[off : off+field]}}}
		require.NoError(t, src.LogDecision(t.Context(), api.Decision{ID: "d", Path: "authz/decision", Timestamp: time.Now(),
			Input: in, Result: map[string]any{"allow": true}, Revision: eng.Revision()}))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d decisions of %d KiB logged with the collector down: live heap grew %d MiB (buffer bound %d MiB)",
		decisions, field>>10, growth>>20, bound>>20)
	assert.Less(t, growth, int64(bound+2<<20))
}
