package opaplugin

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/authz-dev/authz/internal/configcheck"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/service"
)

// defaultAddr is where the gate's endpoints listen when plugins.authz names no addr: beside
// OPA's own default (localhost:8181), on loopback.
const defaultAddr = "127.0.0.1:8182"

// Config is the plugins.authz section of an OPA configuration. It has the fields of the
// `authz serve` configuration file (docs/service.md, "Configuration"), read the same way and
// with the same defaults, except addr, whose default is defaultAddr:
//
//	plugins:
//	  authz:
//	    addr: 127.0.0.1:8182          # the gate's endpoints (OPA's own stay on --addr)
//	    plugins: [...]                # the driver plugins, as in authz serve; or:
//	    facts: /etc/authz/facts.json  # a static facts file instead of plugins
//	    evalTimeout: 5s               # and the other knobs of authz serve
//
//	    opaWriteAPI: true             # open OPA's policy and data write APIs (off by default)
//	    gateBundle: authz             # the gate's bundle, when OPA's bundles section has several
//	    otherBundleRegoBytes: 131072  # the Rego another bundle may carry (default 128 KiB)
//	    otherBundleDataBytes: 8388608 # the data files another bundle may carry (default 8 MiB)
//
// The policy is not configured here: it is the bundles OPA activates (the bundles section,
// --bundle), copied on their way into OPA's store; the embedded policy when there is none.
type Config struct {
	service.Config
	// OPAWriteAPI opens OPA's policy and data write APIs (opaWriteAPI: true); off by default.
	// What they write serves OPA's own queries only: the gate decides with its bundles.
	OPAWriteAPI bool
	// GateBundle names, among the bundles of OPA's bundles section, the one the gate decides
	// with (gateBundle: NAME); required when there are several, else the one configured.
	GateBundle string
	// OtherBundleRegoBytes and OtherBundleDataBytes bound the Rego and the data files of each
	// bundle other than the gate's (otherBundleRegoBytes, otherBundleDataBytes; 0: the
	// defaults, policy.DefaultOtherBundleRegoBytes and policy.DefaultOtherBundleDataBytes).
	OtherBundleRegoBytes, OtherBundleDataBytes int64

	// rule is the rule of OPA's bundles (the gate's bundle, resolved by Validate from GateBundle
	// and OPA's bundles section); its Gate is "" without a bundles section.
	rule policy.BundleRule
	// staticFacts is the facts file, loaded by Validate, when Facts is set.
	staticFacts *server.StaticFacts
	// logFormatSet is whether the section sets log.json (FollowLogFormat leaves it then).
	logFormatSet bool
}

// Usage is the gate's part of the help of `authz run`, printed before OPA's.
const Usage = `authz run is OPA's run command with the authz gate built in. The OPA plugin plugins.authz
serves the gate's endpoints (POST /v1/authorize, /v1/capabilities, /v1/data/authz/decision,
AuthZEN, GET /v1/plugins, /health, /metrics, ...) on an address of its own, beside OPA's API
(--addr). It decides with the policy of the bundles OPA activates (--bundle, or the bundles
section), and with the embedded policy when there is none.

The gate serves only when OPA's configuration has a plugins.authz section; its fields are
those of the authz serve configuration file, addr defaulting to ` + defaultAddr + `:

  plugins:
    authz:
      addr: ` + defaultAddr + `      # the gate's endpoints
      # plugins: [...]             # the driver plugins (default: the built-in example driver)
      # facts: facts.json          # or a static facts file instead of plugins
      # opaWriteAPI: true          # open OPA's policy and data write APIs (off by default)
      # gateBundle: NAME           # the bundle the gate decides with (required with several)

  authz run --server -c examples/opa.yaml --bundle policies

The gate's log follows --log-format unless the section sets log.json. OPA's decision log
masks /input/environment/config unless a mask policy (data.system.log.mask),
decision_logs.mask_decision or opaWriteAPI is configured. More: docs/service.md, "Running inside OPA".
`

// Configured reports whether an OPA boot configuration has a plugins.authz section: in the
// configuration file src, or in one of the --set and --set-file overrides (key=value), and
// whether it configures discovery (which may add the section later).
func Configured(src []byte, overrides []string) (configured, discovery bool) {
	var doc struct {
		Plugins   map[string]any `yaml:"plugins"`
		Discovery any            `yaml:"discovery"`
	}
	_ = yaml.Unmarshal(src, &doc) // OPA reports a configuration it cannot read
	_, configured = doc.Plugins[Name]
	discovery = doc.Discovery != nil
	for _, o := range overrides {
		key, _, _ := strings.Cut(o, "=")
		key = strings.TrimSpace(key)
		if key == section || strings.HasPrefix(key, section+".") {
			configured = true
		}
		if key == "discovery" || strings.HasPrefix(key, "discovery.") {
			discovery = true
		}
	}
	return configured, discovery
}

// FollowLogFormat writes the gate's log as JSON lines when json is true (OPA's --log-format is
// json), as text otherwise, unless the section sets log.json itself.
func (c *Config) FollowLogFormat(json bool) {
	if !c.logFormatSet {
		c.Log.JSON = json
	}
}

// writeAPIField is the field of plugins.authz that opens OPA's write APIs.
const writeAPIField = "opaWriteAPI"

// gateBundleField is the field of plugins.authz that names the gate's bundle.
const gateBundleField = "gateBundle"

// regoBytesField and dataBytesField bound what a bundle other than the gate's may carry.
const (
	regoBytesField = "otherBundleRegoBytes"
	dataBytesField = "otherBundleDataBytes"
)

// fieldNames are the fields of plugins.authz, as the YAML and JSON spell them.
// The policy keys of authz serve (bundle, opa, ...) are not among them: the policy is OPA's.
var fieldNames = func() []string {
	var names []string
	var collect func(t reflect.Type)
	collect = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			switch {
			case f.Type == reflect.TypeFor[policy.Config]():
			case name == "" && opts == "inline":
				collect(f.Type)
			case name != "" && name != "-":
				names = append(names, name)
			}
		}
	}
	collect(reflect.TypeFor[service.Config]())
	names = append(names, writeAPIField, gateBundleField, regoBytesField, dataBytesField)
	slices.Sort(names)
	return names
}()

// parseConfig reads the plugins.authz section (the JSON OPA hands a plugin, or YAML) over the
// defaults and checks it. Every error names its field below plugins.authz (configcheck.Under).
func parseConfig(raw []byte, plugins bool) (*Config, error) {
	cfg, err := parseSection(raw, plugins)
	if err != nil {
		return nil, configcheck.Under(section, err)
	}
	return cfg, nil
}

// parseSection is parseConfig with the errors naming the fields of the section itself
// ("addr: ..."), as the authz serve configuration's do.
func parseSection(raw []byte, plugins bool) (*Config, error) {
	var present map[string]any
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := yaml.Unmarshal(raw, &present); err != nil {
			return nil, fmt.Errorf("must be an object with the fields %s (%s)", strings.Join(fieldNames, ", "),
				strings.Join(strings.Fields(err.Error()), " "))
		}
	}
	var p configcheck.Problems
	for _, k := range slices.Sorted(maps.Keys(present)) {
		if !slices.Contains(fieldNames, k) {
			p.Add(k, "unknown field; the fields are %s", strings.Join(fieldNames, ", "))
		}
	}
	if _, ok := present["facts"]; ok {
		for _, other := range []string{"plugins", "builtinProviders"} {
			if _, both := present[other]; both {
				p.Add(other, "must not be set together with %s.facts: a facts file replaces the driver plugins and their built-in providers; remove one of the two", section)
			}
		}
	}
	writeAPI, gateBundle := false, ""
	if v, ok := present[writeAPIField]; ok {
		b, isBool := v.(bool)
		if !isBool {
			p.Add(writeAPIField, "must be true or false; got %v", v)
		}
		writeAPI = b
	}
	if v, ok := present[gateBundleField]; ok {
		s, isString := v.(string)
		if !isString || s == "" {
			p.Add(gateBundleField, "must name a bundle of OPA's bundles section; got %v", v)
		}
		gateBundle = s
	}
	bounds := map[string]int64{}
	for _, f := range []string{regoBytesField, dataBytesField} {
		v, ok := present[f]
		if !ok {
			continue
		}
		n, isInt := v.(int)
		if !isInt || n <= 0 {
			p.Add(f, "must be a positive number of bytes; got %v", v)
		}
		bounds[f] = int64(n)
	}
	_, setW := present[writeAPIField]
	_, setG := present[gateBundleField]
	if setW || setG || len(bounds) > 0 {
		delete(present, writeAPIField)
		delete(present, gateBundleField)
		delete(present, regoBytesField)
		delete(present, dataBytesField)
		rest, err := yaml.Marshal(present)
		p.Include(err)
		raw = rest
	}
	if err := p.Err(); err != nil {
		return nil, err
	}

	sc, err := service.ParseConfig(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if _, ok := present["addr"]; !ok {
		sc.Server.Addr = defaultAddr
	}
	if sc, err = sc.Resolve(); err != nil {
		return nil, err
	}
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	cfg := &Config{Config: sc, OPAWriteAPI: writeAPI, GateBundle: gateBundle,
		OtherBundleRegoBytes: bounds[regoBytesField], OtherBundleDataBytes: bounds[dataBytesField]}
	if log, ok := present["log"].(map[string]any); ok {
		_, cfg.logFormatSet = log["json"]
	}
	switch {
	case sc.Facts != "":
		if cfg.staticFacts, err = server.LoadStaticFacts(sc.Facts); err != nil {
			return nil, &configcheck.FieldError{Field: "facts", Err: fmt.Errorf("%s: %w", sc.Facts, err)}
		}
	case !plugins:
		return nil, &configcheck.FieldError{Field: "facts", Err: errors.New("required: this build runs no driver plugins, so the gate needs a static facts file")}
	}
	return cfg, nil
}

// equal reports whether two configurations would run the same gate.
func (c *Config) equal(o *Config) bool {
	return reflect.DeepEqual(c.Config, o.Config) && c.OPAWriteAPI == o.OPAWriteAPI && c.GateBundle == o.GateBundle &&
		c.OtherBundleRegoBytes == o.OtherBundleRegoBytes && c.OtherBundleDataBytes == o.OtherBundleDataBytes
}

// CheckSection parses and checks a plugins.authz section (YAML or JSON) as Validate does,
// without an OPA plugin manager (`authz check --opa-config`): it starts and binds nothing, and
// returns the gate's service configuration. Errors name their fields below plugins.authz.
// OPA's keys and bundles sections are not looked at here (OPA's own configuration check does).
func (f Factory) CheckSection(raw []byte) (service.Config, error) {
	cfg, err := parseConfig(raw, f.Plugins)
	if err != nil {
		return service.Config{}, err
	}
	return cfg.Config, nil
}
