package server_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEveryFaceDecidesThroughThePipeline: a recording pipeline double sees every face of a
// decision: /v1/authorize, /v1/capabilities, the Data API (its decision and an undefined
// document's body), AuthZEN single and batch, a watch's first decision, its re-decision and
// its event's record. (`authz run`'s gate serves these same handlers: internal/service.NewGate.)
func TestEveryFaceDecidesThroughThePipeline(t *testing.T) {
	t.Parallel()
	facts := newChangingFacts(t)
	s := newServer(t, withFacts(facts))
	calls := s.RecordFaces()
	url := startHTTP(t, s)
	body := fixture(t, nil)
	eval := mustJSON(t, toAuthZEN(t, []byte(body)))

	for _, c := range []struct{ path, body string }{
		{"/v1/authorize", body},
		{"/v1/capabilities", body},
		{"/v1/data/authz/decision", `{"input": ` + body + `}`},
		{"/", body},
		{"/v1/data/authz/allow", `{"input": ` + body + `}`},
		{"/access/v1/evaluation", eval},
		{"/access/v1/evaluations", `{"evaluations": [` + eval + `, ` + eval + `]}`},
	} {
		a := post(t, url+c.path, c.body)
		require.Equal(t, http.StatusOK, a.status, "%s: %s", c.path, a.body)
	}
	w, stream := openWatch(t, url, body)
	require.Equal(t, http.StatusOK, w.StatusCode, string(w.body))
	assert.Equal(t, "decision", stream.next(t).kind)
	facts.kill()
	assert.Equal(t, "revoke", stream.next(t).kind)

	want := []string{
		"Decide /v1/authorize", "Decide /v1/capabilities", "Decide /v1/data/authz/decision", "Decide /",
		"Body", "Decide /access/v1/evaluation", "Body", "DecideBody /access/v1/evaluations",
		"Decide /v1/authorize/watch", "Recheck", "Redecide", "Event",
	}
	require.Eventually(t, func() bool { return isSubsequence(want, calls()) }, 10*time.Second, 5*time.Millisecond,
		"the pipeline saw %q", calls())
}

// isSubsequence reports whether want appears in got in order.
func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestHandlersDecideOnlyThroughThePipeline reads the package's code: no function calls a step
// of a decision (admission, the access check, the engine, the decision log or OPA's) other
// than the pipeline's steps (steps.go); the middleware's access check comes before any. The
// recorder (internal/audit) is called by the pipeline alone.
func TestHandlersDecideOnlyThroughThePipeline(t *testing.T) {
	t.Parallel()
	// step: the receiver's last name and the method, and the files that may call it.
	steps := []struct {
		recv    string
		methods []string
		files   []string
	}{
		{"admit", []string{"admitBody", "acquire", "bodyIn", "finish"}, []string{"steps.go"}},
		{"deciding", []string{"release"}, []string{"steps.go"}},
		{"access", []string{"check"}, []string{"steps.go", "middleware.go"}},
		{"decider", []string{"Decide"}, []string{"steps.go"}},
		{"rec", []string{"Record", "Unavailable"}, nil},
		{"watches", []string{"RevokeAll"}, []string{"steps.go"}},
		{"", []string{"logToOPA", "decideFor", "recordDecision"}, []string{"steps.go"}},
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			recv := ""
			switch x := sel.X.(type) {
			case *ast.SelectorExpr:
				recv = x.Sel.Name
			case *ast.Ident:
				recv = x.Name
			}
			for _, st := range steps {
				if !slices.Contains(st.methods, sel.Sel.Name) || (st.recv != "" && recv != st.recv) {
					continue
				}
				assert.True(t, slices.Contains(st.files, name), "%s: %s.%s is a step of the decision pipeline: call it through the pipeline (steps.go)",
					fset.Position(call.Pos()), recv, sel.Sel.Name)
			}
			return true
		})
	}
	require.Greater(t, checked, 10, "the package's files were read")
}
