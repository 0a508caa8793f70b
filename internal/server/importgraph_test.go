package server_test

import (
	"go/build"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/authz-dev/authz"

// The HTTP server renders state and hands over records; the parts that fill them (the policy
// source, the plugin host) and the ones that compose it (service, opaplugin) are not among its
// dependencies, direct or transitive. The state packages it reads and internal/tracing depend on
// nothing of the service that could lead back up.
func TestImportGraph(t *testing.T) {
	root := moduleRoot(t)
	upper := []string{"internal/server", "internal/service", "internal/opaplugin", "internal/policy", "internal/pluginhost", "cmd/authz"}
	for _, c := range []struct {
		pkg string
		// forbidden are the packages pkg must not reach; nil: no package of authz at all.
		forbidden []string
	}{
		{pkg: "internal/server", forbidden: []string{"internal/policy", "internal/pluginhost", "internal/service", "internal/opaplugin"}},
		{pkg: "internal/policystate"},
		{pkg: "internal/api"},
		{pkg: "internal/tracing", forbidden: append([]string{"internal/decision", "internal/snapshot"}, upper...)},
	} {
		t.Run(c.pkg, func(t *testing.T) {
			deps := authzDeps(t, root, c.pkg)
			require.NotNil(t, deps)
			if c.forbidden == nil {
				assert.Empty(t, deps, "%s imports packages of authz", c.pkg)
				return
			}
			for _, f := range c.forbidden {
				assert.NotContains(t, deps, f, "%s depends on %s", c.pkg, f)
			}
		})
	}
}

// TestImportGraphSeesEdges: the walk of TestImportGraph finds a dependency that exists, direct
// and transitive, so that its absence above means something.
func TestImportGraphSeesEdges(t *testing.T) {
	deps := authzDeps(t, moduleRoot(t), "internal/service")
	for _, p := range []string{"internal/server", "internal/policy", "internal/pluginhost", "internal/policystate", "internal/api", "internal/coded"} {
		assert.Contains(t, deps, p)
	}
}

// authzDeps lists the packages of the module that pkg (a path below the module's root) imports,
// directly or not, without its tests, as the build for this platform selects its files.
func authzDeps(t *testing.T, root, pkg string) []string {
	t.Helper()
	seen := map[string]bool{}
	var walk func(p string)
	walk = func(p string) {
		bp, err := build.ImportDir(filepath.Join(root, filepath.FromSlash(p)), 0)
		require.NoError(t, err, p)
		for _, imp := range bp.Imports {
			rel, ok := strings.CutPrefix(imp, module+"/")
			if !ok || seen[rel] {
				continue
			}
			seen[rel] = true
			walk(rel)
		}
	}
	walk(pkg)
	deps := []string{}
	for p := range seen {
		deps = append(deps, p)
	}
	slices.Sort(deps)
	return deps
}

// moduleRoot is the directory of the module's go.mod, above the test's working directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			require.Contains(t, string(b), "module "+module+"\n")
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test's directory")
		dir = parent
	}
}
