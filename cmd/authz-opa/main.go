// Command authz-opa is OPA's run command with the authz gate built in as the OPA plugin
// plugins.authz (internal/opaplugin): `authz-opa run [opa run flags]`, which `authz run`
// executes. It is a binary of its own because OPA's command line (its run, eval, test, build,
// ... commands, the REPL, the telemetry exporters) doubles what `go run ./cmd/authz serve`
// compiles; authz serve does not need it (docs/service.md, "Running inside OPA").
package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/authz-dev/authz/examples/exampledriver"
	"github.com/authz-dev/authz/internal/sandbox"
)

const usage = `authz-opa is OPA's run command with the authz gate built in (docs/service.md, "Running inside OPA").

Usage:
  authz-opa run [opa run flags]    OPA with the gate as plugins.authz; what "authz run" runs
  authz-opa run -h                 the gate's configuration, then every flag of OPA's run command

Example, from a clone of the repository:
  go run ./cmd/authz-opa run --server -c examples/opa.yaml --bundle policies
`

func main() {
	sandbox.Init() // started as a driver launcher, it runs the launcher and never returns
	// As in authz: a write to a closed pipe is an error of that write, not a reason to die.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	os.Exit(run(filepath.Base(os.Args[0]), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the whole program without the process; name is how it was called (authz when
// `authz run` executed it), for its messages. It returns the exit status.
func run(name string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := ""
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "run":
		if err := runOPA(args[1:], stdin, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "%s: run: %v\n", name, err)
			return 1
		}
		return 0
	case "example-driver": // hidden: the built-in example driver's process, as in authz
		return exampledriver.Main(args[1:])
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	case "":
		fmt.Fprint(stderr, usage)
		return 2
	default:
		fmt.Fprint(stderr, usage)
		fmt.Fprintf(stderr, "%s: unknown command %q: the one command is run (OPA's other commands: go tool opa)\n", name, cmd)
		return 2
	}
}
