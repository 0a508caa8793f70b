package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/open-policy-agent/opa/v1/bundle"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/logtext"
)

// Options are the parts of a Source that are not configuration.
type Options struct {
	// Logger is the service log; a null logger when nil.
	Logger hclog.Logger
	// WatchInterval is how often a watched bundle is looked at for changes; 500ms when zero.
	WatchInterval time.Duration
	// ID names this instance to bundle, status and decision-log servers (OPA's labels.id);
	// a random id when empty.
	ID string
	// TracerProvider, when not nil, is the one of distributed_tracing (NewTracerProvider): OPA's
	// plugins then trace their HTTP requests (bundle downloads, decision-log and status
	// uploads) with it, as under `opa run`.
	TracerProvider *sdktrace.TracerProvider

	// downloadTimes bound the pace of remote bundle downloads (remotetime.go); the defaults
	// when zero. Tests set them.
	downloadTimes downloadTimes
}

// Status is the state of the policy as the source keeps it, with OPA's bundle statuses; the API
// shows it as an api.Status (APIStatus).
type Status struct {
	Revision    string
	Origin      string
	ActivatedAt time.Time
	Bundles     map[string]*bundleplugin.Status
	LastError   string
}

// APIStatus is st as GET /v1/status shows it: OPA's bundle statuses in the API's shape, less
// their per-download metrics.
func APIStatus(st Status) api.Status {
	out := api.Status{Revision: st.Revision, Origin: st.Origin, ActivatedAt: st.ActivatedAt, LastError: st.LastError,
		Bundles: make(map[string]*api.BundleStatus, len(st.Bundles))}
	for n, b := range st.Bundles {
		out.Bundles[n] = &api.BundleStatus{Name: b.Name, ActiveRevision: b.ActiveRevision, LastSuccessfulActivation: b.LastSuccessfulActivation,
			Type: b.Type, Size: b.Size, LastSuccessfulDownload: b.LastSuccessfulDownload, LastSuccessfulRequest: b.LastSuccessfulRequest,
			LastRequest: b.LastRequest, Code: b.Code, Message: b.Message, Errors: b.Errors, HTTPCode: b.HTTPCode}
	}
	return out
}

// Source is the policy of one engine: it activates the first policy, then each new bundle, and
// reports what is active. Create it with New, Start it, Close it after the service stopped.
type Source struct {
	cfg  Config
	eng  *decision.Engine
	opts Options
	log  hclog.Logger
	vc   *bundle.VerificationConfig

	mu      sync.Mutex // serializes activations and guards the fields below
	status  Status
	checks  map[string]refusal     // per bundle: authz's own refusal of its last activation
	served  map[string]string      // per remote bundle: the revision the engine serves
	watched string                 // fingerprint of the watched bundle
	digest  string                 // contentDigest of the active policy; "" for the embedded one
	order   *bundleOrder           // issue times of the active signed bundles (order.go)
	ops     *prometheus.CounterVec // authz_bundle_operations_total (bundlemetrics.go)

	provider provider // the kind of source cfg selects (kinds)
	remote   *remote  // OPA's plugin manager over the opa section; nil without one
	stop     chan struct{}
}

// refusal is why authz refused a bundle OPA activated in its store: a code and a cleaned message.
type refusal struct{ code, msg string }

// New checks cfg and returns a Source that will activate policy in eng (an engine made with
// decision.New). It starts nothing.
func New(cfg Config, eng *decision.Engine, opts Options) (*Source, error) {
	if eng == nil {
		return nil, errors.New("policy: an engine is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.WatchInterval <= 0 {
		opts.WatchInterval = 500 * time.Millisecond
	}
	vc, err := cfg.verification()
	if err != nil {
		return nil, &coded.Error{Code: coded.PolicyBundleLoad, Err: err}
	}
	s := &Source{cfg: cfg, eng: eng, opts: opts, log: opts.Logger.Named("policy"), vc: vc,
		checks: map[string]refusal{}, served: map[string]string{}, stop: make(chan struct{}),
		order: &bundleOrder{iat: map[string]int64{}}, ops: newBundleOps()}
	s.status.Bundles = map[string]*bundleplugin.Status{}
	s.provider = cfg.kind().new(s)
	return s, nil
}

// Start makes an engine with engineOpts and a Source of cfg for it, and activates the first
// policy (see Source.Start): the embedded policy, a bundle file or directory, or remote bundles
// (then the engine has no policy, and the service is not ready, until the first bundle is
// activated). Close the source after the service stops.
func Start(ctx context.Context, cfg Config, engineOpts decision.Options, opts Options) (*decision.Engine, *Source, error) {
	eng := decision.New(engineOpts)
	src, err := New(cfg, eng, opts)
	if err != nil {
		return nil, nil, err
	}
	if err := src.Start(ctx); err != nil {
		src.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	return eng, src, nil
}

// Start activates the first policy. The embedded policy and a bundle file are activated before
// Start returns, and an error means there is no policy (the service must not start). Remote
// bundles are activated as they arrive (a persisted one before Start returns): the engine has no
// policy, and Ready is false, until then.
func (s *Source) Start(ctx context.Context) error { return s.provider.start(ctx) }

// Ready reports whether a policy is active.
func (s *Source) Ready() bool { return s.eng.Revision() != "" }

// Reload looks for a new policy now: a bundle file is read again, remote bundles are downloaded
// again. A bundle that fails keeps the active policy; the error says why. `authz serve` calls it
// on SIGHUP.
func (s *Source) Reload(ctx context.Context) error { return s.provider.reload(ctx) }

// Close stops watching and downloading. The active policy stays active in the engine.
func (s *Source) Close(ctx context.Context) {
	select {
	case <-s.stop:
		return
	default:
		close(s.stop)
	}
	s.provider.close(ctx)
}

// startOPA starts OPA's plugin manager over the opa section, when there is one: its decision
// logs and status, and with bundles its bundle plugin, whose bundles are then the policy.
func (s *Source) startOPA(ctx context.Context, bundles bool) error {
	if len(s.cfg.OPA) == 0 {
		return nil
	}
	r, err := startRemote(ctx, s, bundles)
	if err != nil {
		return &coded.Error{Code: coded.PolicyRemote, Err: err}
	}
	s.mu.Lock()
	s.remote = r
	s.mu.Unlock()
	return nil
}

// stopOPA stops OPA's plugin manager, when it runs.
func (s *Source) stopOPA(ctx context.Context) {
	s.mu.Lock()
	r := s.remote
	s.remote = nil
	s.mu.Unlock()
	if r != nil {
		r.stop(ctx)
	}
}

// Status returns the policy's state as the API shows it (GET /v1/status).
func (s *Source) Status() api.Status {
	return APIStatus(s.state())
}

// state returns a copy of the policy's state.
func (s *Source) state() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Bundles = make(map[string]*bundleplugin.Status, len(s.status.Bundles))
	for n, b := range s.status.Bundles {
		cp := *b
		cp.Metrics = nil // per-download timers, not state
		st.Bundles[n] = &cp
	}
	s.provider.status(&st)
	return st
}

// Origin is where the active policy came from (Status().Origin).
func (s *Source) Origin() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status.Origin
}

// activateLocked makes p, from origin, the engine's policy (activateGateLocked); s.mu is held.
func (s *Source) activateLocked(ctx context.Context, p *decision.Policy, origin, digest string) error {
	return s.activateGateLocked(ctx, &GatePolicy{p: p, origin: origin}, digest)
}

// activateGateLocked makes g the engine's policy (GatePolicy.ActivateOn, as `authz run`'s gate
// does), digest its contentDigest ("" for none); s.mu is held.
func (s *Source) activateGateLocked(ctx context.Context, g *GatePolicy, digest string) error {
	a, err := g.ActivateOn(ctx, s.eng)
	if err != nil {
		return err
	}
	s.digest = digest
	s.status.Revision, s.status.Origin, s.status.ActivatedAt, s.status.LastError = a.Revision, a.Origin, a.At, ""
	s.log.Info("policy activated", "revision", a.Revision, "origin", a.Origin, "cache", logtext.Clean(cacheNote(s.eng))) // the note may quote the bundle
	return nil
}

func cacheNote(eng *decision.Engine) string {
	if why := eng.CacheStatus(); why != "" {
		return "off: " + why
	}
	return "on"
}

// bundleRevision is a bundle's manifest revision, or a digest of its modules and data when it
// has none.
func bundleRevision(b *bundle.Bundle) string {
	if b.Manifest.Revision != "" {
		return logtext.Clean(b.Manifest.Revision)
	}
	mods := make(map[string]string, len(b.Modules))
	for _, m := range b.Modules {
		mods[m.Path] = string(m.Raw)
	}
	return decision.ContentRevision(mods, b.Data)
}

// contentDigest identifies a policy's content: where it comes from, its revision, its modules
// and its data. A bundle whose digest is the active policy's is not activated again (its
// decisions would be the same), so a server that sends the same bundle at every poll, with or
// without ETag, does not purge the decision cache.
func contentDigest(origin, revision string, mods map[string]string, data map[string]any) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s%d:%s", len(origin), origin, len(revision), revision)
	for _, n := range slices.Sorted(maps.Keys(mods)) {
		fmt.Fprintf(h, "%d:%s%d:%s", len(n), n, len(mods[n]), mods[n])
	}
	b, err := json.Marshal(data) // map keys are sorted by encoding/json
	if err != nil {
		return "" // never equal: the bundle is activated
	}
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// unchangedLocked reports whether digest is the active policy's; s.mu is held.
func (s *Source) unchangedLocked(digest string) bool {
	return digest != "" && digest == s.digest
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
