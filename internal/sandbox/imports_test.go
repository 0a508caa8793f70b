package sandbox

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSandboxDoesNotImportThePluginHost: the containment is below the plugin host, which asks it
// for a runner; no file of this package or its subpackages imports internal/pluginhost (for
// any system), so the plugin host's tests and the launcher cannot grow into each other again.
func TestSandboxDoesNotImportThePluginHost(t *testing.T) {
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		require.NoError(t, err)
		files++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			assert.NotContains(t, p, "internal/pluginhost", "%s imports the plugin host", path)
		}
		return nil
	})
	require.NoError(t, err)
	assert.Greater(t, files, 5, "the package's files were read")
}
