// Package policytest runs the Rego test suites of policy_test/ against policies/ from `go test`,
// with OPA's own test runner and coverage, so `go test ./...` covers the policy as well.
// Policy authors can run the same suites with `go tool opa test policies policy_test`.
package policytest

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/cover"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// coverageThreshold is the least share of policy lines (policies/, test files excluded) that
// the suites must cover.
const coverageThreshold = 95.0

func TestRegoSuites(t *testing.T) {
	res, err := loader.NewFileLoader().All([]string{"../policies", "."})
	require.NoError(t, err)
	modules := map[string]*ast.Module{}
	for name, f := range res.Modules {
		modules[name] = f.Parsed
	}
	store := inmem.NewFromObject(res.Documents)
	txn := storage.NewTransactionOrDie(t.Context(), store)
	defer store.Abort(t.Context(), txn)

	cov := cover.New()
	runner := tester.NewRunner().
		SetStore(store).
		SetModules(modules).
		SetCoverageQueryTracer(cov).
		SetTimeout(30 * time.Second)
	results, err := runner.RunTests(t.Context(), txn)
	require.NoError(t, err)

	n := 0
	for r := range results {
		n++
		t.Run(strings.TrimPrefix(r.Package, "data.")+"."+r.Name, func(t *testing.T) {
			if r.Error != nil {
				t.Fatalf("%s: error: %v", r.Location, r.Error)
			}
			if r.Fail {
				t.Fatalf("%s: fails (run `go tool opa test policies policy_test -v --run %s` for a trace)", r.Location, r.Name)
			}
		})
	}
	require.Greater(t, n, 100, "the Rego suites were not found or not run")

	report := cov.Report(modules)
	covered, missed := 0, 0
	for file, fr := range report.Files {
		if strings.HasPrefix(filepath.ToSlash(file), "../policies/") && !strings.HasSuffix(file, "_test.rego") {
			covered += fr.CoveredLines
			missed += fr.NotCoveredLines
			for _, rg := range fr.NotCovered {
				t.Logf("not covered: %s:%d-%d", file, rg.Start.Row, rg.End.Row)
			}
		}
	}
	require.Positive(t, covered, "no policy line was covered: were the policies loaded?")
	pct := 100 * float64(covered) / float64(covered+missed)
	t.Logf("%d Rego tests, policy coverage %.2f%% (%d of %d lines)", n, pct, covered, covered+missed)
	require.GreaterOrEqual(t, pct, coverageThreshold, "policy coverage is below the threshold")
}

// TestRoutineTableEditFailsOnlyTheContractSuite: the edit the README calls routine, a
// capability's required methods in the capability table, fails only the contract suite
// (data.authz_test.contract), which says the edit changes the contract; the suites that test
// the policy's mechanics follow the table. Here nativeSyncIn also requires a method no worker
// of the fixtures reports.
func TestRoutineTableEditFailsOnlyTheContractSuite(t *testing.T) {
	res, err := loader.NewFileLoader().All([]string{"../policies", "."})
	require.NoError(t, err)
	const from, to = `"methods": {"environmentSyncIn"},`, `"methods": {"environmentSyncIn", "environmentSyncInChecked"},`
	modules := map[string]*ast.Module{}
	edited := false
	for name, f := range res.Modules {
		m := f.Parsed
		if strings.HasSuffix(filepath.ToSlash(name), "policies/authz/tables/tables.rego") {
			src := string(f.Raw)
			require.Contains(t, src, from, "the capability table no longer has the line this test edits")
			m, err = ast.ParseModuleWithOpts(name, strings.Replace(src, from, to, 1), ast.ParserOptions{RegoVersion: ast.RegoV1, ProcessAnnotation: true})
			require.NoError(t, err)
			edited = true
		}
		modules[name] = m
	}
	require.True(t, edited, "tables.rego not found")
	store := inmem.NewFromObject(res.Documents)
	txn := storage.NewTransactionOrDie(t.Context(), store)
	defer store.Abort(t.Context(), txn)
	results, err := tester.NewRunner().SetStore(store).SetModules(modules).SetTimeout(30*time.Second).RunTests(t.Context(), txn)
	require.NoError(t, err)
	var contract, others []string
	for r := range results {
		if !r.Fail && r.Error == nil {
			continue
		}
		if r.Package == "data.authz_test.contract" {
			contract = append(contract, r.Name)
		} else {
			others = append(others, r.Package+"."+r.Name)
		}
	}
	assert.Empty(t, others, "a routine edit of the capability table fails suites other than the contract's")
	assert.Contains(t, contract, "test_tables_capability_methods", "the contract suite no longer pins the capability table")
}
