// Package policy is the one place the policy of authz comes from: the bundle embedded in the
// binary, a bundle file or directory (as `opa run --bundle` reads it), or remote bundles
// downloaded by OPA's plugin manager from an OPA configuration document. A Source compiles each
// new bundle off the hot path, checks it, and activates it in a decision.Engine; a bundle that
// fails to download, verify, compile or check never replaces the active one.
package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
	opaconfig "github.com/open-policy-agent/opa/v1/config"
	"github.com/open-policy-agent/opa/v1/keys"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/configcheck"
)

// Defaults of the verification flags, those of `opa run`.
const (
	DefaultVerificationKeyID = "default"
	DefaultSigningAlg        = "RS256"
)

// Config says where the policy comes from. The zero value is the embedded policy. Its YAML keys
// sit at the top level of the `authz serve` configuration file, beside the flags of the same
// meaning (--bundle, --watch, --verification-key, --verification-key-id, --signing-alg,
// --scope), and `opa:` is a standard OPA configuration document.
type Config struct {
	// Bundle is a bundle file (.tar.gz, as `opa build` writes it) or a bundle directory.
	Bundle string `yaml:"bundle"`
	// Watch re-reads Bundle when it changes (for policy authors, like `opa run --watch`).
	Watch bool `yaml:"watch"`
	// VerificationKey is a file holding the public key (PEM) or HMAC secret that signed Bundle.
	// When set, Bundle must carry a valid .signatures.json covering every file.
	VerificationKey string `yaml:"verificationKey"`
	// VerificationKeyID names VerificationKey; the signature's "kid" must be this name.
	VerificationKeyID string `yaml:"verificationKeyId"`
	// SigningAlg is the algorithm of VerificationKey (RS256 when empty).
	SigningAlg string `yaml:"signingAlg"`
	// Scope is the scope the signature must carry.
	Scope string `yaml:"scope"`
	// GateBundle names, among the bundles of the opa section, the one the gate decides with
	// (required when there are several; with one it is that one). Only it may reach authz and
	// system (ReservedRoots); any other bundle whose roots reach them is refused.
	GateBundle string `yaml:"gateBundle"`
	// OtherBundleRegoBytes bounds the Rego of each bundle of the opa section other than the
	// gate's (0: DefaultOtherBundleRegoBytes, 128 KiB); a bundle over it is refused before
	// activation (POLICY_BUNDLE_TOO_LARGE).
	OtherBundleRegoBytes int64 `yaml:"otherBundleRegoBytes"`
	// OPA is an OPA configuration document (services, bundles, keys, decision_logs, status,
	// persistence_directory, labels, …) handed as it is to OPA's plugin manager.
	OPA map[string]any `yaml:"opa"`
}

// Origin kinds, the first word of Status.Origin.
const (
	OriginEmbedded = api.OriginEmbedded
	OriginFile     = api.OriginFile
	OriginRemote   = api.OriginRemote
)

// provider is one kind of policy source: where the policy comes from and how a new one is
// found. A Source holds the one its Config selects and hands it its life cycle.
type provider interface {
	// start activates the first policy, or arranges for it to be activated as it arrives.
	start(ctx context.Context) error
	// reload looks for a new policy now.
	reload(ctx context.Context) error
	// status adds what the provider knows of its bundles to st, a copy of the Source's status;
	// the Source's mutex is held.
	status(st *Status)
	// close stops whatever start started; the active policy stays.
	close(ctx context.Context)
}

// kind is a kind of policy source: its origin kind (the first word of Status.Origin), whether a
// Config selects it, and its provider.
type kind struct {
	name    string
	selects func(c Config) bool
	new     func(s *Source) provider
}

// kinds are the kinds of policy source, in the order a Config selects them: the first whose
// selects is true. A new kind of source is a file with its provider and one entry here.
var kinds = []kind{
	{name: OriginFile, selects: func(c Config) bool { return c.Bundle != "" }, new: newFileProvider},                          // file.go
	{name: OriginRemote, selects: func(c Config) bool { return len(c.OPA) > 0 && c.remoteBundles() }, new: newRemoteProvider}, // remote.go
	{name: OriginEmbedded, selects: func(Config) bool { return true }, new: newEmbeddedProvider},                              // embedded.go
}

// kind is the kind of source the configuration selects.
func (c Config) kind() kind {
	for _, k := range kinds {
		if k.selects(c) {
			return k
		}
	}
	return kinds[len(kinds)-1]
}

// Kind is the origin kind the configuration selects.
func (c Config) Kind() string { return c.kind().name }

func (c Config) remoteBundles() bool {
	_, a := c.OPA["bundles"]
	_, b := c.OPA["bundle"]
	return a || b
}

// Validate checks the configuration. Every problem is reported, one per line, naming the key the
// way the file spells it, and saying what to do.
func (c Config) Validate() error {
	v := &configcheck.Problems{}
	if c.Bundle != "" && c.remoteBundles() {
		v.Add("bundle", "the policy comes from one source at a time: remove bundle (--bundle) to use the bundles of the opa section, or remove opa.bundles to use %s", c.Bundle)
	}
	if c.Bundle != "" {
		if _, err := os.Stat(c.Bundle); err != nil {
			v.Add("bundle", "%v: give a bundle file (.tar.gz from `opa build`) or a bundle directory", err)
		}
	}
	if c.Bundle == "" {
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"watch", c.Watch}, {"verificationKey", c.VerificationKey != ""}, {"verificationKeyId", c.VerificationKeyID != ""},
			{"signingAlg", c.SigningAlg != ""}, {"scope", c.Scope != ""},
		} {
			if f.set {
				v.Add(f.name, "applies to a bundle file or directory only: set bundle (--bundle PATH) too, or use keys and bundles.*.signing in the opa section for remote bundles")
			}
		}
	}
	if c.VerificationKey != "" {
		if _, err := os.Stat(c.VerificationKey); err != nil {
			v.Add("verificationKey", "%v: give the file of the public key (PEM) or HMAC secret that signed the bundle", err)
		}
	} else {
		for _, f := range []struct {
			name string
			set  bool
		}{{"verificationKeyId", c.VerificationKeyID != ""}, {"signingAlg", c.SigningAlg != ""}, {"scope", c.Scope != ""}} {
			if f.set && c.Bundle != "" {
				v.Add(f.name, "needs verificationKey (--verification-key FILE): without a key no signature is verified")
			}
		}
	}
	if c.OtherBundleRegoBytes < 0 {
		v.Add("otherBundleRegoBytes", "must be a positive number of bytes (0 or unset: %d)", DefaultOtherBundleRegoBytes)
	}
	if c.GateBundle != "" && len(c.OPA) == 0 {
		v.Add("gateBundle", "applies to the bundles of the opa section only: remove it, or configure opa.bundles")
	}
	if c.SigningAlg != "" && !keys.IsSupportedAlgorithm(c.SigningAlg) {
		v.Add("signingAlg", "%q is not an algorithm OPA verifies: use RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, HS256, HS384 or HS512", c.SigningAlg)
	}
	if len(c.OPA) > 0 {
		if _, err := c.opaConfig(); err != nil {
			v.Add("opa", "%v", err)
		} else if _, err := c.bundleRule(); err != nil {
			v.Add("gateBundle", "%v", strings.TrimPrefix(err.Error(), "gateBundle: "))
		}
		if _, err := c.Tracing(); err != nil {
			v.Include(err) // each line names its opa.distributed_tracing key
		}
	}
	return v.Err()
}

// opaRaw is the opa section as the JSON document OPA's plugin manager reads.
func (c Config) opaRaw() ([]byte, error) {
	b, err := json.Marshal(c.OPA)
	if err != nil {
		return nil, fmt.Errorf("not a JSON-shaped document: %w", err)
	}
	return b, nil
}

// opaConfig parses the opa section with OPA's own parser and checks what authz relies on: when
// keys are configured, every bundle has a signing block, so that an unsigned bundle is refused
// (OPA would accept one), and each bundle is bound to one key (CheckBundleSigning).
func (c Config) opaConfig() (*opaconfig.Config, error) {
	raw, err := c.opaRaw()
	if err != nil {
		return nil, err
	}
	oc, err := opaconfig.ParseConfig(raw, "authz")
	if err != nil {
		return nil, err
	}
	if len(oc.Discovery) > 0 && string(oc.Discovery) != "null" {
		return nil, errors.New("discovery is not supported: configure services and bundles directly")
	}
	bundles, err := signingBlocks(oc)
	if err != nil {
		return nil, err
	}
	if _, set := c.OPA["bundles"]; set && len(bundles) == 0 {
		return nil, errors.New("bundles: name at least one bundle (bundles.NAME.service, bundles.NAME.resource), or remove the key")
	}
	if len(oc.Bundle) > 0 && string(oc.Bundle) != "null" {
		return nil, errors.New("bundle: the single-bundle key is deprecated in OPA: write bundles.NAME instead")
	}
	if err := CheckBundleSigning(oc); err != nil {
		return nil, err
	}
	return oc, nil
}

// bundleRule is the rule of the opa section's bundles: the gate's bundle (gateBundle, or the
// one bundle configured) and whether others are configured.
func (c Config) bundleRule() (BundleRule, error) {
	oc, err := c.opaConfig()
	if err != nil {
		return BundleRule{}, err
	}
	blocks, err := signingBlocks(oc)
	if err != nil {
		return BundleRule{}, err
	}
	names := slices.Sorted(maps.Keys(blocks))
	gate, err := GateBundle(names, c.GateBundle, "gateBundle")
	if err != nil {
		return BundleRule{}, err
	}
	return BundleRule{Gate: gate, Multi: len(names) > 1, OtherRegoBytes: c.OtherBundleRegoBytes, RegoBytesKey: "otherBundleRegoBytes"}, nil
}

// signingBlocks are the signing blocks of the bundles section of oc, by bundle name (an empty
// block for a bundle without one).
func signingBlocks(oc *opaconfig.Config) (map[string]json.RawMessage, error) {
	var bundles map[string]struct {
		Signing json.RawMessage `json:"signing"`
	}
	if len(oc.Bundles) > 0 {
		if err := json.Unmarshal(oc.Bundles, &bundles); err != nil {
			return nil, fmt.Errorf("bundles: %w", err)
		}
	}
	out := make(map[string]json.RawMessage, len(bundles))
	for n, b := range bundles {
		out[n] = b.Signing
	}
	return out, nil
}

// CheckBundleSigning checks the keys and bundles sections of an OPA configuration the way
// authz holds them, wherever OPA downloads its policy (authz serve's opa section, authz run's
// OPA configuration): when keys are configured, every bundle has a signing block, and with more
// than one key the block names the key that signs the bundle (checkSigning). The error names
// the key as the OPA configuration spells it (bundles.NAME.signing) and says what to add.
func CheckBundleSigning(oc *opaconfig.Config) error {
	bundles, err := signingBlocks(oc)
	if err != nil {
		return err
	}
	var keyNames []string
	if len(oc.Keys) > 0 && string(oc.Keys) != "null" {
		var ks map[string]json.RawMessage
		if err := json.Unmarshal(oc.Keys, &ks); err != nil {
			return fmt.Errorf("keys: %w", err)
		}
		keyNames = slices.Sorted(maps.Keys(ks))
	}
	for _, n := range slices.Sorted(maps.Keys(bundles)) {
		if err := checkSigning(n, bundles[n], keyNames); err != nil {
			return err
		}
	}
	return nil
}

// checkSigning checks the signing block of bundle name against the configured keys. With keys,
// the block is required. With more than one key it must name the bundle's key (keyid): OPA
// otherwise lets the signature's kid pick any configured key, so the holder of any key could
// sign any bundle. With one key, `signing: {}` verifies with that key.
func checkSigning(name string, raw json.RawMessage, keys []string) error {
	s := strings.TrimSpace(string(raw))
	signed := s != "" && s != "null"
	if !signed {
		if len(keys) > 0 {
			return fmt.Errorf("bundles.%s: keys are configured but this bundle has no signing block, so OPA would accept it unsigned: add `signing: {keyid: NAME}` naming the key that signs it (%s)", name, strings.Join(keys, ", "))
		}
		return nil
	}
	var sg struct {
		KeyID string `json:"keyid"`
	}
	if err := json.Unmarshal(raw, &sg); err != nil {
		return fmt.Errorf("bundles.%s.signing: %w", name, err)
	}
	switch {
	case len(keys) == 0:
		return fmt.Errorf("bundles.%s.signing: no keys are configured to verify it: add the public key under keys", name)
	case sg.KeyID != "" && !slices.Contains(keys, sg.KeyID):
		return fmt.Errorf("bundles.%s.signing.keyid: %q is not one of keys (%s): name the key that signs this bundle", name, sg.KeyID, strings.Join(keys, ", "))
	case sg.KeyID == "" && len(keys) > 1:
		alts := make([]string, len(keys))
		for i, k := range keys {
			alts[i] = "`signing: {keyid: " + k + "}`"
		}
		return fmt.Errorf("bundles.%s.signing: %d keys are configured, so this bundle must name the one key that signs it, else any of them could sign it: add %s", name, len(keys), strings.Join(alts, " or "))
	}
	return nil
}

// verification is the verification configuration of a bundle file, as `opa run` builds it from
// its flags, except that the key is listed under its id without being forced: the signature's
// "kid" picks the key, so a signature without a kid, or with a kid not configured, is refused.
func (c Config) verification() (*bundle.VerificationConfig, error) {
	if c.VerificationKey == "" {
		return nil, nil
	}
	key, err := os.ReadFile(c.VerificationKey)
	if err != nil {
		return nil, fmt.Errorf("verificationKey: %w", err)
	}
	alg := c.SigningAlg
	if alg == "" {
		alg = DefaultSigningAlg
	}
	id := c.VerificationKeyID
	if id == "" {
		id = DefaultVerificationKeyID
	}
	kc := &keys.Config{Key: string(key), Algorithm: alg, Scope: c.Scope}
	return bundle.NewVerificationConfig(map[string]*keys.Config{id: kc}, "", c.Scope, nil), nil
}
