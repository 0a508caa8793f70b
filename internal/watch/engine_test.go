package watch

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
)

// denyAll is a policy that denies every request with the policy's own reason.
const denyAll = `package authz

decision := {
	"allow": false,
	"code": "DUPLEX_CHANNEL_CAPABILITY_DENIED",
	"message": "Sandbox lease does not grant the duplex command stream capability.",
	"reasons": ["capability_not_declared"],
	"capabilities": {k: false | some k in ["reusableLeases", "nativeSyncIn", "nativeSyncOut", "persistentProcessSessions", "independentControlCommands", "incrementalSessionOutput", "concurrentSyncOperations", "duplexCommandStream", "runnerWebSocketIngress"]},
}
`

// TestDistinctWatchesOnTheEngine: 2,000 watches of distinct requests (AUTHZ_WATCHES=10000 for
// the figure of BENCHMARKS.md; 500 with -short), each
// re-decided by the real engine with its decision cache off (so that each is an evaluation of
// its own, as requests of distinct footprints are) on the hub's defaults (one second, every
// core). A policy activation that changes no decision revokes none of them; one that takes the
// capability away revokes every one with the policy's reason, none with evaluation_failed. The
// time the second takes, to the last revoke, is logged (measured, not asserted: this machine is
// shared).
func TestDistinctWatchesOnTheEngine(t *testing.T) {
	t.Parallel()
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("AUTHZ_WATCHES")); err == nil && v > 0 {
		n = v
	} else if testing.Short() {
		n = 500
	}
	eng := decisiontest.EmbeddedEngine(t, decision.Options{Cache: decision.CacheOptions{Disabled: true}})
	f := specexamples.NewFixture()
	reqJSON, factsJSON := f.JSON()
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	require.NoError(t, err)
	h := New(eng, facts, Options{MaxBytes: 64 << 20, MaxWatches: max(n, 10000)})
	defer h.Close()
	defer eng.OnPolicyChange(h.PolicyChanged)()

	watches := make([]*Watch, n)
	for i := range watches {
		b := bytes.Replace(reqJSON, []byte(`"lease-1"`), []byte(fmt.Sprintf(`"lease-%d"`, i)), 1)
		req, err := snapshot.ParseRequestBytes(b)
		require.NoError(t, err)
		first, w, err := h.Watch(t.Context(), req)
		require.NoError(t, err)
		require.True(t, first.Doc.Allow)
		watches[i] = w
	}
	require.Equal(t, n, h.Open())
	h.mu.Lock()
	require.Len(t, h.groups, n, "every request is distinct")
	h.mu.Unlock()

	// The same policy again: every request is re-decided, and every decision is unchanged.
	p, err := decision.EmbeddedPolicy()
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, eng.Activate(t.Context(), p))
	require.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, g := range h.groups {
			if g.pass == 0 {
				return false
			}
		}
		return true
	}, time.Minute, 10*time.Millisecond, "every request re-decided")
	t.Logf("%d distinct watches: a revision that changes no decision re-decided in %v", n, time.Since(start))
	require.Equal(t, n, h.Open(), "no watch revoked")
	for _, w := range watches {
		requireNothing(t, w)
	}

	// A policy that takes the capability away: every watch revoked with its reason.
	mod, err := ast.ParseModule("deny.rego", denyAll)
	require.NoError(t, err)
	deny, err := decision.CompileModules(map[string]*ast.Module{"deny.rego": mod}, nil, "deny")
	require.NoError(t, err)
	start = time.Now()
	require.NoError(t, eng.Activate(t.Context(), deny))
	var last time.Duration
	for _, w := range watches {
		ev := next(t, w)
		last = max(last, time.Since(start))
		require.Equal(t, KindRevoke, ev.Kind)
		require.Empty(t, ev.EvalCode)
		require.Equal(t, []string{"capability_not_declared"}, ev.Doc.Reasons)
	}
	t.Logf("%d distinct watches: a revision that takes the capability away revoked the last after %v", n, last)
	require.Equal(t, 0, h.Open())
}
