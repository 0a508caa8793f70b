// Package policies embeds the Rego policy and its data tables shipped with authz. Policy authors
// edit the .rego files under authz/ and test them with `go tool opa test policies policy_test`.
package policies

import (
	"embed"
	"io/fs"
	"path"
	"strings"
)

//go:embed authz
var files embed.FS

// Modules returns the embedded Rego modules keyed by their path below policies/ (test files,
// which live in policy_test/, are never embedded; any *_test.rego here is skipped as well).
func Modules() (map[string]string, error) {
	out := map[string]string{}
	err := fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".rego" || strings.HasSuffix(p, "_test.rego") {
			return err
		}
		b, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		out["policies/"+p] = string(b)
		return nil
	})
	return out, err
}
