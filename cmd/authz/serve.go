package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"

	"github.com/authz-dev/authz/internal/service"
)

const serveUsage = `Usage: authz serve [--config FILE] [flags]

Runs the HTTP authorization service (docs/service.md): POST /v1/authorize,
POST /v1/authorize/watch (the grant held open as server-sent events, revoked when it ends),
POST /v1/capabilities, POST /v1/data/authz/decision[/path] and POST / (OPA Data API),
POST /access/v1/evaluation(s) (AuthZEN), GET /v1/plugins, GET /v1/facts, GET /v1/status,
GET /health, GET /health/ready, GET /metrics.

With no flags it listens on 127.0.0.1:8181 with the embedded policy and starts the built-in
example driver as plugin example.sandbox. --bundle PATH serves a policy bundle instead (as
opa run --bundle); an opa: section in the configuration file downloads bundles with OPA's
plugin manager. The configuration file (YAML, examples/config.yaml) is optional; flags
override it. An invalid configuration exits with status 2 and names the field.
SIGINT/SIGTERM shut down gracefully: in-flight requests finish, then plugins stop. SIGHUP
reopens the decision log file (log rotation), reloads the policy bundle, and reads the
configuration file again to apply its plugins (added, removed and re-pinned plugins take
effect; the others keep running).

Flags:
`

// serveFlags is the flag set of `authz serve`: each flag is bound to the configuration field
// it sets, so that parsing the arguments over cfg overrides exactly the fields of the flags
// given. --config names the file and sets no field. It writes nothing until parseFlags gives
// it stderr.
func serveFlags(cfg *service.Config, configFile *string) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := &cfg.Server
	fs.StringVar(configFile, "config", "", "YAML configuration file (optional; examples/config.yaml documents every field)")
	fs.StringVar(&s.Addr, "addr", s.Addr, "listen address: host:port, or unix:///absolute/path")
	fs.StringVar(&s.TLS.Cert, "tls-cert", s.TLS.Cert, "PEM certificate (chain) for HTTPS; needs --tls-key")
	fs.StringVar(&s.TLS.Key, "tls-key", s.TLS.Key, "PEM private key for HTTPS; needs --tls-cert")
	fs.StringVar(&cfg.Facts, "facts", cfg.Facts, "static facts file (docs/contract.md, \"The facts (host state)\") instead of live plugins")
	fs.StringVar(&s.DecisionLog.Path, "decision-log", s.DecisionLog.Path, `decision log: a file to append to, "-" for stderr, "" for none`)
	fs.BoolVar(&s.DecisionLog.Required, "decision-log-required", s.DecisionLog.Required, "answer 503 DECISION_LOG_UNAVAILABLE when a decision's log line cannot be written")
	fs.Var(&listFlag{list: &s.DecisionLog.Mask}, "decision-log-mask", "JSON pointers below /input masked in the decision log, comma-separated or repeated;\nreplaces the configured list (\"\" for none)")
	fs.Int64Var(&s.MaxBodyBytes, "max-body-bytes", s.MaxBodyBytes, "largest request body; larger is 413")
	fs.DurationVar(&cfg.Decision.EvalTimeout, "eval-timeout", cfg.Decision.EvalTimeout, "bound on one decision: input assembly and evaluation")
	fs.StringVar(&cfg.Decision.Cache, "decision-cache", cfg.Decision.Cache, "answer repeated decisions from the decision cache: on or off")
	fs.StringVar(&cfg.Log.Level, "log-level", cfg.Log.Level, "service log level: trace, debug, info, warn, error, off")
	fs.BoolVar(&cfg.Log.JSON, "log-json", cfg.Log.JSON, "write the service log as JSON lines")
	fs.StringVar(&s.Authentication.Mode, "authentication", s.Authentication.Mode, "who may use the API: off, token (bearer tokens from --authentication-tokens-file)\nor tls (client certificates signed by --tls-ca-cert-file; needs --tls-cert)")
	fs.StringVar(&s.Authentication.TokensFile, "authentication-tokens-file", s.Authentication.TokensFile, "bearer tokens, one per line with its scopes: TOKEN decide|inspect|decide,inspect")
	fs.StringVar(&s.Authentication.ClientCAFile, "tls-ca-cert-file", s.Authentication.ClientCAFile, "PEM CA certificate(s) that sign client certificates (--authentication tls)")
	fs.Var(&listFlag{list: &s.Authentication.AllowedHosts}, "allowed-host", "host name accepted in the Host header on loopback, besides localhost, 127.0.0.1, [::1];\ncomma-separated or repeated; replaces the configured list; * accepts any")
	policyFlags(fs, &cfg.Policy, true)
	return fs
}

func runServe(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
	cfg, serve, err := serveConfig(args, stderr)
	if !serve {
		return err
	}
	// On SIGHUP the service reads the configuration again, the same way: file, then flags.
	reread := func() (service.Config, error) {
		c, _, err := serveConfig(args, io.Discard)
		return c, err
	}
	err = service.Run(ctx, cfg, service.Options{LogOutput: stderr, Reread: reread})
	var (
		ce *service.ConfigError
		le *service.ListenError
	)
	switch {
	case errors.As(err, &ce):
		return usageError("serve: %v", ce.Err)
	case err != nil:
		// Once the configuration is read, what ends the service is a line of its log, in the
		// log's format (JSON with log.json), never a plain line among JSON ones; exit status 1.
		log := service.NewLogger(cfg.Log, stderr)
		if errors.As(err, &le) {
			log.Error("serve: cannot listen on the configured address; is another process (another authz) using it?",
				"addr", cfg.Server.Addr, "error", le.Err)
		} else {
			log.Error("serve: stopped by an error", "error", err)
		}
		return &exitError{code: 1}
	}
	return nil
}

// serveConfig is the configuration the arguments ask for: the defaults, the file of --config
// over them, and the other flags over that. The flags are parsed twice, once to find the file
// and once over it, so that each flag is written once, bound to its field. serve is false when
// there is nothing to serve: the help was asked for (err nil), or err.
func serveConfig(args []string, stderr io.Writer) (cfg service.Config, serve bool, err error) {
	return serveConfigOf("serve", serveUsage, args, stderr, nil)
}

// serveConfigOf is serveConfig for command name (serve, check) with its usage text, whose flag
// set has the flags extra adds besides those of serve (extra may be nil).
func serveConfigOf(name, usage string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (cfg service.Config, ok bool, err error) {
	flags := func(cfg *service.Config, file *string) *flag.FlagSet {
		fs := serveFlags(cfg, file)
		if extra != nil {
			extra(fs)
		}
		return fs
	}
	cfg = service.DefaultConfig()
	var file string
	if ok, err := parseFlags(flags(&cfg, &file), usage, args, stderr, "see authz "+name+" -h"); !ok {
		return cfg, false, err
	}
	if file == "" {
		return cfg, true, nil
	}
	if cfg, err = service.LoadConfig(file); err != nil {
		return cfg, false, usageError("%s: %v", name, err)
	}
	if err := flags(&cfg, new(string)).Parse(args); err != nil {
		return cfg, false, usageError("%s: %v", name, err)
	}
	return cfg, true, nil
}

// listFlag is a list flag (--decision-log-mask, --allowed-host) bound to a configuration list:
// comma-separated, repeatable; the first use replaces the configured list, "" means none.
type listFlag struct {
	list *[]string
	set  bool
}

func (f *listFlag) String() string {
	if f.list == nil {
		return ""
	}
	return strings.Join(*f.list, ",")
}

func (f *listFlag) Set(s string) error {
	if !f.set {
		*f.list = []string{}
		f.set = true
	}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*f.list = append(*f.list, p)
		}
	}
	return nil
}
