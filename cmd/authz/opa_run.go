package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"
	opacmd "github.com/open-policy-agent/opa/cmd"
	"github.com/open-policy-agent/opa/v1/runtime"
	"github.com/spf13/cobra"

	"github.com/authz-dev/authz/internal/opaplugin"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/service"
)

// runOPA is `authz run`: OPA's own run command, every flag, configuration key and API of
// `opa run` included, with the gate registered as the OPA plugin plugins.authz
// (internal/opaplugin). OPA handles SIGINT and SIGTERM itself: it stops its server, then its
// plugins (the gate's server, then the driver plugins). SIGHUP never ends the process: it
// reloads the gate's tokens file and decision log (reloadOnHangup).
func runOPA(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	defer reloadOnHangup(stderr)()
	// The gate compiles its policy from the bundles OPA activates, copied on their way in.
	opaplugin.RegisterActivator()
	runtime.RegisterPlugin(opaplugin.Name, opaplugin.Factory{StartHost: startPluginHost, LogOutput: stderr})
	root := opacmd.Command(&cobra.Command{
		Use:           "authz",
		Short:         "authz: OPA with the authz gate built in",
		SilenceUsage:  true,
		SilenceErrors: true,
	}, "OPA")
	refuseUnverifiedWatch(root)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// OPA's version check asks GitHub about OPA releases, which say nothing about this build:
	// off unless asked for (--skip-version-check=false).
	root.SetArgs(append([]string{"run", "--skip-version-check"}, args...))
	if err := root.Execute(); err != nil {
		return &exitError{code: 1, msg: "run: " + err.Error()}
	}
	return nil
}

// refuseUnverifiedWatch makes OPA's run command refuse --watch together with
// --verification-key: OPA's file watcher loads a changed bundle file without verifying its
// signature, so under --watch a file that is not signed, or signed earlier (a rollback), would
// become the gate's policy. `authz serve --bundle FILE --watch --verification-key` verifies and
// orders every reload.
func refuseUnverifiedWatch(root *cobra.Command) {
	for _, c := range root.Commands() {
		if c.Name() != "run" {
			continue
		}
		pre := c.PreRunE
		c.PreRunE = func(cmd *cobra.Command, args []string) error {
			watch, _ := cmd.Flags().GetBool("watch")
			key, _ := cmd.Flags().GetString("verification-key")
			if watch && key != "" {
				return errors.New("--watch with --verification-key is refused: OPA's file watcher re-reads bundle files without verifying their signatures; " +
					"drop --watch (restart to load a new signed bundle), serve signed bundles from a bundle server, or use `authz serve --bundle FILE --watch --verification-key KEY`, which verifies every reload")
			}
			if pre != nil {
				return pre(cmd, args)
			}
			return nil
		}
	}
}

// startPluginHost starts the driver plugins of the plugins.authz section, as `authz serve`
// starts those of its configuration file.
func startPluginHost(ctx context.Context, cfg service.Config, logger hclog.Logger) (server.FactsSource, func(), error) {
	return service.StartPlugins(ctx, cfg, logger)
}

// reloadOnHangup catches SIGHUP for as long as `authz run` runs, so that it never ends the
// process (a logrotate postrotate `kill -HUP` included): each one reloads what the gate can
// reload (opaplugin.Reload), and says so when no gate serves yet. It returns the function that
// stops catching it.
func reloadOnHangup(stderr io.Writer) func() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-hup:
				if opaplugin.Reload() == 0 {
					hclog.New(&hclog.LoggerOptions{Name: "authz", Output: stderr}).
						Info("reload: SIGHUP received; the gate does not serve yet, nothing to reload")
				}
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
	}
}
