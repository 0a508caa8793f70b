package decision

import (
	"context"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testutil"
)

// grantInput is an input the embedded policy grants (the contract's fixture F as the host assembles it).
func grantInput() snapshot.Input {
	return snapshot.Input{
		"operation":   "openDuplexChannel",
		"environment": map[string]any{},
		"lease":       map[string]any{"metadata": map[string]any{}},
		"resolved": map[string]any{"driver": "sandbox", "providerKey": "daytona", "pluginBacked": true,
			"pluginId": "test.plugin", "driverKey": ""},
		"facts": map[string]any{
			"plugin": map[string]any{"id": "test.plugin", "status": "ready", "manifest": map[string]any{
				"environmentDrivers": []any{map[string]any{"driverKey": "daytona", "kind": "sandbox_provider",
					"sandboxCapabilities": map[string]any{"duplexCommandStream": true}}}}},
			"worker": map[string]any{"generation": uint64(1), "supportedMethods": []any{"duplexChannelOpen"}},
		},
		"narrowing": map[string]any{"leasePolicyNotReusable": true, "nativeSyncUnavailable": false, "configResolutionFailed": false},
	}
}

func engineWith(t testing.TB, src string) *Engine {
	t.Helper()
	e := New(Options{})
	require.NoError(t, e.LoadModules(t.Context(), map[string]string{"p.rego": src}, "test"))
	return e
}

const allFalse = `{"reusableLeases": false, "nativeSyncIn": false, "nativeSyncOut": false,
	"persistentProcessSessions": false, "independentControlCommands": false,
	"incrementalSessionOutput": false, "concurrentSyncOperations": false,
	"duplexCommandStream": false, "runnerWebSocketIngress": false}`

func assertFailClosed(t testing.TB, doc Document, err error, code coded.Code, op string) {
	t.Helper()
	require.Error(t, err)
	assert.Equal(t, code, coded.CodeOf(err), "error: %v", err)
	assert.False(t, doc.Allow)
	want := FailedDocument(op)
	assert.Equal(t, want.Code, doc.Code)
	assert.Equal(t, want.Message, doc.Message)
	assert.Equal(t, []string{reasonEvaluationFailed}, doc.Reasons)
	assert.Equal(t, api.Capabilities{}, doc.Capabilities)
	assert.NotEmpty(t, doc.DecisionID)
}

// TestEmbeddedPolicyGrantsFixture: New has no policy until Activate(EmbeddedPolicy()) makes the
// embedded policy current, under its content revision.
func TestEmbeddedPolicyGrantsFixture(t *testing.T) {
	p, err := EmbeddedPolicy()
	require.NoError(t, err)
	e := New(Options{})
	require.Empty(t, e.Revision())
	require.NoError(t, e.Activate(t.Context(), p))
	require.Equal(t, p.Revision(), e.Revision())
	doc, err := e.Evaluate(t.Context(), grantInput())
	require.NoError(t, err)
	assert.True(t, doc.Allow)
	assert.True(t, doc.Capabilities.DuplexCommandStream)
	assert.Regexp(t, `^sha256:[0-9a-f]{16}$`, doc.Revision)
}

// TestResultsReadFailClosed: every result that is not exactly one well-formed document denies,
// each with its own code, even where the policy "says" allow.
func TestResultsReadFailClosed(t *testing.T) {
	tests := []struct {
		name   string
		policy string
		code   coded.Code
	}{
		{name: "undefined", code: coded.EvalUndefined, policy: `package authz
decision := {"allow": true} if input.nope`},
		{name: "not an object", code: coded.EvalBadResult, policy: `package authz
decision := true`},
		{name: "allow is a string", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": "true", "code": "", "message": "", "reasons": [], "capabilities": ` + allFalse + `}`},
		{name: "allow missing", code: coded.EvalBadResult, policy: `package authz
decision := {"code": "", "message": "", "reasons": [], "capabilities": ` + allFalse + `}`},
		{name: "capability missing", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": true, "code": "", "message": "", "reasons": [], "capabilities": {"duplexCommandStream": true}}`},
		{name: "capability not boolean", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": true, "code": "", "message": "", "reasons": [], "capabilities": object.union(` + allFalse + `, {"nativeSyncIn": 1})}`},
		{name: "reason not a string", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": false, "code": "X", "message": "", "reasons": [1], "capabilities": ` + allFalse + `}`},
		{name: "grant with a code", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": true, "code": "X", "message": "", "reasons": [], "capabilities": ` + allFalse + `}`},
		{name: "deny without a code", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": false, "code": "", "message": "", "reasons": [], "capabilities": ` + allFalse + `}`},
		{name: "code not a string", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": false, "code": 1, "message": "", "reasons": [], "capabilities": ` + allFalse + `}`},
		{name: "message not a string", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": false, "code": "X", "message": null, "reasons": [], "capabilities": ` + allFalse + `}`},
		{name: "reasons not an array", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": false, "code": "X", "message": "", "reasons": "r", "capabilities": ` + allFalse + `}`},
		{name: "capabilities not an object", code: coded.EvalBadResult, policy: `package authz
decision := {"allow": false, "code": "X", "message": "", "reasons": [], "capabilities": []}`},
		{name: "eval error (conflict)", code: coded.EvalError, policy: `package authz
decision := {"allow": true} if input.operation
decision := {"allow": false} if input.operation`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := engineWith(t, tt.policy)
			for _, op := range []string{snapshot.OpOpenDuplexChannel, snapshot.OpGetRunnerIngressEndpoint} {
				in := grantInput()
				in["operation"] = op
				doc, err := e.Evaluate(t.Context(), in)
				assertFailClosed(t, doc, err, tt.code, op)
				assert.Equal(t, "test", doc.Revision)
			}
		})
	}
}

func TestSeveralResultsDeny(t *testing.T) {
	_, err := readResultSet(rego.ResultSet{{}, {}})
	assert.Equal(t, coded.EvalMultipleResults, coded.CodeOf(err))
	_, err = readResultSet(rego.ResultSet{{Expressions: []*rego.ExpressionValue{{}, {}}}})
	assert.Equal(t, coded.EvalBadResult, coded.CodeOf(err))
	_, err = readResultSet(nil)
	assert.Equal(t, coded.EvalUndefined, coded.CodeOf(err))
}

func TestNoPolicyDenies(t *testing.T) {
	doc, err := New(Options{}).Evaluate(t.Context(), grantInput())
	assertFailClosed(t, doc, err, coded.EvalNoPolicy, snapshot.OpOpenDuplexChannel)
	assert.Empty(t, doc.Revision)
}

func TestCompileErrorKeepsCurrentPolicy(t *testing.T) {
	e := embeddedEngine(t, Options{})
	rev := e.Revision()
	err := e.LoadModules(t.Context(), map[string]string{"bad.rego": "package authz\ndecision := "}, "")
	assert.Equal(t, coded.PolicyCompile, coded.CodeOf(err))
	assert.Equal(t, rev, e.Revision())
	doc, err := e.Evaluate(t.Context(), grantInput())
	require.NoError(t, err)
	assert.True(t, doc.Allow)
}

func TestContextEndsDeny(t *testing.T) {
	e := embeddedEngine(t, Options{})

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	doc, err := e.Evaluate(ctx, grantInput())
	assertFailClosed(t, doc, err, coded.EvalCanceled, snapshot.OpOpenDuplexChannel)

	ctx, cancel = context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	doc, err = e.Evaluate(ctx, grantInput())
	assertFailClosed(t, doc, err, coded.EvalTimeout, snapshot.OpOpenDuplexChannel)
}

// TestTimeoutDuringEvaluation: a policy that would grant after a long computation is cut off by
// the evaluation timeout and denies.
func TestTimeoutDuringEvaluation(t *testing.T) {
	e := New(Options{EvalTimeout: 20 * time.Millisecond})
	require.NoError(t, e.LoadModules(t.Context(), map[string]string{"slow.rego": `package authz
decision := {"allow": true, "code": "", "message": "", "reasons": [], "capabilities": ` + allFalse + `} if {
	count([x | some x in numbers.range(1, 50000000)]) > 0
}`}, "slow"))
	start := time.Now()
	doc, _, err := e.Decide(t.Context(), &snapshot.Request{Operation: snapshot.OpGetRunnerIngressEndpoint,
		Environment: map[string]any{}, Lease: map[string]any{}, Metadata: map[string]any{}}, emptyFacts{})
	assertFailClosed(t, doc, err, coded.EvalTimeout, snapshot.OpGetRunnerIngressEndpoint)
	assert.Less(t, time.Since(start), 10*time.Second)
}

type emptyFacts struct{}

func (emptyFacts) Plugin(string) (snapshot.PluginFacts, bool)    { return snapshot.PluginFacts{}, false }
func (emptyFacts) BuiltinProvider(string) (map[string]any, bool) { return nil, false }
func (emptyFacts) ConfigValid(context.Context, string, *snapshot.Worker, string, any) (bool, error) {
	return false, nil
}

// TestPolicySwapUnderLoad swaps policy revisions while decisions run (run with -race): every
// decision is made wholly by one revision.
func TestPolicySwapUnderLoad(t *testing.T) {
	e := embeddedEngine(t, Options{})
	denyAll := map[string]string{"deny.rego": `package authz
decision := {"allow": false, "code": "DENY_ALL", "message": "", "reasons": [], "capabilities": ` + allFalse + `}`}
	mods := maps.Clone(denyAll)
	var onDenyAll, onEmbedded atomic.Int64 // decisions made by each revision
	stop := testutil.Repeat(t, 4, func(int) bool {
		doc, err := e.Evaluate(context.Background(), grantInput())
		if !assert.NoError(t, err) {
			return false
		}
		if doc.Revision == "deny-all" {
			assert.False(t, doc.Allow)
			assert.Equal(t, "DENY_ALL", doc.Code)
			onDenyAll.Add(1)
		} else {
			assert.True(t, doc.Allow)
			onEmbedded.Add(1)
		}
		return true
	})
	embedded := e.Revision()
	for i := range 6 {
		counter := &onEmbedded
		if i%2 == 0 {
			require.NoError(t, e.LoadModules(t.Context(), mods, "deny-all"))
			counter = &onDenyAll
		} else {
			require.NoError(t, e.Prepare(t.Context(), embedded, embeddedModules(t)...))
		}
		// Decisions run on the new revision before the next swap.
		from := counter.Load()
		require.Eventually(t, func() bool { return counter.Load() >= from+10 }, 30*time.Second, time.Millisecond,
			"no decisions on the revision of swap %d", i)
	}
	stop()
}

func embeddedModules(t testing.TB) []func(*rego.Rego) {
	t.Helper()
	mods, err := policiesModules()
	require.NoError(t, err)
	var opts []func(*rego.Rego)
	for n, src := range mods {
		opts = append(opts, rego.Module(n, src))
	}
	return opts
}

// TestMaxConcurrentQueuesAndTimesOut: with every slot taken, a decision waits; when its time
// runs out while waiting it denies with the time-out code, and once a slot frees it is decided.
// The second half runs on an engine whose time bound no machine reaches, so a slow (race, shared)
// machine cannot turn its evaluation into a time-out.
func TestMaxConcurrentQueuesAndTimesOut(t *testing.T) {
	req := &snapshot.Request{Operation: snapshot.OpOpenDuplexChannel, Environment: map[string]any{},
		Lease: map[string]any{}, Metadata: map[string]any{}}

	short := embeddedEngine(t, Options{MaxConcurrent: 1, EvalTimeout: 50 * time.Millisecond})
	short.slots <- struct{}{} // another decision holds the only slot
	doc, _, err := short.Decide(t.Context(), req, emptyFacts{})
	assertFailClosed(t, doc, err, coded.EvalTimeout, snapshot.OpOpenDuplexChannel)

	e := embeddedEngine(t, Options{MaxConcurrent: 1, EvalTimeout: time.Minute})
	e.slots <- struct{}{} // another decision holds the only slot
	done := make(chan Document, 1)
	go func() {
		d, _, _ := e.Decide(t.Context(), req, emptyFacts{})
		done <- d
	}()
	select {
	case d := <-done:
		t.Fatalf("decided while every slot was taken: %v", d.Reasons)
	case <-time.After(20 * time.Millisecond):
	}
	<-e.slots // the slot frees
	select {
	case d := <-done:
		assert.Equal(t, []string{"no_provider"}, d.Reasons, "decided by the policy, not failed")
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting decision was never made")
	}
}
