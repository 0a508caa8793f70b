package main

import (
	"flag"

	"github.com/authz-dev/authz/internal/policy"
)

// policyFlags binds the flags that say where the policy comes from to cfg, with the names and
// meaning they have in `opa run`; each overrides its configuration key when given. watch adds
// --watch (authz serve only).
func policyFlags(fs *flag.FlagSet, cfg *policy.Config, watch bool) {
	fs.StringVar(&cfg.Bundle, "bundle", cfg.Bundle, "policy bundle at `PATH`: a .tar.gz from opa build, or a bundle directory, instead of the embedded policy")
	if watch {
		fs.BoolVar(&cfg.Watch, "watch", cfg.Watch, "re-read --bundle when its files change (for policy authors)")
	}
	fs.StringVar(&cfg.VerificationKey, "verification-key", cfg.VerificationKey, "file of the public key (PEM) or HMAC secret that signed --bundle; the bundle must then be signed")
	fs.StringVar(&cfg.VerificationKeyID, "verification-key-id", cfg.VerificationKeyID, "name of --verification-key: the signature's kid must be this name (default \""+policy.DefaultVerificationKeyID+"\")")
	fs.StringVar(&cfg.SigningAlg, "signing-alg", cfg.SigningAlg, "algorithm of --verification-key (default "+policy.DefaultSigningAlg+")")
	fs.StringVar(&cfg.Scope, "scope", cfg.Scope, "scope the bundle's signature must carry")
}
