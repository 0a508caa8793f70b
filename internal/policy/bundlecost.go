package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
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
// it lasts. 1 MiB of Rego compiles in about a second on a loaded machine.
const DefaultOtherBundleRegoBytes = 1 << 20

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
