package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
)

// policyFlags are the flags that say where the policy comes from, with the names and meaning
// they have in `opa run`. Each overrides its configuration key when given.
type policyFlags struct {
	bundle, key, keyID, alg, scope string
	watch                          bool
}

// registerPolicyFlags adds the policy flags to fs; watch adds --watch (authz serve only).
func registerPolicyFlags(fs *flag.FlagSet, watch bool) *policyFlags {
	f := &policyFlags{}
	fs.StringVar(&f.bundle, "bundle", "", "policy bundle: a .tar.gz from `opa build`, or a bundle directory, instead of the embedded policy")
	if watch {
		fs.BoolVar(&f.watch, "watch", false, "re-read --bundle when its files change (for policy authors)")
	}
	fs.StringVar(&f.key, "verification-key", "", "file of the public key (PEM) or HMAC secret that signed --bundle; the bundle must then be signed")
	fs.StringVar(&f.keyID, "verification-key-id", policy.DefaultVerificationKeyID, "name of --verification-key: the signature's kid must be this name")
	fs.StringVar(&f.alg, "signing-alg", policy.DefaultSigningAlg, "algorithm of --verification-key")
	fs.StringVar(&f.scope, "scope", "", "scope the bundle's signature must carry")
	return f
}

// apply writes the flags that were given over cfg.
func (f *policyFlags) apply(fs *flag.FlagSet, cfg *policy.Config) {
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "bundle":
			cfg.Bundle = f.bundle
		case "watch":
			cfg.Watch = f.watch
		case "verification-key":
			cfg.VerificationKey = f.key
		case "verification-key-id":
			cfg.VerificationKeyID = f.keyID
		case "signing-alg":
			cfg.SigningAlg = f.alg
		case "scope":
			cfg.Scope = f.scope
		}
	})
}

// startPolicy makes an engine and activates its first policy from cfg: the embedded policy, a
// bundle file or directory, or remote bundles (then the engine has no policy, and the service
// is not ready, until the first bundle is activated). Close the source after the service stops.
func startPolicy(ctx context.Context, cfg policy.Config, opts decision.Options, logger hclog.Logger) (*decision.Engine, *policy.Source, error) {
	eng := decision.NewEmpty(opts)
	src, err := policy.New(cfg, eng, policy.Options{Logger: logger})
	if err != nil {
		return nil, nil, err
	}
	if err := src.Start(ctx); err != nil {
		src.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	return eng, src, nil
}
