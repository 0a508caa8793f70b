package policy

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/bundle"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/authz-dev/authz/internal/coded"
)

// DefaultOtherBundleRegoBytes bounds the Rego of a bundle other than the gate's
// (otherBundleRegoBytes, plugins.authz.otherBundleRegoBytes): OPA's bundle plugin activates one
// bundle at a time under one lock and compiles every module of its store at each activation, so
// the compile of another bundle's Rego holds up the gate's bundle (a revocation) for as long as
// it lasts, and every activation of the gate's bundle compiles the other bundles' modules too.
// Measured on a loaded 2-core machine with rules of a comprehension each, another bundle of
// 128 KiB of Rego delays the gate's new revision by about a second (1.7 s, 93 MB peak), of
// 1 MiB by 10-13 s at a 570-600 MB peak.
const DefaultOtherBundleRegoBytes = 128 << 10

// DefaultOtherBundleDataBytes bounds the data files of a bundle other than the gate's under
// `authz run` (plugins.authz.otherBundleDataBytes), whose downloads OPA bounds by its own
// size_limit_bytes only (1 GiB per file unless set): the bound of a whole bundle under
// `authz serve`.
const DefaultOtherBundleDataBytes = DefaultBundleTotalBytes

// otherRegoLimit is the bound of the Rego of a bundle other than the gate's.
func (r BundleRule) otherRegoLimit() int64 {
	if r.OtherRegoBytes > 0 {
		return r.OtherRegoBytes
	}
	return DefaultOtherBundleRegoBytes
}

// AdmitCost says whether bundle b, named name, may cost its activation: a bundle other than
// the gate's may carry at most otherRegoLimit bytes of Rego (its data is bounded by the
// download's bounds). The error is a POLICY_BUNDLE_TOO_LARGE that names the key to raise.
func (r BundleRule) AdmitCost(name string, b *bundle.Bundle) error {
	if name == r.Gate || b == nil {
		return nil
	}
	var n int64
	for _, m := range b.Modules {
		n += int64(len(m.Raw))
	}
	if lim := r.otherRegoLimit(); n > lim {
		key := r.RegoBytesKey
		if key == "" {
			key = "otherBundleRegoBytes"
		}
		return coded.Errorf(coded.PolicyBundleTooLarge, "bundle %s carries %d bytes of Rego in %d modules, over the %d bytes a bundle other than the gate's (%s) may carry (%s): every activation compiles it under the lock the gate's bundle waits for; shrink it, or raise %s",
			name, n, len(b.Modules), lim, r.Gate, key, key)
	}
	if r.OtherDataBytes <= 0 {
		return nil
	}
	var d int64
	for _, f := range b.Raw { // a bundle read lazily, as OPA reads downloads: its data files, undecoded
		if p := path.Base(f.Path); p == "data.json" || bundle.IsYAMLDataFile(f.Path) {
			d += int64(len(f.Value))
		}
	}
	if d > r.OtherDataBytes {
		key := cmp.Or(r.DataBytesKey, "otherBundleDataBytes")
		return coded.Errorf(coded.PolicyBundleTooLarge, "bundle %s carries %d bytes of data files, over the %d bytes a bundle other than the gate's (%s) may carry (%s): it is not activated (nor decoded); shrink it, or raise %s, and bound its download with OPA's bundles.%s.size_limit_bytes",
			name, d, r.OtherDataBytes, r.Gate, key, key, name)
	}
	return nil
}

// ErrBundleUnchanged is what an activation of a bundle other than the gate's returns when its
// content is that of its active copy (a server without ETag serves it again at every poll): it
// is not activated nor compiled again, and the active copy stays. OPA counts it as a failed
// activation and retries with back-off; authz shows and counts it as unchanged.
var ErrBundleUnchanged = errors.New("bundle unchanged: the content of its active copy, not activated again")

// unchangedSkip is the record of one store's active bundle contents, by bundle name, for
// SkipUnchanged; digests of activations not yet committed wait under their transaction.
type unchangedSkip struct {
	mu        sync.Mutex
	triggered bool
	active    map[string]string            // bundle -> content digest
	pending   map[uint64]map[string]string // transaction -> bundle -> content digest
}

// SkipUnchanged makes the activations into store of a bundle other than the store rule's
// gate whose content is that of its active copy fail with ErrBundleUnchanged before OPA
// compiles anything. Call it after SetStoreRule.
func SkipUnchanged(store storage.Store) {
	v, ok := storeRules.Load(store)
	if !ok {
		return
	}
	sr := v.(*storeRule)
	sr.skip = &unchangedSkip{active: map[string]string{}, pending: map[uint64]map[string]string{}}
}

// check returns ErrBundleUnchanged when every bundle of the activation is unchanged, else
// records their digests under the activation's transaction, made active when it commits.
func (u *unchangedSkip) check(opts *bundle.ActivateOpts, gate string) error {
	digests := make(map[string]string, len(opts.Bundles))
	same := len(opts.Bundles) > 0
	for n, b := range opts.Bundles {
		d := contentDigestOf(b)
		digests[n] = d
		if n == gate || d == "" || u.activeDigest(n) != d {
			same = false
		}
	}
	if same {
		return ErrBundleUnchanged
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.triggered && opts.Txn != nil {
		ctx := opts.Ctx
		if ctx == nil {
			ctx = context.Background()
		}
		if _, err := opts.Store.Register(ctx, opts.Txn, storage.TriggerConfig{OnCommit: u.onCommit}); err != nil {
			return nil // without the record, nothing is skipped
		}
		u.triggered = true
	}
	if opts.Txn != nil {
		u.pending[opts.Txn.ID()] = digests
	}
	return nil
}

func (u *unchangedSkip) activeDigest(n string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.active[n]
}

// onCommit makes the digests of a committed activation active; those of earlier transactions
// still pending were aborted.
func (u *unchangedSkip) onCommit(_ context.Context, txn storage.Transaction, _ storage.TriggerEvent) {
	u.mu.Lock()
	defer u.mu.Unlock()
	id := txn.ID()
	for n, d := range u.pending[id] {
		u.active[n] = d
	}
	for pid := range u.pending {
		if pid <= id {
			delete(u.pending, pid)
		}
	}
}

// contentDigestOf is a digest of what activating b writes: its manifest, modules and data
// (its signatures aside: the same content signed again is the same content). "" when it
// cannot be made.
func contentDigestOf(b *bundle.Bundle) string {
	if b == nil || b.Type() == bundle.DeltaBundleType {
		return ""
	}
	h := sha256.New()
	put := func(s string) {
		_, _ = h.Write([]byte(strings.ReplaceAll(s, "\x00", "\x00\x01")))
		_, _ = h.Write([]byte{0})
	}
	mf, err := json.Marshal(b.Manifest)
	if err != nil {
		return ""
	}
	put(string(mf))
	mods := slices.Clone(b.Modules)
	slices.SortFunc(mods, func(x, y bundle.ModuleFile) int { return strings.Compare(x.Path, y.Path) })
	for _, m := range mods {
		put("module")
		put(m.Path)
		put(string(m.Raw))
	}
	data, err := json.Marshal(b.Data)
	if err != nil {
		return ""
	}
	put("data")
	put(string(data))
	raws := slices.Clone(b.Raw)
	slices.SortFunc(raws, func(x, y bundle.Raw) int { return strings.Compare(x.Path, y.Path) })
	for _, r := range raws {
		put("raw")
		put(r.Path)
		put(string(r.Value))
	}
	if len(b.WasmModules) > 0 || len(b.PlanModules) > 0 {
		return "" // not compared
	}
	return hex.EncodeToString(h.Sum(nil))
}

// unchangedStatus clears OPA's status of a bundle whose activation was skipped as unchanged
// (ErrBundleUnchanged): it is no failure. It reports whether it was one.
func unchangedStatus(st *bundleplugin.Status) bool {
	if st.Code == "" || !strings.Contains(st.Message, ErrBundleUnchanged.Error()) {
		return false
	}
	st.Code, st.Message, st.Errors = "", "", nil
	return true
}

// errRegoBound is the cause of a download of a bundle other than the gate's cut for its Rego:
// the bound of its activation (AdmitCost), applied as the download arrives, before OPA reads
// and parses the modules (parsing them costs as much memory as compiling them).
var errRegoBound = errors.New("too much Rego for a bundle other than the gate's")

// regoBound bounds the Rego of the downloads of the bundles other than the gate's, found by
// their URL (a download redirected elsewhere is bounded at its activation only).
type regoBound struct {
	urls  map[string]bool // the URLs of the bundles other than the gate's, without query
	bytes int64
	key   string
}

// limitsFor are lim with the Rego bound of the download of u when it is another bundle's.
func (b regoBound) limitsFor(u *url.URL, lim bundleLimits) bundleLimits {
	if len(b.urls) == 0 || u == nil {
		return lim
	}
	cp := *u
	cp.RawQuery, cp.Fragment = "", ""
	if b.urls[cp.String()] {
		lim.regoBytes, lim.regoKey = b.bytes, b.key
	}
	return lim
}

// otherBundleURLs is the Rego bound of the downloads of the opa section (raw JSON) whose
// bundle is not the rule's gate: their URLs as OPA's REST client makes them (the service's
// url, "/", the resource; bundles/NAME when unset). A URL the gate's bundle also has is left out.
func otherBundleURLs(raw []byte, rule BundleRule) regoBound {
	var doc struct {
		Services json.RawMessage `json:"services"`
		Bundles  map[string]struct {
			Service  string `json:"service"`
			Resource string `json:"resource"`
		} `json:"bundles"`
	}
	out := regoBound{urls: map[string]bool{}, bytes: rule.otherRegoLimit(), key: rule.RegoBytesKey}
	if out.key == "" {
		out.key = "otherBundleRegoBytes"
	}
	if err := json.Unmarshal(raw, &doc); err != nil || !rule.Multi {
		return out
	}
	svcs := map[string]string{}
	var byName map[string]struct {
		URL string `json:"url"`
	}
	var list []struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	}
	if json.Unmarshal(doc.Services, &byName) == nil {
		for n, s := range byName {
			svcs[n] = s.URL
		}
	} else if json.Unmarshal(doc.Services, &list) == nil {
		for _, s := range list {
			svcs[s.Name] = s.URL
		}
	}
	urlOf := func(name, svc, res string) string {
		if res == "" {
			res = "bundles/" + name
		}
		if strings.HasPrefix(res, "file://") {
			return ""
		}
		if svc == "" && len(svcs) == 1 {
			for _, u := range svcs {
				svc = u
			}
		} else {
			svc = svcs[svc]
		}
		if svc == "" {
			return ""
		}
		return strings.TrimRight(svc, "/") + "/" + strings.Trim(res, "/")
	}
	gateURL := ""
	if g, ok := doc.Bundles[rule.Gate]; ok {
		gateURL = urlOf(rule.Gate, g.Service, g.Resource)
	}
	for n, b := range doc.Bundles {
		if n == rule.Gate {
			continue
		}
		if u := urlOf(n, b.Service, b.Resource); u != "" && u != gateURL {
			if pu, err := url.Parse(u); err == nil {
				out.urls[pu.String()] = true
			}
		}
	}
	return out
}

// regoBound is the Rego bound of the downloads of r's bundles other than the gate's; none
// without a rule (the policy does not come from bundles).
func (r *remote) regoBound(raw []byte) regoBound {
	if r.rule.Gate == "" {
		return regoBound{}
	}
	return otherBundleURLs(raw, r.rule)
}

// regoBoundStatus shows a download cut for its Rego (errRegoBound) with its code,
// POLICY_BUNDLE_TOO_LARGE, as its refusal at activation is.
func regoBoundStatus(st *bundleplugin.Status) {
	if st.Code != "" && strings.Contains(st.Message, errRegoBound.Error()) {
		st.Code = string(coded.PolicyBundleTooLarge)
	}
}

// IsTooLarge reports whether msg is the message of a POLICY_BUNDLE_TOO_LARGE refusal (AdmitCost),
// for a status that keeps the message of a refusal only.
func IsTooLarge(msg string) bool {
	return strings.Contains(msg, " bytes a bundle other than the gate's (")
}

// clearLastErrorLocked clears the status's last error when it is about bundle n and n is now
// well (OPA reports no failure and authz refuses nothing of it): a bundle that failed once and
// was then activated cleanly leaves no stale error; s.mu is held.
func (r *remote) clearLastErrorLocked(n string, st *bundleplugin.Status) {
	if r.lastErrOf != n || st.Code != "" || r.s.checks[n].code != "" {
		return
	}
	r.s.status.LastError, r.lastErrOf = "", ""
}
