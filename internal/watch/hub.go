// Package watch keeps granted decisions under watch: a watch holds a request whose decision
// allowed, and it is told, at once, when that decision would now be different: an update while
// it still allows with other capabilities or another policy revision, a revoke (terminal) when
// it no longer allows. The Hub re-decides the watched requests when the facts a decision reads
// change, when a policy is activated, and periodically for what cannot signal a change (a
// driver's config check). It re-decides each distinct request once per change, whatever the
// number of watches on it; the decision cache makes requests of the same input footprint one
// evaluation.
//
// The Hub never waits on a watcher: events are left on the watch (an update replaces an
// update not yet taken; a revoke is final) and the watcher is woken.
package watch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
)

// Defaults of Options.
const (
	DefaultRecheckInterval = 30 * time.Second
	DefaultPingInterval    = 15 * time.Second
	// DefaultMaxWatches and DefaultMaxBytes are sized so that the service's memory bound on its
	// defaults fits a 256 MiB container (docs/service.md, "Limits and memory"): 1,024 watches
	// of distinct 4 KB requests.
	DefaultMaxWatches = 1024
	// DefaultMaxBytes bounds the request bodies the watches hold.
	DefaultMaxBytes = 4 << 20
	// defaultDecideTimeout bounds one re-decision when the decider sets no bound of its own.
	defaultDecideTimeout = 10 * time.Second
)

// Errors of Add.
var (
	// ErrLimit: MaxWatches watches are open.
	ErrLimit = errors.New("too many open watches")
	// ErrBytes: the request bodies the watches hold would pass MaxBytes.
	ErrBytes = errors.New("the watches hold as many request bytes as allowed")
	// ErrClosed: the hub is closed (the service stops).
	ErrClosed = errors.New("the service is stopping: no new watch")
)

// Decider makes one decision of a request on the facts given; *decision.Engine is one. It
// always returns a document; a non-nil error means the decision could not be evaluated.
type Decider interface {
	Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error)
}

// BodyDecider is a Decider that can also decode a watched request's body itself: a re-decision
// then hands it the body, and the decoded request (which costs many times the body) exists only
// where the decider bounds it (the service's deciding places) rather than in every one of the
// hub's workers at once. The decoding and its errors are snapshot.ParseRequestBytes's.
type BodyDecider interface {
	Decider
	DecideBody(ctx context.Context, operation string, body []byte, facts snapshot.Facts) (decision.Document, snapshot.Input, error)
}

// Options tune a Hub. The zero value takes the defaults.
type Options struct {
	// RecheckInterval re-decides every watched request this often, changes or not.
	RecheckInterval time.Duration
	// MaxWatches caps the open watches; Add answers ErrLimit past it.
	MaxWatches int
	// MaxBytes caps the bytes of the distinct request bodies the watches hold (a request
	// is held as its body and decoded again for each re-decision, so it costs its size once);
	// Add answers ErrLimit past it.
	MaxBytes int64
	// Workers re-decide this many requests at once; GOMAXPROCS when zero.
	Workers int
	// DecideTimeout bounds one re-decision (the decider's own bound applies too).
	DecideTimeout time.Duration
	// Deadline bounds one re-decision once it has started: a watch whose re-decision is
	// still running after it is revoked (reason evaluation_failed, code EVAL_TIMEOUT), since
	// its grant may already be gone and the service cannot tell. It protects against a stuck
	// re-decision (a driver that never answers its config check, a decider that ignores its
	// context), not against a queue: a re-decision waiting for a worker behind the others of
	// a large change is not failing, and is decided in its turn. One second when zero.
	Deadline time.Duration
	// Logger receives the hub's warnings; none when nil.
	Logger hclog.Logger
}

// Kind is the kind of a watch event, as the event stream names it.
type Kind string

// Kinds of events.
const (
	KindDecision Kind = "decision" // the first decision of a watch
	KindUpdate   Kind = "update"   // still allows; the capabilities or the revision changed
	KindRevoke   Kind = "revoke"   // no longer allows; terminal
)

// Event is one decision of a watch. Doc has no decision_id: each event is a decision of its
// own, which the caller names (and logs) when it hands the event on.
type Event struct {
	Kind Kind
	Doc  decision.Document
	// Operation is the watched request's operation.
	Operation string
	// Input is the input document the decision read (shared: do not modify); nil for a revoke
	// the service made itself (stopping).
	Input snapshot.Input
	// EvalCode is the failure's code when the decision could not be evaluated.
	EvalCode coded.Code
	// Latency is how long the decision took.
	Latency time.Duration
}

// Hub holds the open watches.
type Hub struct {
	d     Decider
	facts snapshot.Facts
	opts  Options

	seq   atomic.Uint64 // counts changes; a decision made before a change may be stale
	open  atomic.Int64  // open watches (reserved included)
	max   atomic.Int64  // the most open watches (Options.MaxWatches, or SetMaxWatches)
	bytes int64         // the bodies held by the groups (guarded by mu)

	mu       sync.Mutex
	groups   map[[sha256.Size]byte]*group
	dirtyAll bool
	dirtyIDs map[string]bool // plugin ids whose facts changed
	dirtyG   map[*group]bool // groups to re-decide whatever changed
	closed   bool
	running  bool
	passes   uint64 // counts passes (guarded by mu)

	kick    chan struct{}
	stop    chan struct{}
	ctx     context.Context // the re-decisions' context, cancelled by Close
	cancel  context.CancelFunc
	stopped chan struct{}
}

// group is the watches of one request.
type group struct {
	pass      uint64 // the last pass that finished deciding it (guarded by Hub.mu)
	key       [sha256.Size]byte
	body      []byte // the request as it was sent, decoded again for each re-decision
	operation string
	pluginID  string // the plugin the request pins; "" for none
	watches   map[*Watch]struct{}
}

// New returns a hub that decides with d on facts. Nothing runs until the first watch.
func New(d Decider, facts snapshot.Facts, opts Options) *Hub {
	if opts.RecheckInterval <= 0 {
		opts.RecheckInterval = DefaultRecheckInterval
	}
	if opts.MaxWatches <= 0 {
		opts.MaxWatches = DefaultMaxWatches
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.DecideTimeout <= 0 {
		opts.DecideTimeout = defaultDecideTimeout
	}
	if opts.Deadline <= 0 {
		opts.Deadline = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	h := &Hub{d: d, facts: facts, opts: opts, groups: map[[sha256.Size]byte]*group{},
		dirtyIDs: map[string]bool{}, dirtyG: map[*group]bool{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	h.max.Store(int64(opts.MaxWatches))
	h.ctx, h.cancel = context.WithCancel(context.Background())
	return h
}

// SetMaxWatches lowers (or raises) the most open watches; 0 refuses every new one. The
// watches open stay.
func (h *Hub) SetMaxWatches(n int) { h.max.Store(int64(max(n, 0))) }

// MaxWatches is the most open watches.
func (h *Hub) MaxWatches() int { return int(h.max.Load()) }

// FactsChanged marks the watches that read the facts of pluginID ("" for any) for a
// re-decision. It never blocks: a facts source's change listener.
func (h *Hub) FactsChanged(pluginID string) {
	h.seq.Add(1)
	h.mu.Lock()
	if pluginID == "" {
		h.dirtyAll = true
	} else {
		h.dirtyIDs[pluginID] = true
	}
	h.mu.Unlock()
	h.wake()
}

// PolicyChanged marks every watch for a re-decision on the policy now active. It never
// blocks: a decider's policy listener.
func (h *Hub) PolicyChanged(string) { h.FactsChanged("") }

// Seq returns the count of changes so far; hand it to Add with the first decision made after
// reading it.
func (h *Hub) Seq() uint64 { return h.seq.Load() }

// Open returns the number of open watches.
func (h *Hub) Open() int { return int(h.open.Load()) }

// Reserve takes a place for one watch before its first decision is made, so that a request
// past the limit is refused before it is decided. Add takes the place over; Release gives it
// back unless Add took it (so a deferred Release is always right).
func (h *Hub) Reserve() (*Reservation, error) {
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if h.open.Add(1) > h.max.Load() {
		h.open.Add(-1)
		return nil, ErrLimit
	}
	return &Reservation{h: h}, nil
}

// Reservation is a place taken for one watch.
type Reservation struct {
	h    *Hub
	mu   sync.Mutex
	done bool // released, or taken over by Add
}

// Release gives the place back, unless Add took it over or it was released already.
func (r *Reservation) Release() {
	if r.settle() {
		r.h.open.Add(-1)
	}
}

// settle marks the reservation used; false when it already was.
func (r *Reservation) settle() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return false
	}
	r.done = true
	return true
}

// Add opens a watch on req, decoded from body, whose first decision first (made after Seq
// returned seq) allowed, in the place res reserved (which it takes over on success). A change
// since seq re-decides the request at once. The hub keeps a copy of body.
func (h *Hub) Add(res *Reservation, req *snapshot.Request, body []byte, first decision.Document, seq uint64) (*Watch, error) {
	if res == nil || res.h != h {
		return nil, errors.New("watch: Add needs a reservation of this hub")
	}
	key := sha256.Sum256(body)
	w := &Watch{hub: h, op: req.Operation, last: first, wake: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	g, ok := h.groups[key]
	if !ok {
		if h.bytes+int64(len(body)) > h.opts.MaxBytes {
			return nil, ErrBytes
		}
		h.bytes += int64(len(body))
		g = &group{key: key, body: bytes.Clone(body), operation: req.Operation, pluginID: pinnedPlugin(req), watches: map[*Watch]struct{}{}}
		h.groups[key] = g
	}
	if !res.settle() {
		if len(g.watches) == 0 {
			h.drop(g)
		}
		return nil, errors.New("watch: the reservation was released or used already")
	}
	g.watches[w] = struct{}{}
	w.g = g
	if h.seq.Load() != seq || (ok && len(g.watches) > 1 && !sameGrant(first, g.anyLast())) {
		h.dirtyG[g] = true
		defer h.wake()
	}
	if !h.running {
		h.running = true
		go h.run()
	}
	return w, nil
}

// RevokeAll revokes every open watch with the fail-closed deny of its operation carrying
// reason (evalCode names the failure in its record): the service can no longer stand behind any
// grant it watches (a required decision log that fails). New watches may open.
func (h *Hub) RevokeAll(reason string, evalCode coded.Code) {
	h.RevokeIf(func(any) bool { return true }, reason, evalCode)
}

// RevokeIf revokes, as RevokeAll does, the open watches whose tag (SetTag; nil when none)
// drop reports true for: those the service can no longer stand behind for a reason of their own
// (the token that opened them was revoked). drop must be quick and must not block.
func (h *Hub) RevokeIf(drop func(tag any) bool, reason string, evalCode coded.Code) int {
	h.mu.Lock()
	n := 0
	for _, g := range h.groups {
		doc := decision.FailedDocument(g.operation)
		doc.Reasons = []string{reason}
		doc.Revision = g.anyLast().Revision
		ev := Event{Kind: KindRevoke, Doc: doc, Operation: g.operation, EvalCode: evalCode}
		for w := range g.watches {
			if drop(w.tag.Load()) {
				w.revoke(ev)
				delete(g.watches, w)
				n++
			}
		}
		if len(g.watches) == 0 {
			h.drop(g)
		}
	}
	h.mu.Unlock()
	if n > 0 {
		h.opts.Logger.Warn("open watches revoked", "watches", n, "reason", reason)
	}
	return n
}

// Close revokes every open watch with the stopping document (reason service_stopping) and
// refuses new ones; it returns once the re-decisions have stopped. It is safe to call more
// than once.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		<-h.stopped
		return
	}
	h.closed = true
	running := h.running
	var all []*Watch
	for _, g := range h.groups {
		for w := range g.watches {
			all = append(all, w)
		}
	}
	h.groups = map[[sha256.Size]byte]*group{}
	h.bytes = 0
	h.mu.Unlock()
	close(h.stop)
	h.cancel() // a re-decision in flight (a driver's slow config check) does not hold Close up
	if running {
		<-h.stopped
	} else {
		close(h.stopped)
	}
	for _, w := range all {
		doc := decision.FailedDocument(w.op)
		doc.Reasons = []string{decision.ReasonServiceStopping}
		doc.Revision = w.lastRevision()
		w.revoke(Event{Kind: KindRevoke, Doc: doc, Operation: w.op})
	}
}

func (h *Hub) wake() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run re-decides what changed, one pass at a time, until Close: changes that arrive during a
// pass are taken by the next one.
func (h *Hub) run() {
	defer close(h.stopped)
	recheck := time.NewTicker(h.opts.RecheckInterval)
	defer recheck.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-recheck.C:
			h.mu.Lock()
			h.dirtyAll = true
			h.mu.Unlock()
		case <-h.kick:
		}
		h.pass()
	}
}

// pass re-decides the groups marked since the last pass.
func (h *Hub) pass() {
	h.mu.Lock()
	var todo []*group
	for _, g := range h.groups {
		if h.dirtyAll || h.dirtyG[g] || (g.pluginID != "" && h.dirtyIDs[g.pluginID]) {
			todo = append(todo, g)
		}
	}
	h.dirtyAll = false
	clear(h.dirtyIDs)
	clear(h.dirtyG)
	h.passes++
	pass := h.passes
	h.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	// Every worker takes the next group as soon as it is done with one, so a change is
	// re-decided on every core (Options.Workers) however many distinct requests it touches.
	work := make(chan *group)
	var wg sync.WaitGroup
	for range min(h.opts.Workers, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range work {
				h.redecide(g, pass)
			}
		}()
	}
	for _, g := range todo {
		select {
		case work <- g:
		case <-h.stop:
		}
	}
	close(work)
	wg.Wait()
}

// redecide decides g's request again and tells each of its watches what changed for it.
func (h *Hub) redecide(g *group, pass uint64) {
	select {
	case <-h.stop:
		return // Close revokes them
	default:
	}
	// The deadline counts from here, when the re-decision starts, not from the change: it
	// catches a re-decision that is stuck. The decider is told through its context; one that
	// does not return in time is revoked all the same (stuck), and what it answers later is
	// dropped.
	ctx, cancel := context.WithTimeout(h.ctx, min(h.opts.DecideTimeout, h.opts.Deadline))
	stuck := time.AfterFunc(h.opts.Deadline, func() { h.revokeStuck(g, pass) })
	start := time.Now()
	var (
		doc decision.Document
		in  snapshot.Input
	)
	var err error
	if bd, ok := h.d.(BodyDecider); ok {
		doc, in, err = bd.DecideBody(ctx, g.operation, g.body, h.facts)
	} else {
		var req *snapshot.Request
		req, err = snapshot.ParseRequestBytes(g.body) // it decoded when the watch opened
		if err == nil {
			doc, in, err = h.d.Decide(ctx, req, h.facts)
		}
	}
	if cerr := ctx.Err(); err == nil && cerr != nil {
		// An answer that comes after the deadline (or Close) is not trusted, whatever it says.
		code := coded.EvalCanceled
		if errors.Is(cerr, context.DeadlineExceeded) {
			code = coded.EvalTimeout
		}
		err = &coded.Error{Code: code, Err: cerr}
	}
	cancel()
	stuck.Stop()
	ev := Event{Doc: doc, Operation: g.operation, Input: in, Latency: time.Since(start)}
	if err != nil {
		// Whatever the decider returned beside its error, the watch ends on the fail-closed deny.
		ev.Doc, ev.EvalCode = decision.FailClosed(g.operation, doc, err)
		h.opts.Logger.Warn("a watched decision could not be evaluated; its watches are revoked",
			"operation", g.operation, "code", string(ev.EvalCode), "error", err)
	}
	ev.Doc.DecisionID = ""
	if ev.Doc.Reasons == nil {
		ev.Doc.Reasons = []string{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.groups[g.key] != g {
		return // closed, or every watch left
	}
	if !ev.Doc.Allow || err != nil {
		ev.Kind = KindRevoke
		for w := range g.watches {
			w.revoke(ev)
		}
		clear(g.watches)
		h.drop(g)
		return
	}
	g.pass = pass
	ev.Kind = KindUpdate
	for w := range g.watches {
		w.update(ev)
	}
}

// revokeStuck revokes the watches of g when its re-decision of pass is still running at the
// deadline: their grant may be gone, and the service cannot tell in time.
func (h *Hub) revokeStuck(g *group, pass uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.groups[g.key] != g || g.pass >= pass {
		return // decided, or gone
	}
	doc := decision.FailedDocument(g.operation)
	doc.Revision = g.anyLast().Revision
	ev := Event{Kind: KindRevoke, Doc: doc, Operation: g.operation, EvalCode: coded.EvalTimeout, Latency: h.opts.Deadline}
	n := len(g.watches)
	for w := range g.watches {
		w.revoke(ev)
	}
	clear(g.watches)
	h.drop(g)
	h.opts.Logger.Warn("a watched decision was not re-decided in time; its watches are revoked",
		"watches", n, "operation", g.operation, "deadline", h.opts.Deadline)
}

// Charge counts n bytes more against Options.MaxBytes: what a watch costs besides its body
// (an HTTP/2 stream's goroutine and buffers). It reports false, charging nothing, when they
// would pass it. Uncharge gives them back.
func (h *Hub) Charge(n int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bytes+n > h.opts.MaxBytes {
		return false
	}
	h.bytes += n
	return true
}

// Uncharge gives back n bytes Charge counted.
func (h *Hub) Uncharge(n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bytes -= n
}

// leave takes w out of its group (its watcher is gone or it was revoked).
func (h *Hub) leave(w *Watch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := w.g
	if g == nil {
		return
	}
	if _, ok := g.watches[w]; ok {
		delete(g.watches, w)
		if len(g.watches) == 0 && h.groups[g.key] == g {
			h.drop(g)
		}
	}
}

// drop forgets g and the body it held (held with mu).
func (h *Hub) drop(g *group) {
	delete(h.groups, g.key)
	h.bytes -= int64(len(g.body))
}

// anyLast is the last decision sent to one of the group's watches (held with Hub.mu).
func (g *group) anyLast() decision.Document {
	for w := range g.watches {
		return w.lastDoc()
	}
	return decision.Document{}
}

// Watch is one open watch. Its watcher takes events with Next (or Ready and Take) and calls
// Close when it stops watching.
type Watch struct {
	hub *Hub
	op  string
	g   *group // guarded by hub.mu

	mu     sync.Mutex
	last   decision.Document // the last decision sent (or pending)
	upd    *Event            // an update not taken yet
	final  *Event            // the revoke, once decided
	ended  bool              // the revoke was taken, or Close was called
	closed bool
	wake   chan struct{}
	notify atomic.Pointer[func()] // called with wake, when set
	tag    atomic.Value           // the watcher's own value (SetTag), for RevokeIf
}

// SetTag keeps v with the watch, for RevokeIf (the server keeps the credential that opened it).
func (w *Watch) SetTag(v any) { w.tag.Store(v) }

// update leaves ev for the watcher when it changes what the watcher was told.
func (w *Watch) update(ev Event) {
	w.mu.Lock()
	if w.final != nil || w.ended || sameGrant(w.last, ev.Doc) {
		w.mu.Unlock()
		return
	}
	w.last = ev.Doc
	w.upd = &ev
	w.mu.Unlock()
	w.signal()
}

// revoke leaves the final event; the hub no longer holds w.
func (w *Watch) revoke(ev Event) {
	w.mu.Lock()
	if w.final != nil || w.ended {
		w.mu.Unlock()
		return
	}
	w.final = &ev
	w.upd = nil
	w.mu.Unlock()
	w.hub.open.Add(-1)
	w.signal()
}

func (w *Watch) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
	if fn := w.notify.Load(); fn != nil {
		(*fn)()
	}
}

// OnReady calls fn whenever an event may be waiting (as Ready is signalled), and once at once
// if one already is: a watcher that does not wait on Ready takes its events from fn. fn must
// return quickly and must not block; it may be called on the hub's goroutines.
func (w *Watch) OnReady(fn func()) {
	w.notify.Store(&fn)
	w.mu.Lock()
	pending := w.final != nil || w.upd != nil
	w.mu.Unlock()
	if pending {
		fn()
	}
}

func (w *Watch) lastDoc() decision.Document {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

func (w *Watch) lastRevision() string { return w.lastDoc().Revision }

// Ready is signalled when an event may be waiting; Take it.
func (w *Watch) Ready() <-chan struct{} { return w.wake }

// Take returns the event waiting, if any: the revoke once there is one (the watch has then
// ended; Take returns nothing more), else the latest update not taken yet.
func (w *Watch) Take() (Event, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.ended:
		return Event{}, false
	case w.final != nil:
		w.ended = true
		return *w.final, true
	case w.upd != nil:
		ev := *w.upd
		w.upd = nil
		return ev, true
	}
	return Event{}, false
}

// Next waits for the next event until ctx is done. After the revoke it returns io.EOF-like
// ErrEnded.
func (w *Watch) Next(ctx context.Context) (Event, error) {
	for {
		if ev, ok := w.Take(); ok {
			return ev, nil
		}
		if w.Ended() {
			return Event{}, ErrEnded
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// ErrEnded is Next's error after the revoke was taken.
var ErrEnded = errors.New("the watch has ended")

// Ended reports whether the revoke was taken or the watch closed.
func (w *Watch) Ended() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended
}

// Close ends the watch from the watcher's side (it stops watching). Safe to call more than
// once and after the revoke.
func (w *Watch) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	revoked := w.final != nil
	w.ended = true
	w.mu.Unlock()
	w.hub.leave(w)
	if !revoked {
		w.hub.open.Add(-1)
	}
}

// sameGrant reports whether two allowing decisions grant the same: the same capabilities on
// the same policy revision.
func sameGrant(a, b decision.Document) bool {
	return a.Allow == b.Allow && a.Capabilities == b.Capabilities && a.Revision == b.Revision
}

// pinnedPlugin is the plugin whose facts the request's decision reads: its lease's
// metadata.pluginId, "" when it pins none (it then reads only the built-in providers, whose
// changes concern every watch).
func pinnedPlugin(req *snapshot.Request) string {
	id, _ := req.Metadata["pluginId"].(string)
	return id
}

// Watch is the Go face of POST /v1/authorize/watch: it decides req on the hub's facts and,
// when the decision allows, opens a watch on it (w is nil when it does not). The first event is
// the decision; take the next ones with w.Next and call w.Close when done. err is ErrLimit,
// ErrClosed, or the decision's evaluation error (first then holds the fail-closed deny).
func (h *Hub) Watch(ctx context.Context, req *snapshot.Request) (first Event, w *Watch, err error) {
	res, err := h.Reserve()
	if err != nil {
		return Event{}, nil, err
	}
	defer res.Release()
	seq := h.Seq()
	start := time.Now()
	doc, in, derr := h.d.Decide(ctx, req, h.facts)
	first = Event{Kind: KindDecision, Doc: doc, Operation: req.Operation, Input: in, Latency: time.Since(start)}
	if derr != nil {
		first.Doc, first.EvalCode = decision.FailClosed(req.Operation, doc, derr)
		return first, nil, derr
	}
	if !doc.Allow {
		return first, nil, nil
	}
	body, err := json.Marshal(req.Document())
	if err != nil {
		return first, nil, err
	}
	w, err = h.Add(res, req, body, doc, seq)
	return first, w, err
}
