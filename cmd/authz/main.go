// Command authz decides whether a sandbox lease may open a duplex command stream, and which of
// the nine sandbox capabilities it is entitled to. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/authz-dev/authz/internal/sandbox"
)

func main() {
	sandbox.Init() // started as a driver launcher, it runs the launcher and never returns
	// A write to a closed pipe (stderr whose reader went away) is an error the writer
	// handles, such as a required decision log answering 503, not a reason to die. Caught
	// (into a channel nobody reads; extra signals are dropped) rather than ignored, so that
	// plugin processes started from here do not inherit an ignored SIGPIPE.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	var ex *execRequest
	if errors.As(err, &ex) {
		err = fmt.Errorf("run: %w", syscall.Exec(ex.path, ex.argv, os.Environ()))
	}
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "authz: "+ee.msg)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "authz: "+err.Error())
		os.Exit(1)
	}
}
