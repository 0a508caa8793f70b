package server

import (
	"runtime"
	"runtime/debug"
	"sync"

	opaversion "github.com/open-policy-agent/opa/v1/version"
)

// BuildInfo is what the running binary was built from: GET /v1/status's "build" and the
// labels of authz_build_info.
type BuildInfo struct {
	// Version is the module version of the build ("devel" for a build from a work tree).
	Version string `json:"version"`
	// Revision is the VCS revision the binary was built at, with "-dirty" when the tree had
	// changes; "" when the build did not record it (go run, go test).
	Revision string `json:"revision"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go_version"`
	// OPAVersion is the version of the embedded OPA.
	OPAVersion string `json:"opa_version"`
}

// Build is the build information of the running binary, read once.
var Build = sync.OnceValue(func() BuildInfo {
	b := BuildInfo{Version: "devel", GoVersion: runtime.Version(), OPAVersion: opaversion.Version}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		b.Version = v
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && b.Revision != "" {
		b.Revision += "-dirty"
	}
	return b
})
