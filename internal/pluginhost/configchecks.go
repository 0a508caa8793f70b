package pluginhost

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
)

// maxConfigCacheEntries bounds the config checks' answers kept; past it the answers are
// dropped (the checks in progress stay).
const maxConfigCacheEntries = 4096

// checkLogEvery is how often at most a plugin's failed config checks are logged at WARN; the
// line says how many were left out since the last.
const checkLogEvery = 10 * time.Second

// configKey names one config check: the plugin, its worker generation, the driver key and the
// SHA-256 of the config's canonical JSON.
type configKey struct {
	pluginID   string
	generation uint64
	driverKey  string
	configSum  [sha256.Size]byte
}

// configChecks holds the config checks in progress and their answers, and each plugin's share
// of the checks: its turns, its breaker and its log budget.
type configChecks struct {
	mu      sync.Mutex
	entries map[configKey]*checkEntry
	// kept is the answered entries of entries by the hash of their config's value (configkeep.go),
	// published under mu after every change to them and read without mu: a decision whose answer
	// is kept takes no lock.
	kept     atomic.Pointer[map[keptKey][]*checkEntry]
	plugins  map[string]*pluginChecks // by plugin id
	logEvery time.Duration
}

func newConfigChecks() *configChecks {
	cc := &configChecks{entries: map[configKey]*checkEntry{}, plugins: map[string]*pluginChecks{}, logEvery: checkLogEvery}
	cc.publishLocked()
	return cc
}

// publishLocked publishes the answered entries as kept; cc.mu is held (or cc is not shared yet).
// An entry's fields are written before its done is closed, so a reader that sees it answered
// sees them.
func (cc *configChecks) publishLocked() {
	kept := make(map[keptKey][]*checkEntry, len(cc.entries))
	for k, e := range cc.entries {
		if e.answered() && e.config != nil {
			kk := keptKey{pluginID: k.pluginID, generation: k.generation, driverKey: k.driverKey, sum: e.configSum}
			kept[kk] = append(kept[kk], e)
		}
	}
	cc.kept.Store(&kept)
}

// checkEntry is one config check: in progress until done is closed, then its answer. Its
// fields are written before done is closed, under configChecks.mu.
type checkEntry struct {
	done    chan struct{}
	valid   bool
	err     error
	expires time.Time // zero: kept while the generation runs; else kept until then
	retry   bool      // the caller that asked gave up: the waiters ask again
	waiters int       // callers waiting on done besides the one asking

	// The config asked about, decoded from its canonical JSON as the request decoder would
	// decode it, and its hashConfig: how a kept answer is found without a lock. nil when it
	// cannot be hashed.
	config    map[string]any
	configSum uint64
}

// answered reports whether the check is over.
func (e *checkEntry) answered() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// usable reports whether a caller may join the check or take its answer at now.
func (e *checkEntry) usable(now time.Time) bool {
	if !e.answered() {
		return true
	}
	return !e.retry && (e.expires.IsZero() || now.Before(e.expires))
}

// pluginChecks is one plugin's share of the config checks. Every field but turns is guarded by
// configChecks.mu.
type pluginChecks struct {
	turns chan struct{} // one token per check in progress

	timeouts  int       // consecutive time-outs
	openUntil time.Time // non-zero: the breaker is open until then, and half-open after
	probing   bool      // half-open: the one probe is in progress

	lastLog    time.Time
	suppressed int // WARN lines left out since lastLog
}

// plugin returns the share of pluginID, made on first use with maxConcurrent turns.
func (cc *configChecks) plugin(pluginID string, maxConcurrent int) *pluginChecks {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	pc, ok := cc.plugins[pluginID]
	if !ok {
		pc = &pluginChecks{turns: make(chan struct{}, maxConcurrent)}
		cc.plugins[pluginID] = pc
	}
	return pc
}

// waiting returns how many callers wait on config checks in progress (the asking one and those
// that joined it).
func (cc *configChecks) waiting() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	n := 0
	for _, e := range cc.entries {
		if !e.answered() {
			n += 1 + e.waiters
		}
	}
	return n
}

// ConfigValid implements snapshot.Facts: it asks worker w of the plugin whether it accepts
// config for driverKey. A config that is not a JSON object, or whose canonical JSON is larger
// than Limits.MaxCheckConfigBytes, is not valid without asking the driver; a worker other than
// the running one is "not valid" with an error.
//
// Checks are kept per plugin, worker generation, driver key and config (by the SHA-256 of its
// canonical JSON): an answer while the worker runs, a failure (an error, a time-out) for
// ConfigCheck.FailureTTL. Identical checks in progress are one RPC that every caller waits on.
// Each plugin has its own ConfigCheck.MaxConcurrent turns and breaker, so that one plugin's slow
// checks hold up no other's. A failure, a check shed for want of a turn and a check refused by
// the open breaker are "not valid" with an error whose code says which (coded.ConfigCheck*).
func (h *Host) ConfigValid(ctx context.Context, pluginID string, w *snapshot.Worker, driverKey string, config any) (bool, error) {
	c, valid, err := h.prepareCheck(pluginID, w, driverKey, config)
	if c == nil {
		return valid, err
	}
	return c.await(ctx)
}

// PrepareConfigCheck implements snapshot.ConfigCheckPreparer: when ConfigValid would ask the
// driver (or wait on a check in progress), it returns the wait for that check and its answer,
// which holds only the config's canonical JSON; nil when ConfigValid would answer at once.
func (h *Host) PrepareConfigCheck(pluginID string, w *snapshot.Worker, driverKey string, config any) func(context.Context) (bool, error) {
	c, _, _ := h.prepareCheck(pluginID, w, driverKey, config)
	if c == nil {
		return nil
	}
	return c.await
}

// AnswerConfigCheck implements snapshot.ConfigCheckAnswerer: PrepareConfigCheck's wait, or,
// when there is none, the answer ConfigValid would give now; so a decision asks once.
func (h *Host) AnswerConfigCheck(pluginID string, w *snapshot.Worker, driverKey string, config any) (func(context.Context) (bool, error), bool, error) {
	c, valid, err := h.prepareCheck(pluginID, w, driverKey, config)
	if c == nil {
		return nil, valid, err
	}
	return c.await, false, nil
}

var (
	_ snapshot.ConfigCheckPreparer = (*Host)(nil)
	_ snapshot.ConfigCheckAnswerer = (*Host)(nil)
)

// pendingCheck is a config check that needs the driver, or a check in progress.
type pendingCheck struct {
	h      *Host
	m      *managed
	w      *worker
	key    configKey
	config []byte // canonical JSON
}

// prepareCheck answers what needs no driver (c nil: valid and err are the answer), or returns
// the check to make.
func (h *Host) prepareCheck(pluginID string, w *snapshot.Worker, driverKey string, config any) (c *pendingCheck, valid bool, err error) {
	m, ok := h.current().byID[pluginID]
	if !ok {
		return nil, false, fmt.Errorf("%w: %q", errUnknownPlugin, pluginID)
	}
	if w == nil {
		return nil, false, fmt.Errorf("%w: plugin %q", errNoWorker, pluginID)
	}
	cfg, ok := config.(map[string]any)
	if !ok {
		return nil, false, nil
	}
	cur := m.state.Load().worker
	if cur == nil || !cur.alive() {
		return nil, false, fmt.Errorf("%w: plugin %q", errNoWorker, pluginID)
	}
	if cur.generation != w.Generation {
		return nil, false, fmt.Errorf("%w: plugin %q was asked about generation %d, the running worker is generation %d",
			errStaleWorker, pluginID, w.Generation, cur.generation)
	}
	if valid, err, ok := h.checks.keptAnswer(pluginID, cur.generation, driverKey, cfg, time.Now()); ok {
		return nil, valid, err // a kept answer: no lock, no canonical JSON
	}
	canonical, err := json.Marshal(cfg) // map keys sorted: canonical
	if err != nil {
		return nil, false, fmt.Errorf("plugin %q: config is not JSON: %w", pluginID, err)
	}
	if limit := h.cfg.Limits.MaxCheckConfigBytes; len(canonical) > limit {
		return nil, false, coded.Errorf(coded.LimitExceeded, "plugin %q: the config for driver key %q is %d bytes of JSON, more than the limit of %d a config check sends: %s",
			pluginID, driverKey, len(canonical), limit, limitsHint)
	}
	key := configKey{pluginID: pluginID, generation: cur.generation, driverKey: driverKey, configSum: sha256.Sum256(canonical)}
	cc := h.checks
	cc.mu.Lock()
	e := cc.entries[key]
	if e != nil && e.answered() {
		if e.usable(time.Now()) {
			cc.mu.Unlock()
			return nil, e.valid, e.err
		}
		delete(cc.entries, key)
		cc.publishLocked()
	}
	cc.mu.Unlock()
	return &pendingCheck{h: h, m: m, w: cur, key: key, config: canonical}, false, nil
}

// checkOutcome says what is kept of a check's answer.
type checkOutcome int

const (
	keepAnswer  checkOutcome = iota // an answer: kept while the generation runs
	keepFailure                     // a failure: kept for FailureTTL
	keepNone                        // shed or refused: for the waiters, not for later callers
	askAgain                        // the asking caller gave up: the waiters ask again
)

// await joins the check in progress or a kept answer, or else asks the driver itself, and
// returns the answer.
func (c *pendingCheck) await(ctx context.Context) (bool, error) {
	cc := c.h.checks
	for {
		cc.mu.Lock()
		e := cc.entries[c.key]
		if e != nil && e.usable(time.Now()) {
			e.waiters++
			cc.mu.Unlock()
			var gaveUp error
			select {
			case <-e.done:
			case <-ctx.Done():
				gaveUp = ctx.Err()
			}
			cc.mu.Lock()
			e.waiters--
			cc.mu.Unlock()
			if gaveUp != nil {
				return false, c.wrap(fmt.Errorf("waiting for the check: %w", gaveUp))
			}
			if e.retry {
				continue
			}
			return e.valid, e.err
		}
		e = &checkEntry{done: make(chan struct{})}
		e.config, e.configSum = keptConfig(c.config)
		if len(cc.entries) >= maxConfigCacheEntries {
			for k, old := range cc.entries {
				if old.answered() {
					delete(cc.entries, k)
				}
			}
			cc.publishLocked()
		}
		cc.entries[c.key] = e
		cc.mu.Unlock()

		valid, outcome, err := c.ask(ctx)

		cc.mu.Lock()
		e.valid, e.err = valid, err
		now := time.Now()
		switch outcome {
		case askAgain:
			e.retry = true
		case keepNone:
			e.expires = now
		case keepFailure:
			e.expires = now.Add(c.h.cfg.ConfigCheck.FailureTTL)
		}
		if outcome != keepAnswer && outcome != keepFailure || c.m.state.Load().worker != c.w {
			// Not worth keeping: for the waiters only.
			if cc.entries[c.key] == e {
				delete(cc.entries, c.key)
			}
		}
		cc.mu.Unlock()
		close(e.done)
		cc.mu.Lock()
		if cc.entries[c.key] == e {
			cc.publishLocked() // kept: readers may take it without the lock
		}
		cc.mu.Unlock()
		return valid, err
	}
}

// keptConfig decodes canonical as the request decoder would (numbers as json.Number) and hashes
// it; nil when it cannot.
func keptConfig(canonical []byte) (map[string]any, uint64) {
	var config map[string]any
	dec := json.NewDecoder(bytes.NewReader(canonical))
	dec.UseNumber()
	if dec.Decode(&config) != nil || config == nil {
		return nil, 0
	}
	sum, ok := hashConfig(config, 0)
	if !ok {
		return nil, 0
	}
	return config, sum
}

// wrap names the check in err.
func (c *pendingCheck) wrap(err error) error {
	return fmt.Errorf("plugin %q (generation %d): check config for driver key %q: %w", c.key.pluginID, c.key.generation, c.key.driverKey, err)
}

// boundedChecker is a driver whose CheckConfig answer can be bounded per call
// (*driverplugin.GRPCClient).
type boundedChecker interface {
	CheckConfigWithin(ctx context.Context, driverKey string, config map[string]any, maxAnswerBytes int) (bool, string, error)
}

var _ boundedChecker = (*driverplugin.GRPCClient)(nil)

// ask makes the check: through the plugin's breaker, within one of its turns, bounded by
// ConfigCheckTimeout and ctx.
func (c *pendingCheck) ask(ctx context.Context) (valid bool, outcome checkOutcome, err error) {
	h, cfg := c.h, c.h.cfg.ConfigCheck
	cc := h.checks
	pc := cc.plugin(c.key.pluginID, cfg.MaxConcurrent)

	probe, err := cc.admit(pc, time.Now())
	if err != nil {
		c.warn(pc, coded.ConfigCheckUnavailable, err)
		return false, keepNone, c.wrap(err)
	}
	if err := c.takeTurn(ctx, pc); err != nil {
		cc.settle(pc, probe, breakerNoVerdict, cfg)
		if coded.CodeOf(err) == coded.ConfigCheckShed {
			c.warn(pc, coded.ConfigCheckShed, err)
			return false, keepNone, c.wrap(err)
		}
		return false, askAgain, c.wrap(err)
	}
	defer func() { <-pc.turns }()

	var config map[string]any
	dec := json.NewDecoder(bytes.NewReader(c.config))
	dec.UseNumber() // numbers as the request decoder keeps them
	if err := dec.Decode(&config); err != nil {
		cc.settle(pc, probe, breakerNoVerdict, cfg)
		return false, keepFailure, c.wrap(err)
	}
	cctx, cancel := context.WithTimeout(ctx, h.cfg.ConfigCheckTimeout)
	defer cancel()
	var reason string
	if bc, ok := c.w.driver.(boundedChecker); ok {
		valid, reason, err = bc.CheckConfigWithin(cctx, c.key.driverKey, config, h.cfg.Limits.MaxCheckAnswerBytes)
	} else {
		valid, reason, err = c.w.driver.CheckConfig(cctx, c.key.driverKey, config)
	}
	switch {
	case err == nil:
		cc.settle(pc, probe, breakerAnswered, cfg)
		if !valid {
			c.m.log.Debug("driver does not accept the config", "driverKey", c.key.driverKey, "generation", c.key.generation,
				"reason", capText(reason, checkTextBytes))
		}
		return valid, keepAnswer, nil
	case errors.Is(err, context.DeadlineExceeded):
		cc.settle(pc, probe, breakerTimedOut, cfg)
		err = &coded.Error{Code: coded.ConfigCheckTimeout, Err: fmt.Errorf("the driver did not answer within %s: %w", h.cfg.ConfigCheckTimeout, context.DeadlineExceeded)}
		c.warn(pc, coded.ConfigCheckTimeout, err)
		return false, keepFailure, c.wrap(err)
	case ctx.Err() != nil:
		cc.settle(pc, probe, breakerNoVerdict, cfg)
		return false, askAgain, c.wrap(fmt.Errorf("the caller gave up: %w", ctx.Err()))
	}
	cc.settle(pc, probe, breakerAnswered, cfg)
	// Only a short text of the driver's error is kept: the error itself may hold all it sent.
	text := capText(err.Error(), checkTextBytes)
	if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() == codes.ResourceExhausted || status.Code(err) == codes.ResourceExhausted {
		text = fmt.Sprintf("the driver's answer is larger than the limit of %d bytes: %s", h.cfg.Limits.MaxCheckAnswerBytes, limitsHint)
	}
	err = coded.Errorf(coded.ConfigCheckFailed, "%s", text)
	c.warn(pc, coded.ConfigCheckFailed, err)
	return false, keepFailure, c.wrap(err)
}

// takeTurn takes one of the plugin's turns, waiting at most ConfigCheck.MaxWait.
func (c *pendingCheck) takeTurn(ctx context.Context, pc *pluginChecks) error {
	select {
	case pc.turns <- struct{}{}:
		return nil
	default:
	}
	wait := c.h.cfg.ConfigCheck.MaxWait
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case pc.turns <- struct{}{}:
		return nil
	case <-t.C:
		return coded.Errorf(coded.ConfigCheckShed, "%d checks of the plugin were in progress for %s (configCheck.maxConcurrent, configCheck.maxWait)",
			cap(pc.turns), wait)
	case <-ctx.Done():
		return fmt.Errorf("waiting for a turn: %w", ctx.Err())
	}
}

// Breaker verdicts of one check.
type breakerVerdict int

const (
	breakerAnswered  breakerVerdict = iota // the driver answered (an answer or an error)
	breakerTimedOut                        // the driver did not answer in time
	breakerNoVerdict                       // the driver was not asked, or the caller gave up
)

// admit lets a check through the plugin's breaker: closed, or half-open with no probe in
// progress (the check is then the probe). An open breaker refuses.
func (cc *configChecks) admit(pc *pluginChecks, now time.Time) (probe bool, err error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	switch {
	case pc.openUntil.IsZero():
		return false, nil
	case now.Before(pc.openUntil):
		return false, coded.Errorf(coded.ConfigCheckUnavailable, "the plugin's config checks timed out repeatedly: they are not valid without asking until %s",
			pc.openUntil.UTC().Format(time.RFC3339))
	case pc.probing:
		return false, coded.Errorf(coded.ConfigCheckUnavailable, "the plugin's config checks timed out repeatedly: one check is probing whether it answers again")
	}
	pc.probing = true
	return true, nil
}

// settle records a check's verdict: consecutive time-outs open the breaker, so does a probe
// that times out; an answer closes it.
func (cc *configChecks) settle(pc *pluginChecks, probe bool, v breakerVerdict, cfg ConfigCheckConfig) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if probe {
		pc.probing = false
	}
	switch v {
	case breakerAnswered:
		pc.timeouts, pc.openUntil = 0, time.Time{}
	case breakerTimedOut:
		pc.timeouts++
		if probe || pc.timeouts >= cfg.BreakerTimeouts {
			pc.timeouts, pc.openUntil = 0, time.Now().Add(cfg.BreakerCooldown)
		}
	}
}

// warn logs a failed check at WARN, at most once per logEvery per plugin, with the count of
// the lines left out since the last. err's driver text is already escaped and cut.
func (c *pendingCheck) warn(pc *pluginChecks, code coded.Code, err error) {
	cc := c.h.checks
	now := time.Now()
	cc.mu.Lock()
	if !pc.lastLog.IsZero() && now.Sub(pc.lastLog) < cc.logEvery {
		pc.suppressed++
		cc.mu.Unlock()
		return
	}
	suppressed := pc.suppressed
	pc.lastLog, pc.suppressed = now, 0
	cc.mu.Unlock()
	args := []any{"driverKey", capText(c.key.driverKey, checkTextBytes), "generation", c.key.generation, "code", string(code), "error", err.Error()}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	c.m.log.Warn("config check failed: decisions that need it deny (config not valid)", args...)
}

// forgetConfigChecks drops the kept answers of older workers of the plugin, and closes its
// breaker: a new worker starts afresh.
func (h *Host) forgetConfigChecks(pluginID string, current uint64) {
	cc := h.checks
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for k, e := range cc.entries {
		if k.pluginID == pluginID && k.generation != current && e.answered() {
			delete(cc.entries, k)
		}
	}
	cc.publishLocked()
	if pc, ok := cc.plugins[pluginID]; ok {
		pc.timeouts, pc.openUntil, pc.probing = 0, time.Time{}, false
	}
}
