package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/authz-dev/authz/internal/opaplugin"
)

// opaBinary is the executable that serves `authz run`: OPA's run command with the gate built
// in (cmd/authz-opa). It is built apart from authz so that authz, and `go run ./cmd/authz
// serve` on a fresh machine, do not compile OPA's command line.
const opaBinary = "authz-opa"

// missingOPA says how to get authz-opa, for `authz run` when it is not found.
const missingOPA = `authz run is served by the authz-opa executable (OPA's run command with the gate built
in), which is built apart from authz; none was found beside this executable or on PATH.
From a clone of the repository, either run it directly:

  go run ./cmd/authz-opa run --server -c examples/opa.yaml

or build both executables side by side, and authz run finds it:

  go build -o bin/ ./cmd/authz ./cmd/authz-opa    # then: bin/authz run ...
  go install ./cmd/authz ./cmd/authz-opa          # or on your PATH
`

// execRequest asks main to replace the process by path with argv (syscall.Exec): `authz run`
// becomes authz-opa, with the same process id, signals and standard streams.
type execRequest struct {
	path string
	argv []string
}

func (e *execRequest) Error() string { return "exec " + e.path }

// runOPA is `authz run`: it runs `authz-opa run ARGS` in this process's place, from beside
// this executable, or else from PATH. Without one, it says how to get it (exit 1); asked for
// help, it prints the gate's part of the help and the same advice (exit 0).
func runOPA(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	if path := findOPABinary(); path != "" {
		return &execRequest{path: path, argv: append([]string{"authz", "run"}, args...)}
	}
	if wantsHelp(args) {
		_, err := fmt.Fprint(stdout, opaplugin.Usage+"\nOPA's run command and its flags: authz-opa run -h.\n\n"+missingOPA)
		return err
	}
	fmt.Fprint(stderr, missingOPA)
	return &exitError{code: 1, msg: "run: " + opaBinary + " not found"}
}

// findOPABinary returns the path of authz-opa beside this executable, or else on PATH; "" when
// there is none.
func findOPABinary() string {
	if self, err := os.Executable(); err == nil {
		if self, err = filepath.EvalSymlinks(self); err == nil {
			beside := filepath.Join(filepath.Dir(self), opaBinary)
			if fi, err := os.Stat(beside); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
				return beside
			}
		}
	}
	if path, err := exec.LookPath(opaBinary); err == nil {
		if abs, err := filepath.Abs(path); err == nil {
			return abs
		}
	}
	return ""
}
