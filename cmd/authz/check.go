package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.yaml.in/yaml/v3"

	"github.com/authz-dev/authz/internal/configcheck"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/opaplugin"
	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/service"
)

const checkUsage = `Usage: authz check [--config FILE] [serve flags] [--fetch]
       authz check --opa-config FILE

Checks a configuration without starting anything: what authz serve would refuse, or fail on,
when it starts with the same file and flags. It reads the configuration as serve does and
validates it, hashes every plugin's binary against its sha256 pin (no driver is started),
compiles the policy and verifies its signature (the embedded policy or --bundle; remote
bundles under opa: are downloaded and verified only with --fetch), loads the facts file, the
TLS certificate, key and client CA and the bearer tokens file, and checks that the decision
log could be written. It binds no address and writes no file.

With --opa-config it checks the plugins.authz section of an OPA configuration for authz run
the same way (the policy there is OPA's: check its bundle with opa build or opa check).

Every problem is printed on a line of its own, named by its field and, when the file holds
it, its line. Exit status: 0 when the configuration would start, 2 when it has a problem.

Flags (besides those of authz serve):
`

// checkFetchTimeout bounds the download and activation of remote bundles under --fetch.
const checkFetchTimeout = 30 * time.Second

func runCheck(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	var (
		fetch     bool
		opaConfig string
	)
	extra := func(fs *flag.FlagSet) {
		fs.BoolVar(&fetch, "fetch", false, "download and verify the remote bundles of the opa: section (they are otherwise only validated)")
		fs.StringVar(&opaConfig, "opa-config", "", "check the plugins.authz section of this OPA configuration file (authz run) instead")
	}
	cfg, ok, err := serveConfigOf("check", checkUsage, args, stderr, extra)
	if !ok {
		return err
	}
	c := &checker{ctx: ctx, fetch: fetch}
	name := cfg.File
	if opaConfig != "" {
		name = opaConfig
		c.checkOPAConfig(opaConfig)
	} else {
		c.checkServe(cfg)
	}
	if name == "" {
		name = "flags and defaults"
	}
	if len(c.problems) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "check: %s: %d problem(s); authz would not start with this configuration:", name, len(c.problems))
		for _, p := range c.problems {
			b.WriteString("\n  " + p.Error())
		}
		return &exitError{code: 2, msg: b.String()}
	}
	_, err = fmt.Fprintf(stdout, "%s: ok\n  %s\n", name, strings.Join(c.notes, "\n  "))
	return err
}

// checker collects the problems (and, for a good configuration, what was checked) of one
// configuration.
type checker struct {
	ctx      context.Context
	fetch    bool
	src      []byte // the YAML file the fields are in, for their lines
	prefix   string // the fields' place in src ("plugins.authz" for an OPA configuration)
	problems []error
	notes    []string
}

// add records the problems of err, each with its line in c.src when the file holds its field.
func (c *checker) add(err error) {
	if err == nil {
		return
	}
	if c.prefix != "" {
		err = configcheck.Under(c.prefix, err)
	}
	c.problems = append(c.problems, configcheck.WithLines(err, c.src)...)
}

// checkServe checks the configuration of authz serve: the one Run would resolve, validate
// and assemble.
func (c *checker) checkServe(cfg service.Config) {
	if cfg.File != "" {
		b, err := os.ReadFile(cfg.File)
		if err != nil {
			c.add(err)
			return
		}
		c.src = b
	}
	valid := c.checkService(cfg)
	if valid {
		c.checkPolicy(cfg.Policy, cfg.Decision)
	}
}

// checkOPAConfig checks the plugins.authz section of an OPA configuration file as authz run's
// plugin validates it at start.
func (c *checker) checkOPAConfig(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		c.add(err)
		return
	}
	c.src = b
	var doc struct {
		Plugins map[string]yaml.Node `yaml:"plugins"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		c.add(&configcheck.DocumentError{Name: "opa-config", Err: err})
		return
	}
	section, ok := doc.Plugins[opaplugin.Name]
	if !ok {
		c.add(&configcheck.FieldError{Field: "plugins." + opaplugin.Name, Err: errors.New("missing: authz run starts no gate without this section (examples/opa.yaml)")})
		return
	}
	raw, err := yaml.Marshal(&section)
	if err != nil {
		c.add(err)
		return
	}
	cfg, err := opaplugin.Factory{Plugins: true}.CheckSection(raw)
	if err != nil {
		c.add(err) // named below plugins.authz already
		return
	}
	c.prefix = "plugins." + opaplugin.Name
	c.checkService(cfg)
	c.notes = append(c.notes, "policy: OPA's (authz run); check its bundles with opa build or opa check")
}

// checkService checks what the gate would assemble from cfg besides its policy: the
// configuration's own validation (as NewGate), the facts file or every plugin's pin, and the
// files the server reads. It starts no plugin and binds no address. valid is false when the
// configuration does not validate (the policy is then not compiled).
func (c *checker) checkService(cfg service.Config) (valid bool) {
	cfg, err := cfg.Resolve()
	if err != nil {
		c.add(err)
		return false
	}
	// Every problem at once: the files and pins are checked whatever the validation found.
	verr := cfg.Validate()
	c.add(verr)
	if cfg.Facts != "" {
		if _, err := server.LoadStaticFacts(cfg.Facts); err != nil {
			c.add(&configcheck.FieldError{Field: "facts", Err: fmt.Errorf("%s: %w", cfg.Facts, err)})
		} else {
			c.notes = append(c.notes, "facts: "+cfg.Facts+" (no plugin would start)")
		}
	} else {
		c.checkPins(cfg.Host.Plugins)
	}
	c.add(server.CheckFiles(cfg.Server))
	c.notes = append(c.notes, "addr: "+cfg.Server.Addr+" (not bound by check)")
	return verr == nil
}

// checkPins hashes every enabled plugin's binary and compares it with its pin, as the plugin
// host does before it starts a worker (PIN_MISMATCH); nothing is executed.
func (c *checker) checkPins(plugins []pluginhost.PluginConfig) {
	n := 0
	for i, p := range plugins {
		if p.Enabled != nil && !*p.Enabled {
			continue
		}
		sum, err := pluginhost.FileSHA256(p.Path)
		switch {
		case err != nil:
			c.add(&configcheck.FieldError{Field: fmt.Sprintf("plugins[%d].path", i), Err: fmt.Errorf("%s: %w", p.Path, err)})
		case sum != p.SHA256:
			c.add(&configcheck.FieldError{Field: fmt.Sprintf("plugins[%d].sha256", i),
				Err: fmt.Errorf("does not match %s, whose sha256 is %s: the plugin would fail to start with PIN_MISMATCH (configure the new sha256 if the binary was upgraded on purpose)", p.Path, sum)})
		default:
			n++
		}
	}
	c.notes = append(c.notes, fmt.Sprintf("plugins: %d pinned binaries match their sha256 (none started)", n))
}

// checkPolicy compiles the policy cfg names (and verifies its signature) with policy.Start,
// as the service does, then closes it. Remote bundles are downloaded only with --fetch.
func (c *checker) checkPolicy(cfg policy.Config, dc service.DecisionConfig) {
	_, remote := cfg.OPA["bundles"]
	if remote && !c.fetch {
		c.notes = append(c.notes, "policy: remote bundles under opa: validated, not fetched (--fetch downloads and verifies them)")
		return
	}
	field := "policy"
	switch {
	case remote:
		field = "opa.bundles"
	case cfg.Bundle != "":
		field = "bundle"
	}
	cfg.Watch = false
	if !remote {
		cfg.OPA = nil // no decision-log or status uploads: they would start OPA's plugins
	} else {
		// The download goes to a private directory removed at the end, never to the
		// service's persistence_directory (its accepted bundles and their order), and
		// nothing is reported to the decision-log or status services.
		cfg.OPA = maps.Clone(cfg.OPA)
		for _, k := range []string{"persistence_directory", "decision_logs", "status"} {
			delete(cfg.OPA, k)
		}
	}
	ctx, cancel := context.WithTimeout(c.ctx, checkFetchTimeout)
	defer cancel()
	eng, src, err := policy.Start(ctx, cfg, decision.Options{EvalTimeout: dc.EvalTimeout}, policy.Options{Logger: hclog.NewNullLogger()})
	if err != nil {
		c.add(&configcheck.FieldError{Field: field, Err: err})
		return
	}
	defer src.Close(context.WithoutCancel(ctx))
	for eng.Revision() == "" {
		// A bundle OPA or authz refused (a failed download or verification) is reported at
		// once rather than waited for.
		for name, b := range src.Status().Bundles {
			if b.Code != "" {
				c.add(&configcheck.FieldError{Field: "opa.bundles." + name, Err: fmt.Errorf("%s: %s", b.Code, b.Message)})
				return
			}
		}
		select {
		case <-ctx.Done():
			msg := src.Status().LastError
			if msg == "" {
				msg = "no bundle was activated"
			}
			c.add(&configcheck.FieldError{Field: field, Err: fmt.Errorf("within %v: %s", checkFetchTimeout, msg)})
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.notes = append(c.notes, "policy: "+eng.Revision()+" ("+src.Status().Origin+"), compiled"+map[bool]string{true: " and its signature verified", false: ""}[cfg.VerificationKey != "" || remote])
}
