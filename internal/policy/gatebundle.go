package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/authz-dev/authz/internal/coded"
)

// ReservedRoots are the data paths only the gate's bundle may reach: authz (the decision and
// everything it reads) and system (OPA's decision-log mask and drop rules, OPA's record of the
// bundles, OPA's own API authorization). A bundle whose manifest declares no roots has the
// root "", which reaches every path, these included.
var ReservedRoots = []string{"authz", "system"}

// BundleRule decides which bundles may activate beside the gate's bundle: it is the one rule
// of `authz serve`'s remote source and of `authz run`'s activator.
type BundleRule struct {
	// Gate is the gate's bundle: the only one whose roots may reach ReservedRoots, and the only
	// one the gate compiles.
	Gate string
	// Multi is whether other bundles are configured: the gate's bundle must then keep its roots
	// within ReservedRoots, so that no other bundle's roots can overlap it (OPA refuses the
	// second of two overlapping bundles, whichever it is).
	Multi bool
	// OtherRegoBytes bounds the Rego of each bundle other than the gate's (0:
	// DefaultOtherBundleRegoBytes); RegoBytesKey is how the configuration spells it, for the
	// error (bundlecost.go).
	OtherRegoBytes int64
	RegoBytesKey   string
	// OtherDataBytes bounds the data files of each bundle other than the gate's (0: none, as
	// under `authz serve`, whose downloads are bounded as they arrive); DataBytesKey sets it.
	OtherDataBytes int64
	DataBytesKey   string
}

// GateBundle is the gate's bundle among the configured bundles names: named when it is set
// (it must be one of them), else the one bundle configured. key is how the configuration
// spells the setting ("gateBundle", "plugins.authz.gateBundle"), for the error, which gives the
// line to add. With no bundle configured and none named it is "".
func GateBundle(names []string, named, key string) (string, error) {
	names = slices.Sorted(slices.Values(names))
	switch {
	case named != "" && !slices.Contains(names, named):
		if len(names) == 0 {
			return "", fmt.Errorf("%s: %q names no configured bundle: no bundles are configured; remove %s or configure bundles.%s", key, named, key, named)
		}
		return "", fmt.Errorf("%s: %q is not one of the configured bundles (%s): name the bundle the gate decides with", key, named, strings.Join(names, ", "))
	case named != "":
		return named, nil
	case len(names) == 1:
		return names[0], nil
	case len(names) > 1:
		lines := make([]string, len(names))
		for i, n := range names {
			lines[i] = "`" + key + ": " + n + "`"
		}
		return "", fmt.Errorf("%s: %d bundles are configured (%s) and the gate decides with one of them only: add %s, naming the bundle signed by the gate's key", key, len(names), strings.Join(names, ", "), strings.Join(lines, " or "))
	}
	return "", nil
}

// Admit says whether bundle name, whose manifest declares roots (nil: no roots declared, the
// root ""), may activate: a bundle other than the gate's may not reach ReservedRoots, and with
// other bundles configured the gate's bundle must stay within them. The error is a
// POLICY_BUNDLE_ROOTS that says what to change.
func (r BundleRule) Admit(name string, roots *[]string) error {
	rs := []string{""}
	if roots != nil {
		rs = *roots
	}
	shown := fmt.Sprintf("roots %q", rs)
	if slices.Contains(rs, "") {
		shown += " (the root \"\" is all of data; a bundle without .manifest roots has it)"
	}
	if name == r.Gate {
		if !r.Multi {
			return nil
		}
		for _, root := range rs {
			if !bundle.RootPathsContain(ReservedRoots, root) {
				return coded.Errorf(coded.PolicyBundleRoots, "bundle %s is the gate's bundle and has %s: with other bundles configured, its roots must stay within %s so that no other bundle can overlap it; declare them in its .manifest, e.g. {\"roots\": [\"authz\"]}",
					name, shown, strings.Join(ReservedRoots, " and "))
			}
		}
		return nil
	}
	for _, root := range rs {
		for _, res := range ReservedRoots {
			if bundle.RootPathsOverlap(root, res) {
				return coded.Errorf(coded.PolicyBundleRoots, "bundle %s has %s, which reach %s: only the gate's bundle (%s) may provide %s; give bundle %s a .manifest whose roots leave them out, e.g. {\"roots\": [%q]}",
					name, shown, res, r.Gate, strings.Join(ReservedRoots, " and "), name, name)
			}
		}
	}
	return nil
}

// storeRules are the bundle rules of the stores whose activations they govern (an OPA plugin
// manager's store, in `authz serve` and in `authz run`), each with what to tell of a refusal.
var storeRules sync.Map // storage.Store -> *storeRule

type storeRule struct {
	rule    BundleRule
	verdict func(name string, err error) // may be nil
	skip    *unchangedSkip               // SkipUnchanged; nil: every admitted bundle is activated
}

// SetStoreRule makes every bundle activation into store pass rule first (AdmitActivation);
// verdict, when not nil, hears of each bundle's verdict (nil when admitted). ClearStoreRule removes it.
func SetStoreRule(store storage.Store, rule BundleRule, verdict func(name string, err error)) {
	storeRules.Store(store, &storeRule{rule: rule, verdict: verdict})
}

// ClearStoreRule removes the rule of store.
func ClearStoreRule(store storage.Store) { storeRules.Delete(store) }

// AdmitActivation checks the bundles of an activation against the rule of its store (none:
// every bundle is admitted). OPA activates one bundle at a time (a download, a persisted
// bundle at start), so a refused bundle never takes the gate's bundle down with it.
func AdmitActivation(opts *bundle.ActivateOpts) error {
	v, ok := storeRules.Load(opts.Store)
	if !ok {
		return nil
	}
	sr := v.(*storeRule)
	for _, n := range slices.Sorted(maps.Keys(opts.Bundles)) {
		err := sr.rule.Admit(n, opts.Bundles[n].Manifest.Roots)
		if err == nil {
			err = sr.rule.AdmitCost(n, opts.Bundles[n]) // bundlecost.go
		}
		if sr.verdict != nil {
			sr.verdict(n, err)
		}
		if err != nil {
			return err
		}
	}
	if sr.skip != nil {
		return sr.skip.check(opts, sr.rule.Gate)
	}
	return nil
}

// admitActivatorID names the activator that applies the store rules before OPA's own.
const admitActivatorID = "authz-admit"

type admitActivator struct{}

func (admitActivator) Activate(opts *bundle.ActivateOpts) error {
	if err := AdmitActivation(opts); err != nil {
		return err
	}
	return (&bundle.DefaultActivator{}).Activate(opts)
}

var admitOnce sync.Once

// ensureAdmitting makes OPA's activations in this process pass the store rules: unless
// another activator is already the default (`authz run`'s, which applies them itself), authz's
// becomes it.
func ensureAdmitting() {
	admitOnce.Do(func() {
		if bundle.HasExtension() {
			return
		}
		bundle.RegisterActivator(admitActivatorID, admitActivator{})
		bundle.RegisterDefaultBundleActivator(admitActivatorID)
		// With an activator registered, OPA's rego package takes the store of a query that
		// names none from the registered store function (a nil one would panic): the
		// in-memory store, as without. OPA's bundle readers then default to lazy loading;
		// authz's own bundle reads set their mode (readBundleWithin).
		if bundle.BundleExtStore == nil {
			bundle.RegisterStoreFunc(func() storage.Store { return inmem.New() })
		}
	})
}
