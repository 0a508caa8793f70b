package main

import (
	"context"
	"io"

	"github.com/authz-dev/authz/examples/exampledriver"
)

// The hidden example-driver command serves the example sandbox driver over go-plugin, so the
// default `authz serve` can start a real driver process from its own executable.
func init() {
	extraCommands["example-driver"] = func(_ context.Context, args []string, _ io.Reader, _, _ io.Writer) error {
		if code := exampledriver.Main(args); code != 0 {
			return &exitError{code: code}
		}
		return nil
	}
}
