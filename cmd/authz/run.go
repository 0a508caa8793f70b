package main

import (
	"context"
	"fmt"
	"io"
)

const usage = `authz decides which sandbox capabilities a lease is entitled to.

Usage:
  authz serve  [flags]                 run the HTTP authorization service
  authz decide --facts FILE [flags]    decide one request (read from stdin or --request)
  authz version                        print the version

Run "authz COMMAND -h" for the flags of a command.
`

// exitError ends the process with code after printing msg (when not empty) on stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageError is a mistake in the command line: exit 2.
func usageError(format string, args ...any) error {
	return &exitError{code: 2, msg: fmt.Sprintf(format, args...)}
}

// run is the whole program without the process: tests call it directly.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &exitError{code: 2}
	}
	switch args[0] {
	case "decide":
		return runDecide(ctx, args[1:], stdin, stdout, stderr)
	case "version", "--version":
		_, err := fmt.Fprintln(stdout, "authz "+version())
		return err
	case "help", "-h", "--help":
		_, err := fmt.Fprint(stdout, usage)
		return err
	default:
		if cmd, ok := extraCommands[args[0]]; ok {
			return cmd(ctx, args[1:], stdin, stdout, stderr)
		}
		fmt.Fprint(stderr, usage)
		return usageError("unknown command %q", args[0])
	}
}

// extraCommands are registered by the files that implement them (serve, example-driver).
var extraCommands = map[string]func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error{}
