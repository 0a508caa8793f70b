package main

import (
	"context"
	"io"

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
// plugins (the gate's server, then the driver plugins).
func runOPA(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	// The gate compiles its policy from the bundles OPA activates, copied on their way in.
	opaplugin.RegisterActivator()
	runtime.RegisterPlugin(opaplugin.Name, opaplugin.Factory{StartHost: startPluginHost, LogOutput: stderr})
	root := opacmd.Command(&cobra.Command{
		Use:           "authz",
		Short:         "authz: OPA with the authz gate built in",
		SilenceUsage:  true,
		SilenceErrors: true,
	}, "OPA")
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

// startPluginHost starts the driver plugins of the plugins.authz section, as `authz serve`
// starts those of its configuration file.
func startPluginHost(ctx context.Context, cfg service.Config, logger hclog.Logger) (server.FactsSource, func(), error) {
	return service.StartPlugins(ctx, cfg, logger)
}
