package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
)

const usage = `authz decides which sandbox capabilities a lease is entitled to, and whether it may open a
duplex command stream (the decision contract: docs/contract.md).

Usage:
  authz serve  [flags]                 run the HTTP authorization service (docs/service.md)
  authz check  [--config FILE] [flags] check a configuration without starting anything
  authz decide --facts FILE [flags]    decide one request (read from stdin or --request)
  authz run    [opa run flags]         OPA's run command with the gate built in (docs/service.md)
  authz replay --log FILE [flags]      re-decide a decision log on a policy: what would change
  authz version                        print the version and the embedded policy's revision
  authz help [COMMAND]                 print this help, or the flags of a command

Run "authz COMMAND -h" for the flags of a command. Help goes to stdout and exits 0.
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

// parseFlags parses a subcommand's arguments into fs, writing the usage text and fs's
// defaults on -h or a bad flag to stderr. ok is false when there is nothing to run: the help
// was asked for (err nil), a flag was bad (exit 2), or there was a positional argument (exit 2;
// the message names it and adds hint).
func parseFlags(fs *flag.FlagSet, usage string, args []string, stderr io.Writer, hint string) (ok bool, err error) {
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return false, nil
		}
		return false, &exitError{code: 2}
	}
	if fs.NArg() > 0 {
		return false, usageError("%s: unexpected argument %q (%s)", fs.Name(), fs.Arg(0), hint)
	}
	return true, nil
}

// run is the whole program without the process: tests call it directly.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &exitError{code: 2}
	}
	cmd, rest := args[0], args[1:]
	if cmd == "help" && len(rest) > 0 {
		// "authz help serve" is "authz serve -h".
		cmd, rest = rest[0], []string{"-h"}
	}
	if wantsHelp(rest) {
		// Asked-for help is output, not an error: the flag package writes it to the
		// command's stderr, so give the command stdout there.
		stderr = stdout
	}
	c, ok := commands[cmd]
	if !ok {
		fmt.Fprint(stderr, usage)
		return usageError("unknown command %q", cmd)
	}
	return c(ctx, rest, stdin, stdout, stderr)
}

// command runs one subcommand with its arguments.
type command func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error

// commands are the subcommands by name: the one place a command is found.
var commands = map[string]command{
	"serve":          runServe,
	"check":          runCheck,
	"decide":         runDecide,
	"run":            runOPA,
	"replay":         runReplay,
	"version":        runVersion,
	"--version":      runVersion,
	"help":           runHelp,
	"-h":             runHelp,
	"-help":          runHelp,
	"--help":         runHelp,
	"example-driver": runExampleDriver, // hidden: the built-in example driver's process
}

func runVersion(_ context.Context, _ []string, _ io.Reader, stdout, _ io.Writer) error {
	return printVersion(stdout)
}

func runHelp(_ context.Context, _ []string, _ io.Reader, stdout, _ io.Writer) error {
	_, err := fmt.Fprint(stdout, usage)
	return err
}

// wantsHelp reports whether a command's arguments ask for its help before any "--".
func wantsHelp(args []string) bool {
	end := slices.Index(args, "--")
	if end < 0 {
		end = len(args)
	}
	return slices.ContainsFunc(args[:end], func(a string) bool { return a == "-h" || a == "-help" || a == "--help" })
}
