package decision

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/snapshot"

	"github.com/authz-dev/authz/internal/coded"
)

// markerPolicy compiles a policy whose decision's code is data.marker (or marker when data is
// nil), under revision.
func markerPolicy(tb testing.TB, revision, marker string, data map[string]any) *Policy {
	tb.Helper()
	caps := make([]string, len(api.CapabilityKeys))
	for i, k := range api.CapabilityKeys {
		caps[i] = strconv.Quote(k) + ": false"
	}
	code := strconv.Quote(marker)
	if data != nil {
		code = "data.marker"
	}
	src := fmt.Sprintf("package authz\n\ndecision := {\"allow\": false, \"code\": %s, \"message\": \"m\", \"reasons\": [input.operation], \"capabilities\": {%s}}\n", code, strings.Join(caps, ", "))
	m, err := ast.ParseModule("authz.rego", src)
	require.NoError(tb, err)
	p, err := CompileModules(map[string]*ast.Module{"authz.rego": m}, data, revision)
	require.NoError(tb, err)
	return p
}

func TestActivateRefusesWhatCannotServe(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
		data            map[string]any
	}{
		{"compile failure", "package authz\n\ndecision if { nope }\n", "unsafe", nil},
		{"missing entrypoint", "package authz\n\nother := 1\n", "does not define data.authz.decision", nil},
		{"data and rule on one path", "package authz\n\ndecision := 1\n", "conflict", map[string]any{"authz": map[string]any{"decision": 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ast.ParseModule("x.rego", tc.src)
			require.NoError(t, err)
			_, err = CompileModules(map[string]*ast.Module{"x.rego": m}, tc.data, "r")
			require.Error(t, err)
			assert.Equal(t, coded.PolicyCompile, coded.CodeOf(err))
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestActivateSwapsAtomically decides continuously while two policies are activated in turn:
// every decision is made wholly by one revision (its code is its revision's marker), so no
// decision sees the modules or data of one activation and the revision of another, cached or
// not.
func TestActivateSwapsAtomically(t *testing.T) {
	for _, cache := range []bool{true, false} {
		t.Run(fmt.Sprintf("cache=%v", cache), func(t *testing.T) {
			eng := New(Options{Cache: CacheOptions{Disabled: !cache}})
			pa := markerPolicy(t, "A", "", map[string]any{"marker": "A"})
			pb := markerPolicy(t, "B", "", map[string]any{"marker": "B"})
			require.Empty(t, pa.CacheStatus(), "a compiled bundle keeps the cache on")
			require.NoError(t, eng.Activate(t.Context(), pa))
			var stop atomic.Bool
			var wg sync.WaitGroup
			var decided, mismatched atomic.Int64
			seen := sync.Map{}
			for w := range 4 {
				wg.Go(func() {
					in := snapshot.Input{"operation": "op" + strconv.Itoa(w%2)}
					for !stop.Load() {
						doc, err := eng.Evaluate(t.Context(), in)
						if err != nil || doc.Code != doc.Revision {
							mismatched.Add(1)
						}
						seen.Store(doc.Revision, true)
						decided.Add(1)
					}
				})
			}
			// At least 200 swaps, and on until decisions were seen on both revisions (a loaded
			// machine may schedule the deciders rarely), within a deadline.
			both := func() bool {
				_, a := seen.Load("A")
				_, b := seen.Load("B")
				return a && b
			}
			deadline := time.Now().Add(30 * time.Second)
			for i := 0; (i < 200 || !both()) && time.Now().Before(deadline); i++ {
				p := pa
				if i%2 == 0 {
					p = pb
				}
				require.NoError(t, eng.Activate(t.Context(), p))
				if i >= 200 {
					runtime.Gosched()
				}
			}
			stop.Store(true)
			wg.Wait()
			assert.Zero(t, mismatched.Load(), "every decision is made wholly by one revision")
			assert.Positive(t, decided.Load())
			_, sawA := seen.Load("A")
			_, sawB := seen.Load("B")
			assert.True(t, sawA && sawB, "decisions were made on both revisions")
		})
	}
}

func TestCompileModulesCopiesData(t *testing.T) {
	data := map[string]any{"marker": "before"}
	p := markerPolicy(t, "r", "", data)
	data["marker"] = "after" // the caller's map changes after the compile
	eng := New(Options{})
	require.NoError(t, eng.Activate(t.Context(), p))
	doc, err := eng.Evaluate(t.Context(), snapshot.Input{"operation": "x"})
	require.NoError(t, err)
	assert.Equal(t, "before", doc.Code, "a policy's data is its own copy")
}

// TestDecisionInFlightFinishesOnItsRevision starts a decision that waits (in http.send) for a
// loopback server the test holds, activates another policy while it waits, and sees it finish
// on the revision it started with; the next decision uses the new one.
func TestDecisionInFlightFinishesOnItsRevision(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	caps := make([]string, len(api.CapabilityKeys))
	for i, k := range api.CapabilityKeys {
		caps[i] = strconv.Quote(k) + ": false"
	}
	held := fmt.Sprintf(`package authz

resp := http.send({"method": "GET", "url": %q, "timeout": "2m"})

decision := {"allow": false, "code": "HELD", "message": "", "reasons": [], "capabilities": {%s}} if resp.status_code == 200
`, srv.URL, strings.Join(caps, ", "))
	m, err := ast.ParseModule("held.rego", held)
	require.NoError(t, err)
	pHeld, err := CompileModules(map[string]*ast.Module{"held.rego": m}, nil, "held")
	require.NoError(t, err)
	pFast := markerPolicy(t, "fast", "FAST", nil)

	type result struct {
		doc Document
		err error
	}
	eng := New(Options{})
	require.NoError(t, eng.Activate(t.Context(), pHeld))
	done := make(chan result, 1)
	go func() {
		doc, err := eng.Evaluate(t.Context(), snapshot.Input{"operation": "x"})
		done <- result{doc, err}
	}()
	select {
	case <-arrived: // the decision is under way on the held revision
	case <-time.After(time.Minute):
		t.Fatal("the held decision never reached the server")
	}
	require.NoError(t, eng.Activate(t.Context(), pFast))
	close(release)
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the held decision never ended")
	}
	require.NoError(t, r.err)
	assert.Equal(t, "held", r.doc.Revision, "a decision finishes on the revision it started with")
	assert.Equal(t, "HELD", r.doc.Code)
	doc, err := eng.Evaluate(t.Context(), snapshot.Input{"operation": "x"})
	require.NoError(t, err)
	assert.Equal(t, "fast", doc.Revision)
	assert.Equal(t, "FAST", doc.Code)
}
