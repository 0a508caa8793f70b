package main

import (
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"
	opacmd "github.com/open-policy-agent/opa/cmd"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/runtime"
	"github.com/spf13/cobra"

	"github.com/authz-dev/authz/internal/opaplugin"
)

// runOPA is `authz run`: OPA's own run command, every flag, configuration key and API of
// `opa run` included, with the gate registered as the OPA plugin plugins.authz
// (internal/opaplugin). OPA handles SIGINT and SIGTERM itself: it stops its server, then its
// plugins (the gate's server, then the driver plugins). SIGHUP never ends the process: it
// reloads the gate's tokens file and decision log (reloadOnHangup).
func runOPA(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	// The gate compiles its policy from the bundles OPA activates, copied on their way in.
	opaplugin.RegisterActivator()
	root := opacmd.Command(&cobra.Command{
		Use:           "authz",
		Short:         "authz: OPA with the authz gate built in",
		SilenceUsage:  true,
		SilenceErrors: true,
	}, "OPA")
	runCmd := runCommand(root)
	if runCmd == nil {
		return errors.New("OPA's command line has no run command")
	}
	runCmd.Long = opaplugin.Usage + "\nOPA's run command:\n\n" + runCmd.Long
	logJSON := true // OPA's default --log-format is json
	stopHangup := func() {}
	defer func() { stopHangup() }()
	pre := runCmd.PreRunE
	runCmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if err := refuseUnverifiedWatch(cmd); err != nil {
			return err
		}
		if f := cmd.Flags().Lookup("log-format"); f != nil { // json (the default), json-pretty or text
			logJSON = f.Value.String() != "text"
		}
		log := hclog.New(&hclog.LoggerOptions{Name: "authz", Output: stderr, JSONFormat: logJSON})
		warnWithoutGate(cmd, log)
		stopHangup = reloadOnHangup(log)
		runtime.RegisterPlugin(opaplugin.Name, gateFactory{
			Factory: opaplugin.Factory{Plugins: true, LogOutput: stderr},
			logJSON: logJSON,
		})
		if pre != nil {
			return pre(cmd, args)
		}
		return nil
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// OPA's version check asks GitHub about OPA releases, which say nothing about this build:
	// off unless asked for (--skip-version-check=false).
	root.SetArgs(append([]string{"run", "--skip-version-check"}, args...))
	return root.Execute()
}

// runCommand is OPA's run command below root.
func runCommand(root *cobra.Command) *cobra.Command {
	for _, c := range root.Commands() {
		if c.Name() == "run" {
			return c
		}
	}
	return nil
}

// refuseUnverifiedWatch refuses --watch together with --verification-key: OPA's file watcher
// loads a changed bundle file without verifying its signature, so under --watch a file that is
// not signed, or signed earlier (a rollback), would become the gate's policy. `authz serve
// --bundle FILE --watch --verification-key` verifies and orders every reload.
func refuseUnverifiedWatch(cmd *cobra.Command) error {
	watch, _ := cmd.Flags().GetBool("watch")
	key, _ := cmd.Flags().GetString("verification-key")
	if watch && key != "" {
		return errors.New("--watch with --verification-key is refused: OPA's file watcher re-reads bundle files without verifying their signatures; " +
			"drop --watch (restart to load a new signed bundle), serve signed bundles from a bundle server, or use `authz serve --bundle FILE --watch --verification-key KEY`, which verifies every reload")
	}
	return nil
}

// warnWithoutGate says so when OPA's boot configuration (--config-file, --set, --set-file) has
// no plugins.authz section: OPA then runs without the gate, whose address refuses connections.
func warnWithoutGate(cmd *cobra.Command, log hclog.Logger) {
	file, _ := cmd.Flags().GetString("config-file")
	sets, _ := cmd.Flags().GetStringArray("set")
	setFiles, _ := cmd.Flags().GetStringArray("set-file")
	var src []byte
	if file != "" {
		var err error
		if src, err = os.ReadFile(file); err != nil {
			return // OPA reports the file it cannot read
		}
	}
	configured, discovery := opaplugin.Configured(src, append(sets, setFiles...))
	if configured {
		return
	}
	msg := "plugins.authz is not in OPA's configuration: the gate does not serve (its address refuses connections), only OPA's own API does; " +
		"add a plugins.authz section to the --config-file (examples/opa.yaml has one) or pass --set plugins.authz.addr=127.0.0.1:8182"
	if discovery {
		msg = "plugins.authz is not in OPA's boot configuration: the gate serves only if discovery configures it, and then cannot guard OPA's own API; " +
			"add a plugins.authz section to the --config-file (examples/opa.yaml has one)"
	}
	log.Warn(msg)
}

// gateFactory is the gate's plugin factory with the log format of OPA's --log-format, for a
// plugins.authz section that sets no log.json: OPA's lines and the gate's share one format.
type gateFactory struct {
	opaplugin.Factory
	logJSON bool
}

func (f gateFactory) Validate(m *plugins.Manager, raw []byte) (any, error) {
	cfg, err := f.Factory.Validate(m, raw)
	if err != nil {
		return nil, err
	}
	c := cfg.(*opaplugin.Config)
	c.FollowLogFormat(f.logJSON)
	return c, nil
}

func (f gateFactory) New(m *plugins.Manager, config any) plugins.Plugin {
	// With OPA's write APIs open, masks may come through OPA's Policy API, which refuses a
	// mask rule where the default's data is: no default then.
	writeAPI := config.(*opaplugin.Config).OPAWriteAPI
	return maskingGate{
		Plugin: f.Factory.New(m, config).(*opaplugin.Plugin),
		masks: &logMasking{m: m, off: writeAPI,
			log: hclog.New(&hclog.LoggerOptions{Name: "authz", Output: f.LogOutput, JSONFormat: f.logJSON})},
	}
}

// reloadOnHangup catches SIGHUP for as long as `authz run` runs, so that it never ends the
// process (a logrotate postrotate `kill -HUP` included): each one reloads what the gate can
// reload (opaplugin.Reload), and says so when no gate serves yet. It returns the function that
// stops catching it.
func reloadOnHangup(log hclog.Logger) func() {
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
					log.Info("reload: SIGHUP received; the gate does not serve yet, nothing to reload")
				}
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
	}
}
