package main

import (
	"context"
	"io"

	"github.com/authz-dev/authz/examples/exampledriver"
)

// runExampleDriver is the hidden example-driver command: it serves the example sandbox driver
// over go-plugin, so the default `authz serve` can start a real driver process from its own
// executable.
func runExampleDriver(_ context.Context, args []string, _ io.Reader, _, _ io.Writer) error {
	if code := exampledriver.Main(args); code != 0 {
		return &exitError{code: code}
	}
	return nil
}
